"""Which job states a lost or revived rank settles: only a RUNNING job goes NODE_LOST; a
STARTING job (launch, gang restart) or a SUSPENDING one keeps its own machinery and
deadline, its ranks watched, and settles once it runs."""

from __future__ import annotations

from gpu_recovery.constants import DEADLINE_PK, HB_PK, JOB_PK, JobState, RankState, job_item_key
from gpu_recovery.repository import Update
from gpu_recovery.repository.time_sharing import SuspensionRepository
from tests.heartbeat.world import NODE, NODE_B, task_arn


def _restarting(world) -> None:
    """A gang restart in flight (attempt 2): claimed, its fan-out unfinished, a deadline for
    the sweep's resume; rank 0 on NODE, rank 1 on NODE_B, both heartbeating."""
    world.seed_job("j1", world_size=2, nodes=(NODE, NODE_B), state=JobState.STARTING, attempt=2)
    now = world.clock()
    tables = world.repo.tables
    tables.db.apply(Update(table=tables.job_table_name, key={JOB_PK: job_item_key("j1")},
                           set_fields={"restarted_attempt": 2,
                                       "start_fanout": {"attempt": 2, "at": now},
                                       **world.repo.jobs.job_deadline_fields(now + 60)}))


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


def _moving(world, svc) -> SuspensionRepository:
    """A RUNNING job (both ranks on NODE, heartbeating) asked to move: SUSPENDING."""
    world.seed_job("j1")
    world.report(svc, NODE, task_arn("j1", 0), task_arn("j1", 1))
    store = SuspensionRepository(world.repo.jobs)
    bound = world.clock() + 3600
    assert store.request("j1", 1, suspend={"kind": "moved", "deadline_at": bound},
                         deadline_at=bound, reason="move", actor="test")
    assert world.job_state("j1") is JobState.SUSPENDING
    return store


def test_a_node_lost_during_a_declined_move_is_caught_once_the_job_runs(world) -> None:
    """Given a job SUSPENDING for a move, When its node falls silent (past
    node_lost_fail_seconds too) and the move is then declined, Then its ranks go NODE_LOST
    and stay watched while the job stays SUSPENDING (nothing escalated); back RUNNING, the
    next sweep moves the job to NODE_LOST and hands it to the recovery loop."""
    svc = world.service(node_lost_fail_seconds=600)
    store = _moving(world, svc)
    world.clock.advance(300)
    assert svc.sweep().marked_lost == ["j1#0", "j1#1"]
    assert world.job_state("j1") is JobState.SUSPENDING
    world.clock.advance(700)
    assert svc.sweep().escalated == [] and world.recovery.calls == []
    assert HB_PK in world.item("j1#0") and HB_PK in world.item("j1#1")
    assert store.decline_move("j1", 1, reason="declined", moves=[], also=[])
    assert world.job_state("j1") is JobState.RUNNING
    world.clock.advance(60)
    assert svc.sweep().escalated == ["j1"]
    assert world.job_state("j1") is JobState.NODE_LOST
    assert world.rank_state("j1", 0) is RankState.NODE_LOST


def test_a_rank_revived_while_suspending_leaves_the_job_suspending(world) -> None:
    """Given a SUSPENDING job whose ranks went NODE_LOST, When the node reports again, Then
    the ranks are RUNNING and the job still SUSPENDING (its grace goes on)."""
    svc = world.service()
    _moving(world, svc)
    world.clock.advance(300)
    svc.sweep()
    assert world.rank_state("j1", 0) is RankState.NODE_LOST
    assert world.report(svc, NODE, task_arn("j1", 0), task_arn("j1", 1)).revived == ["j1#0", "j1#1"]
    assert world.job_state("j1") is JobState.SUSPENDING
    assert world.rank_state("j1", 0) is RankState.RUNNING
