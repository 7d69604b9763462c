"""``domain.started_by``: every task's startedBy, deterministic, within ECS's 36 characters,
and the same as the tasks already running carry (their lookup after a lost StartTask answer
must find them across an upgrade)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpu_recovery.domain import started_by
from gpu_recovery.domain.launch_plan import StartCall
from gpu_recovery.domain.validation import started_by as validation_started_by
from gpu_recovery.recovery.gpu_resets import gpu_reset_started_by
from gpu_recovery.recovery.health_checks import group_started_by as check_group_started_by
from gpu_recovery.recovery.health_checks import health_check_started_by
from gpu_recovery.recovery.ranks import group_started_by, restart_started_by

NODE = SimpleNamespace(container_inst_id="abc", reboot_requested_at=1.5, hc_requested_at=1.5,
                       check=SimpleNamespace(attempts=0))


STORED = {  # what the code before this module made for the same start
    "check": (health_check_started_by, (NODE,), "gpu-recovery-hc-2e4c9d604a16b8c8"),
    "reset": (gpu_reset_started_by, (NODE,), "gpu-recovery-reset-6a54dafab420944d"),
    "validation": (validation_started_by, ("abc", 1.5, 3), "gpu-recovery-val-05bf37e196978891"),
    "restart": (restart_started_by, ("job-1", 1, 7), "gpurec-026ab639c2-a1-r7"),
}
# A queue launch's rank before the one launcher (its ranks now carry the restart's format): no
# task is started with it any more, but one still running is the stack's.
QUEUE_BEFORE = "q-026ab639c21d-a1-r7"


@pytest.mark.parametrize("kind", sorted(STORED))
def test_each_kind_keeps_the_startedby_its_running_tasks_carry(kind: str) -> None:
    """Given a start of each kind, When its startedBy is made, Then it is the one made before
    this module existed (a task started by the previous code is found by the new)."""
    make, args, stored = STORED[kind]
    assert make(*args) == stored


def test_a_call_of_identical_ranks_is_named_by_its_lowest_rank_and_a_single_rank_by_its_rank() -> None:
    three = StartCall((9, 7, 8), ("n1", "n2", "n3"))
    assert group_started_by("job-1", 12, three) == "gpurec-026ab639c2-a12-g7"
    assert group_started_by("job-1", 12, StartCall((7,), ("n1",))) == restart_started_by("job-1", 12, 7)


@pytest.mark.parametrize("unique", [("n", 1.0, 0), ("n", 1.0, 1), ("m", 1.0, 0), ("n", 2.0, 0)])
def test_a_node_task_differs_by_every_part_and_repeats_for_the_same(unique: tuple[object, ...]) -> None:
    made = started_by.node_task(started_by.HEALTH_CHECK, *unique)
    assert made == started_by.node_task(started_by.HEALTH_CHECK, *unique)
    others = {started_by.node_task(started_by.HEALTH_CHECK, *u)
              for u in [("n", 1.0, 0), ("n", 1.0, 1), ("m", 1.0, 0), ("n", 2.0, 0)] if u != unique}
    assert made not in others


def test_every_startedby_fits_ecs_36_characters_whatever_the_job_id_or_rank() -> None:
    long_job = "j" * 255
    ten = (f"{'x' * 100}{i}:1.7e9:9" for i in range(10))
    made = [started_by.node_task(started_by.HEALTH_CHECK_GROUP, *ten),
            started_by.rank_launch(started_by.RESTART, long_job, 99_999, "r8191", digest=10),
            started_by.node_task(started_by.GPU_RESET, "x" * 100, 1.7e9),
            started_by.node_task(started_by.VALIDATION, "x" * 100, repr(1.7e9), 99)]
    assert all(len(m) <= started_by.MAX_LENGTH for m in made), made


def test_each_kind_is_told_by_its_prefix_alone() -> None:
    """A task's kind is read off its startedBy (the campaigns' count of tasks started twice,
    an operator's ListTasks): no kind's prefix begins another's, and each kind's startedBy
    begins with its own prefix only."""
    heads = [f"{prefix}-" for prefix in started_by.PREFIXES]
    assert not [(a, b) for a in heads for b in heads if a != b and b.startswith(a)]
    kinds = {"check": started_by.HEALTH_CHECK, "check group": started_by.HEALTH_CHECK_GROUP,
             "reset": started_by.GPU_RESET, "validation": started_by.VALIDATION,
             "restart": started_by.RESTART, "queue": started_by.QUEUE_LAUNCH}
    made = {kind: stored for kind, (_, _, stored) in STORED.items()} | {"queue": QUEUE_BEFORE}
    made["restart"] = group_started_by("job-1", 2, StartCall((0, 1), ("n1", "n2")))
    made["check group"] = check_group_started_by([NODE, SimpleNamespace(
        container_inst_id="def", hc_requested_at=1.5, check=SimpleNamespace(attempts=0))])
    assert sorted(kinds) == sorted(made) and sorted(kinds.values()) == sorted(started_by.PREFIXES)
    for kind, value in made.items():
        assert [head for head in heads if value.startswith(head)] == [f"{kinds[kind]}-"], value


def test_a_group_of_checks_is_named_as_one_call_on_several_nodes_and_one_check_as_before() -> None:
    """Given the checks of one StartTask on two nodes, When its startedBy is made, Then it says
    it names several nodes (a take-over describes the call's tasks), is the same whatever the
    order of the nodes, and a group of one is the node's own check's startedBy."""
    other = SimpleNamespace(container_inst_id="def", hc_requested_at=1.5, check=SimpleNamespace(attempts=0))
    made = check_group_started_by([NODE, other])
    assert started_by.names_several_nodes(made) and made == check_group_started_by([other, NODE])
    assert check_group_started_by([NODE]) == health_check_started_by(NODE)
    assert not started_by.names_several_nodes(health_check_started_by(NODE))
