"""A node's way back from its repair (``repository.nodes_back``, ``repo.nodes_back``) on the
emulator's DynamoDB: back once per reboot, validating first when asked (its waiting jobs kept),
each waiting job let go once, the node's deadline cleared only once none waits."""

from __future__ import annotations

from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.states import InstanceState
from tests.recovery.fakes import World, world
from tests.repository.items import instance_item, set_instance_fields

NODE = "node-a"


def rebooting(w: World, *, waiting: set[str] | None = None) -> Instance:
    """NODE rebooted a minute ago (by a node decision), ``waiting`` jobs restarting on it."""
    fields: dict[str, object] = {"instance_state": InstanceState.REBOOTING.value,
                                 "reboot_requested_at": w.now[0] - 60}
    if waiting:
        fields["waiting_jobs"] = waiting
    set_instance_fields(NODE, **fields)
    instance = w.repo.instances.get_instance(NODE)
    assert instance is not None
    return instance


def test_a_node_is_back_once_per_reboot() -> None:
    with world() as w:
        w.register_job("job-a", [NODE])
        back, node = w.repo.nodes_back, rebooting(w)
        assert back.mark_instance_back(node, w.now[0])
        item = instance_item(NODE)
        assert item["instance_state"] == "AVAILABLE" and item["returned_at"] == w.now[0]
        assert not back.mark_instance_back(node, w.now[0] + 5)  # a second boot report
        # Rebooted again since it was read (another decision): this reboot's return does not
        # count for the new one.
        again = rebooting(w)
        set_instance_fields(NODE, reboot_requested_at=w.now[0] + 1)
        assert not back.mark_instance_back(again, w.now[0] + 6)
        assert instance_item(NODE)["instance_state"] == "REBOOTING"


def test_a_node_that_validates_first_stays_rebooting_with_its_waiting_jobs() -> None:
    with world() as w:
        w.register_job("job-a", [NODE])
        back, node = w.repo.nodes_back, rebooting(w, waiting={"job-a"})
        validation = {"since": w.now[0], "until": w.now[0] + 3600, "attempts": 0}
        assert back.mark_instance_back(node, w.now[0], validation=validation)
        item = instance_item(NODE)
        assert item["instance_state"] == "REBOOTING" and item["validation"]["since"] == w.now[0]
        assert item["waiting_jobs"] == {"job-a"}
        assert not back.mark_instance_back(node, w.now[0] + 5, validation=validation)  # validating


def test_each_waiting_job_is_let_go_once_then_the_deadline_is_cleared() -> None:
    with world() as w:
        w.register_job("job-a", [NODE])
        back, node = w.repo.nodes_back, rebooting(w, waiting={"job-a", "job-b"})
        assert back.mark_instance_back(node, w.now[0])
        assert "deadline_at" in instance_item(NODE)  # the sweep lets them go if this delivery dies
        assert back.release_waiting_job(NODE, None, "job-a")
        assert not back.release_waiting_job(NODE, None, "job-a")  # a redelivery
        assert not back.clear_waiting_deadline(NODE)  # job-b still waits
        assert back.release_waiting_job(NODE, None, "job-b")
        assert back.clear_waiting_deadline(NODE)
        assert "deadline_at" not in instance_item(NODE)
