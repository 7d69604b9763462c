"""Which job states a lost or revived rank settles: only a RUNNING job goes NODE_LOST; a
STARTING job (launch, gang restart) keeps its own machinery and deadline, and settles once
it runs."""

from __future__ import annotations

from gpu_recovery.constants import DEADLINE_PK, JOB_PK, JobState, RankState, job_item_key
from gpu_recovery.repository import Update
from tests.heartbeat.world import NODE, NODE_B, task_arn


def _restarting(world) -> None:
    """A gang restart in flight (attempt 2): claimed, its fan-out unfinished, a deadline for
    the sweep's resume; rank 0 on NODE, rank 1 on NODE_B, both heartbeating."""
    world.seed_job("j1", world_size=2, nodes=(NODE, NODE_B), state=JobState.STARTING, attempt=2)
    now = world.clock()
    world.repo.db.apply(Update(table=world.repo.job_table_name, key={JOB_PK: job_item_key("j1")},
                               set_fields={"restarted_attempt": 2,
                                           "start_fanout": {"attempt": 2, "at": now},
                                           **world.repo.job_deadline_fields(now + 60)}))


def _silence_node_a(world, svc, seconds: int = 210) -> None:
    world.report(svc, NODE, task_arn("j1", 0, 2))
    world.report(svc, NODE_B, task_arn("j1", 1, 2))
    for _ in range(seconds // 30):
        world.clock.advance(30)
        world.report(svc, NODE_B, task_arn("j1", 1, 2))


def test_a_starting_job_keeps_its_state_and_deadline_through_a_heartbeat_blip(world) -> None:
    """Given a gang restart STARTING, When a node is silent past the stale threshold and
    then reports again, Then its rank goes NODE_LOST and back, and the job stays STARTING
    with its deadline and fan-out (the sweep's resume / confirmation still run)."""
    _restarting(world)
    svc = world.service()
    _silence_node_a(world, svc)
    assert svc.sweep().marked_lost == ["j1#0"]
    assert world.rank_state("j1", 0) is RankState.NODE_LOST
    assert world.job_state("j1") is JobState.STARTING
    world.clock.advance(5)
    assert world.report(svc, NODE, task_arn("j1", 0, 2)).revived == ["j1#0"]
    item = world.item("j1#JOB")
    assert item["job_state"] == JobState.STARTING.value
    assert DEADLINE_PK in item and item.get("start_fanout")
    assert world.rank_state("j1", 0) is RankState.RUNNING


def test_a_rank_lost_while_starting_settles_and_escalates_once_the_job_runs(world) -> None:
    """Given a rank lost while its job is STARTING, When it stays lost past
    node_lost_fail_seconds, Then nothing is escalated while the job starts; once the job
    is RUNNING, the next sweep moves it to NODE_LOST and hands it to the recovery loop."""
    _restarting(world)
    svc = world.service(node_lost_fail_seconds=600)
    _silence_node_a(world, svc)
    svc.sweep()
    world.clock.advance(700)
    swept = svc.sweep()
    assert swept.escalated == [] and world.recovery.calls == []
    assert world.job_state("j1") is JobState.STARTING
    assert world.repo.restarts.confirm_running("j1", 2, "every rank restarted")
    assert world.job_state("j1") is JobState.RUNNING
    world.clock.advance(60)
    assert svc.sweep().escalated == ["j1"]
    assert world.job_state("j1") is JobState.NODE_LOST
    assert world.recovery.calls[0][:3] == ("j1", 2, NODE)
