"""Every e-mail kind tells the truth: for each notification kind, the flow that sends it is
driven under the emulator (the handlers the stack deploys, moto, the simulated ECS data
plane), and what each e-mail of that kind says was done is held to what the stack did (the
AWS calls the handlers made, the state they left), and its "What to do" names only commands
that exist (tests/notifications/truth.py).

The flows are the crash campaigns' unbroken runs and the remediation scenarios' worlds (each
run once per module and shared by the kinds it sends): every kind in make test (about a
minute of CPU on one worker, beside the rest of the suite).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery.constants import NotificationKind
from gpu_recovery.domain.heartbeat_policy import ReportedTask
from local_mode.campaigns import heartbeats as heartbeat_campaign
from local_mode.campaigns.aws_notices import AwsNotice
from local_mode.campaigns.preflight_evidence import TenantPreflight
from local_mode.campaigns.recovery import RecoveryScenario
from local_mode.campaigns.runner import run_flow
from local_mode.campaigns.warnings import DriverWarning
from local_mode.remediation_scenarios import MIN, world
from local_mode.world import build_world
from tests.notifications.truth import Mail, Record, problems
from tests.remediation.steps import queue_job_running_on_three_nodes

Inspected = list[tuple[Mail, list[str]]]


def _inspect(record: Record) -> Inspected:
    return [(mail, problems(record, mail)) for mail in record.mails]


def _two_node_job(w: Any, job_id: str) -> None:
    for node in ("node-a", "node-b"):
        w.ecs.add_node(node)
    w.ecs.start_job(job_id, w.training_task_definition, ["node-a", "node-b"])


# ---------------------------------------------------------------------------- the flows
class _RecordedCampaign(RecoveryScenario):
    """A crash campaign's flow, unbroken, with its e-mails held to its calls."""

    inspected: Inspected

    def set_up(self, w: Any) -> list[str]:
        jobs = super().set_up(w)
        self.record = Record(w)
        return jobs

    def result(self, w: Any, common: dict[str, Any]) -> Any:
        self.inspected = _inspect(self.record)
        return super().result(w, common)


class _RecordedWarning(DriverWarning):
    """The driver-warning campaign's flow (a move at the checkpoint, the node reset), unbroken."""

    inspected: Inspected

    def set_up(self, w: Any) -> list[str]:
        jobs = super().set_up(w)
        self.record = Record(w)
        return jobs

    def result(self, w: Any, common: dict[str, Any]) -> Any:
        self.inspected = _inspect(self.record)
        return super().result(w, common)


class _RecordedEvidence(TenantPreflight):
    """A tenant's preflight campaign (issue 49), unbroken."""

    inspected: Inspected

    def set_up(self, w: Any) -> list[str]:
        jobs = super().set_up(w)
        self.record = Record(w)
        return jobs

    def result(self, w: Any, common: dict[str, Any]) -> Any:
        self.inspected = _inspect(self.record)
        return super().result(w, common)


class _RecordedNotice(AwsNotice):
    """The AWS-notice campaign's Capacity Block flow (two nodes of the block, one busy), unbroken."""

    inspected: Inspected

    def set_up(self, w: Any) -> list[str]:
        jobs = super().set_up(w)
        self.record = Record(w)
        return jobs

    def result(self, w: Any, common: dict[str, Any]) -> Any:
        self.inspected = _inspect(self.record)
        return super().result(w, common)


def forged_loopback() -> Inspected:
    """A rank lying about its loopback at every attempt: its nodes cleared, then the job limited."""
    scenario = _RecordedEvidence("preflight_forged_loopback")
    run_flow(scenario)
    return scenario.inspected


def capacity_notice() -> Inspected:
    scenario = _RecordedNotice("notice_capacity_block")
    run_flow(scenario)
    return scenario.inspected


def driver_warning() -> Inspected:
    scenario = _RecordedWarning()
    run_flow(scenario)
    return scenario.inspected


def campaign(flow: str) -> Callable[[], Inspected]:
    def run() -> Inspected:
        scenario = _RecordedCampaign(flow)
        run_flow(scenario)
        return scenario.inspected
    return run


def observe() -> Inspected:
    """Observe mode: XID 79 detected, nothing done (the remediation scenario's)."""
    with world(remediation={"remediation_mode": "observe"}) as w:
        record = Record(w)
        _two_node_job(w, "vit-observe")
        w.ecs.inject_xid("node-b", 79, after=10 * MIN)
        w.ecs.run_for(30 * MIN)
        return _inspect(record)


def persistence_mode() -> Inspected:
    """DCGM error 29: the node's configuration; drained, the job failed."""
    with world() as w:
        record = Record(w)
        _two_node_job(w, "t5-config")
        w.ecs.inject_gpu_fault("node-b", after=10 * MIN, health="config_error", nccl_cascade=True)
        w.ecs.run_for(20 * MIN)
        return _inspect(record)


def reset_fails() -> Inspected:
    """A GPU reset that fails: the node is rebooted instead."""
    with world() as w:
        record = Record(w)
        _two_node_job(w, "reset-job")
        w.ecs.inject_gpu_fault("node-b", after=10 * MIN, health="reset_fails", nccl_cascade=True)
        w.ecs.run_for(20 * MIN)
        return _inspect(record)


def budget_spent() -> Inspected:
    """A reboot-fixable fault in a job with no infrastructure recovery left: the node is
    rebooted all the same, the job fails."""
    with world(max_recovery_attempts=0) as w:
        record = Record(w)
        _two_node_job(w, "no-budget")
        w.ecs.inject_gpu_fault("node-b", after=10 * MIN, health="reboot_fixable", nccl_cascade=True)
        w.ecs.run_for(30 * MIN)
        return _inspect(record)


def _timeout(**options: Any) -> Callable[[], Inspected]:
    def run() -> Inspected:
        sim = {k: options.pop(k) for k in list(options) if k.endswith("_seconds")}
        with build_world(duplicate_delivery=True, sim_options=sim, training_family="train",
                         training_run_seconds=60 * MIN, extra_env={"POWERTOOLS_LOG_LEVEL": "CRITICAL"},
                         **options) as w:
            record = Record(w)
            _two_node_job(w, "stuck")
            w.ecs.inject_gpu_fault("node-b", after=2 * MIN, health="reboot_fixable")
            w.ecs.run_for(30 * MIN)
            return _inspect(record)
    return run


def breaker_refault() -> Inspected:
    """The remediation scenario's storm, and a node rebooted in it faults again."""
    from local_mode.remediation_scenarios import _storm

    with world() as w:
        record = Record(w)
        _storm(w)
        w.ecs.inject_xid("node-01", 79, after=20 * MIN, nccl_cascade=True)
        w.ecs.run_for(50 * MIN)
        return _inspect(record)


def queue_relocation() -> Inspected:
    """A queue job whose node must be replaced goes back to the queue, then runs elsewhere."""
    with world() as w:
        record = Record(w)
        queue_job_running_on_three_nodes(w)
        node = w.ranks_on("q-job")[1]
        w.ecs.inject_gpu_fault(node, after=MIN, health="replace", nccl_cascade=True)
        w.ecs.run_for(10 * MIN)
        return _inspect(record)


def too_large() -> Inspected:
    """A tagged job larger than MAX_WORLD_SIZE: refused, never registered."""
    with world() as w:
        record = Record(w)
        for node in ("node-a", "node-b"):
            w.ecs.add_node(node)
        w.ecs.start_job("huge", w.training_task_definition, ["node-a", "node-b"],
                        extra_tags={C.TAG_WORLD_SIZE: str(C.MAX_WORLD_SIZE + 1)})
        w.ecs.run_for(5 * MIN)
        return _inspect(record)


def cordon_limit() -> Inspected:
    """Observe mode (no drain: each node found bad is cordoned), six one-node jobs, and four of
    their nodes found bad within the cordon limit's window (50 % of the GPU nodes per 5
    minutes: 3): the fourth trips it."""
    with world(remediation={"remediation_mode": "observe"}) as w:
        record = Record(w)
        for i in range(6):
            w.ecs.add_node(f"node-{i}")
            w.ecs.start_job(f"job-{i}", w.training_task_definition, [f"node-{i}"])
        for i in range(4):
            w.ecs.inject_xid(f"node-{i}", 79, after=5 * MIN + i * 30)
        w.ecs.run_for(15 * MIN)
        return _inspect(record)


class _Hung(heartbeat_campaign.NodeLost):
    """Both nodes keep reporting; rank 1's training step stops advancing."""

    inspected: Inspected

    def world_options(self) -> dict[str, Any]:
        return {"hang_seconds": 120, "hang_action": "notify"}

    def set_up(self, w: Any) -> list[str]:
        jobs = super().set_up(w)
        self.record = Record(w)
        steps = {"n": 0}
        agents = self.agents
        assert agents is not None

        def reports() -> list[dict[str, Any]]:
            from gpu_recovery import runtime

            steps["n"] += 1
            for name in sorted(w.ecs.nodes):
                node = w.ecs.nodes[name]
                step = 5 if name == heartbeat_campaign.LOST else steps["n"]
                tasks = [ReportedTask(task_arn=t.arn, step=step)
                         for t in w.ecs.running_tasks(name) if t.last_status == "RUNNING"]
                with contextlib.suppress(Exception):
                    runtime.heartbeat_service().report_tasks(node.container_instance_id, w.ecs.now(), tasks)
            w.ecs.schedule(w.ecs.now() + 30, reports, "stepping agents")
            return []

        agents.silent.update(w.ecs.nodes)  # the campaign's agents give way to these
        w.ecs.schedule(w.ecs.now() + 30, reports, "stepping agents")
        return jobs

    def start(self, w: Any) -> None:
        w.ecs.run_for(10 * MIN)

    def result(self, w: Any, common: dict[str, Any]) -> Any:
        self.inspected = _inspect(self.record)
        return super().result(w, common)


def hung() -> Inspected:
    scenario = _Hung()
    scenario.run_limit_seconds = 0  # the job runs on: the flow is what set_up and start did
    run_flow(scenario)
    return scenario.inspected


class _RecordedNodeLost(heartbeat_campaign.NodeLost):
    inspected: Inspected

    def set_up(self, w: Any) -> list[str]:
        jobs = super().set_up(w)
        self.record = Record(w)
        return jobs

    def result(self, w: Any, common: dict[str, Any]) -> Any:
        self.inspected = _inspect(self.record)
        return super().result(w, common)


def node_lost() -> Inspected:
    scenario = _RecordedNodeLost()
    run_flow(scenario)
    return scenario.inspected


FLOWS: dict[str, Callable[[], Inspected]] = {
    "gpu_fault": campaign("gpu_fault"), "fast_path": campaign("fast_path"), "dead_gpu": campaign("dead_gpu"),
    "app_error_fails": campaign("app_error_fails"), "held_reset": campaign("held_reset"),
    "held_autoclose": campaign("held_autoclose"), "observe": observe, "persistence_mode": persistence_mode,
    "reset_fails": reset_fails, "budget_spent": budget_spent,
    "reboot_timeout": _timeout(reboot_timeout_minutes=10, reboot_seconds=10**6),
    "health_check_timeout": _timeout(health_check_timeout_minutes=10, dcgm_seconds=10**6),
    "breaker_refault": breaker_refault, "queue_relocation": queue_relocation, "too_large": too_large,
    "hung": hung, "node_lost": node_lost, "cordon_limit": cordon_limit, "driver_warning": driver_warning,
    "validation": campaign("validation"), "forged_loopback": forged_loopback,
    "capacity_notice": capacity_notice,
}
#: the flow that sends each kind
KIND_FLOWS: dict[str, str | None] = {
    "recovered": "gpu_fault", "suspect_node": "fast_path", "quarantined": "dead_gpu",
    "application_error": "app_error_fails", "breaker_tripped": "held_reset", "job_held": "held_reset",
    "breaker_closed": "held_autoclose", "observed": "observe", "operator_action": "persistence_mode",
    "gpu_reset_failed": "reset_fails", "failed": "budget_spent", "reboot_timeout": "reboot_timeout",
    "health_check_timeout": "health_check_timeout", "breaker_needs_operator": "breaker_refault",
    "relocated": "queue_relocation", "job_refused": "too_large", "hung": "hung", "node_lost": "node_lost",
    "cordon_limit_tripped": "cordon_limit", "gpu_warning": "driver_warning",
    "validation_failed": "validation", "tenant_evidence_limited": "forged_loopback",
    "capacity_notice": "capacity_notice",
}


@cache
def inspected(flow: str) -> Inspected:
    return FLOWS[flow]()


def test_every_kind_has_a_flow() -> None:
    assert set(KIND_FLOWS) == {k.value for k in NotificationKind}
    assert {f for f in KIND_FLOWS.values() if f} <= set(FLOWS)


@pytest.mark.parametrize("kind", sorted(KIND_FLOWS))
def test_every_email_of_the_kind_says_what_was_done(kind: str) -> None:
    """Given the flow that sends ``kind``, When it has run, Then it sent at least one such
    e-mail and each says only what the stack did and names only commands that exist."""
    flow = KIND_FLOWS[kind]
    assert flow is not None
    mails = [(mail, found) for mail, found in inspected(flow) if mail.kind == kind]
    assert mails, f"the {flow} flow sent no {kind} e-mail: {[m.kind for m, _ in inspected(flow)]}"
    wrong = [f"{mail.subject}:\n  " + "\n  ".join(found) for mail, found in mails if found]
    assert not wrong, "\n".join(wrong) + "\n--- the first e-mail ---\n" + mails[0][0].body


@pytest.mark.parametrize("flow", sorted(FLOWS))
def test_every_email_a_flow_sends_says_what_was_done(flow: str) -> None:
    """Every e-mail of every flow, whatever its kind (a recovered e-mail after a held reboot,
    a suspect-node one in a fast path): the same checks."""
    wrong = [f"{mail.kind}: {mail.subject}:\n  " + "\n  ".join(found)
             for mail, found in inspected(flow) if found]
    assert not wrong, "\n".join(wrong)
