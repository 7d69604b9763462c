"""Issue 30: with the reset stage turned off (remediation setting ``gpu_reset=false``), the
health check's verdict `reset` (exit 4) and the catalog's reset_gpu reach the recovery flow as
today's reboot. With the stages' fakes; each test fails if a reset decision were handed to the
flow as reset_gpu (a reset task would start and the reboot API would not be called)."""

from __future__ import annotations

import pytest

from gpu_recovery import constants as C
from gpu_recovery.domain.remediation_settings import RemediationSettings
from gpu_recovery.repository import Update
from tests.recovery.fakes import world

FAULTY, PEER = "node-b", "node-a"
RESET_OFF = RemediationSettings(gpu_reset_enabled=False)


@pytest.mark.parametrize("exit_code", [1, 4])
def test_a_reset_verdict_reboots_the_node_exactly_as_a_reboot_verdict(exit_code: int) -> None:
    """Given a suspect exit and a health check exiting 4 (reset) or 1 (reboot),
    Then both reboot the node, label it REBOOT and wait to restart the job on it."""
    with world(remediation=RESET_OFF) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        [task] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(task, exit_code))
        assert w.rebooter.calls == [f"i-{FAULTY}"]
        assert w.repo.instances.get_instance(FAULTY).state is C.InstanceState.REBOOTING
        job = w.repo.jobs.get_job("j")
        assert job.state is C.JobState.PENDING_RESTART
        assert w.repo.faults.labels(job)[FAULTY] == "REBOOT"
        [record] = w.repo.instances.get_instance_item(FAULTY)["fault_history"]
        assert record["action"] == "reboot"
        assert record["cause"] == ("dcgm-verdict-reset" if exit_code == 4 else "dcgm-verdict-reboot")
        assert record["evidence"]["dcgm"]["verdict"] == ("reset" if exit_code == 4 else "reboot")


def test_a_reset_bucket_xid_takes_todays_fast_path_reboot() -> None:
    """Given XID 119 (GSP timeout, NVIDIA's RESET_GPU bucket) reported before a suspect exit,
    Then the node is rebooted without the diag, as before reset_gpu existed."""
    with world(remediation=RESET_OFF) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.repo.tables.db.apply(Update(table="instances", key={C.INSTANCE_PK: FAULTY},
                                      set_fields={"gpu_events": [{"t": w.now[0], "g": "GPU-0", "x": 119}]}))
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert w.rebooter.calls == [f"i-{FAULTY}"] and w.ecs.health_checks_on(FAULTY) == []
        plan = w.repo.instances.get_instance_item(FAULTY)["last_fault"]["plan"]
        assert (plan["action"], plan["decision"]["rule_id"]) == ("reboot", "xid-119")
        assert any("carried out as a reboot" in n for n in plan["decision"]["notes"])
