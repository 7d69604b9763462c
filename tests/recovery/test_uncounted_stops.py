"""A rank recorded ended whose end the attempt's latch never counted (the handling of its
STOPPED event died after the rank's write, every delivery, and the event was dead-lettered):
the stop fan-out's next paced round handles it as its event again, so the fault goes on.

Found by a 1 %-of-calls-failing run (``lost_verdict``, seed 9): the job waited in
PENDING_HEALTHCHECK for the health-check backstop (70 minutes) and failed, although both of its
nodes' checks had passed within five minutes of the fault: the rank's item said it ended, so no
round described its task again, and nothing else arrives at the latch for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery.domain.latch import Latch
from gpu_recovery.recovery.task_events import TaskEvents
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.latches import LatchRepository
from local_mode.remediation_scenarios import MIN, world
from tests.remediation.steps import application_error_on_node_b

TRAINING_RULE = "training-task-state"


@pytest.fixture
def rank_one_end_dies(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """While ``state["dying"]``, the arrival of rank 1 at the ENDED latch raises: the handling of
    its stop dies after the rank's own write, each time it is tried."""
    state: dict[str, Any] = {"dying": True, "died": 0}
    arrive = LatchRepository.arrive

    def dying_arrive(self: LatchRepository, job_id: str, attempt: int, world_size: int, rank: int,
                     latches: Any, **kwargs: Any) -> Any:
        latches = list(latches)
        if state["dying"] and rank == 1 and Latch.ENDED in latches:
            state["died"] += 1
            raise RuntimeError("the handling of rank 1's stop dies after the rank's write")
        return arrive(self, job_id, attempt, world_size, rank, latches, **kwargs)

    monkeypatch.setattr(LatchRepository, "arrive", dying_arrive)
    yield state


def test_a_rank_recorded_ended_but_not_counted_is_counted_by_the_next_stop_round(
        rank_one_end_dies: dict[str, Any]) -> None:
    """Given a 2-node job allowed one application-error restart whose rank 1 exits 1 (its
    GPU's diag then passes: an application error), When every handling of rank 1's stop dies
    after writing the rank FAILED (its event's three deliveries, dead-lettered, and any paced
    round's in the first six minutes), Then the next round after that counts rank 1's end (its
    task described STOPPED, handled as its event): node-b is checked (healthy), and the job
    restarts on both nodes well before the health-check backstop."""
    with world() as w:
        application_error_on_node_b(w, "uncounted")
        w.ecs.run_for(6 * MIN)
        job = w.job("uncounted")
        assert job["job_state"] == "PENDING_HEALTHCHECK", job["history"]
        rank = w.repo.jobs.get_rank("uncounted", 1)
        assert rank is not None and rank.state.is_terminal  # written: only its count died
        assert rank_one_end_dies["died"] >= 3
        assert [d for d in w.bus.dead_letters if d.rule == TRAINING_RULE], "the premise: a dead letter"
        rank_one_end_dies["dying"] = False
        w.ecs.run_for(14 * MIN)
        job = w.job("uncounted")
        assert (job["job_state"], job["attempt"]) == ("RUNNING", 2), \
            [(h["to"], h.get("reason")) for h in job["history"]]
        assert w.ranks_on("uncounted") == ["node-a", "node-b"]
        assert w.node_item("node-b")["instance_state"] == "AVAILABLE"
        node_b = w.ecs.node("node-b").container_instance_id
        verdicts = {s.node: s.verdict.value for s in w.repo.faults.suspects("uncounted", 1)}
        assert verdicts.get(node_b) == "HEALTHY", verdicts


def test_a_restart_whose_last_rank_end_died_after_the_latch_counts_its_suspects_and_restarts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a 2-node job whose rank 1 fails on node-b (a reboot fixes it), When every handling of
    rank 0's stop dies after the latch counted it (its event dead-lettered, each sweep's try too)
    until node-b's REBOOT verdict moved the job to PENDING_RESTART, Then the sweep counts the
    fault's suspects (every rank ended) and the job restarts on both nodes once node-b is back,
    instead of waiting for its old ranks until the restart's backstop fails it.

    Found at 5 % of calls failing (``two_faults``, seed 9): FAILED after 52 minutes, every rank
    ended and both nodes AVAILABLE."""
    state = {"dying": True, "died": 0}
    on_attempt_ended = TaskEvents.on_attempt_ended

    def dying(self: TaskEvents, job: Any, attempt: int) -> str:
        if state["dying"]:
            state["died"] += 1
            raise RuntimeError("the handling dies after the latch counted the rank")
        return on_attempt_ended(self, job, attempt)

    monkeypatch.setattr(TaskEvents, "on_attempt_ended", dying)
    with world() as w:
        for node in ("node-a", "node-b"):
            w.ecs.add_node(node)
        w.ecs.start_job("late", w.training_task_definition, ["node-a", "node-b"])
        w.ecs.run_for(60)
        w.ecs.inject_gpu_fault("node-b", after=10, health="reboot_fixable")
        for _ in range(30):
            w.ecs.run_for(30)
            if [d for d in w.bus.dead_letters if d.rule == TRAINING_RULE]:
                break
        job = w.job("late")
        assert job["job_state"] == "PENDING_RESTART", job["history"]
        assert job["fault"].get("total") is None, "the premise: its suspects never counted"
        assert [d for d in w.bus.dead_letters if d.rule == TRAINING_RULE], "the premise: a dead letter"
        state["dying"] = False
        w.ecs.run_for(20 * MIN)
        job = w.job("late")
        assert (job["job_state"], job["attempt"]) == ("RUNNING", 2), \
            [(h["to"], h.get("reason")) for h in job["history"]]
        assert w.ranks_on("late") == ["node-a", "node-b"]


def test_a_shard_completed_by_an_end_whose_head_write_died_is_counted_by_the_next_stop_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the same job, When every handling of its last rank's stop writes its end on the
    latch's shard (completing it) and dies before the latch's head records the shard (its event
    dead-lettered, and any round's handling in the first six minutes), Then the next stop round
    still finds that rank uncounted and handles it as its event: the job restarts on both nodes
    (the shard said "arrived", so no round looked again: the job waited for the health-check
    backstop; ``preflight_pin`` at 5 % of calls failing, seed 24)."""
    state = {"dying": True, "died": 0}
    arrive = LatchRepository.arrive

    def head_write_dies(self: LatchRepository, job_id: str, attempt: int, world_size: int, rank: int,
                        latches: Any, **kwargs: Any) -> Any:
        latches = list(latches)
        arrival = arrive(self, job_id, attempt, world_size, rank, latches, **kwargs)
        if state["dying"] and Latch.ENDED in arrival:  # the last end: it completed the shard
            state["died"] += 1
            self.base.db.apply(Update(table=self.table, key={C.JOB_PK: C.latch_head_key(job_id, attempt)},
                                      delete_from_sets={Latch.ENDED.head_attribute: {0}}))
            raise RuntimeError("the handling of the last rank's stop dies before the latch's head")
        return arrival

    monkeypatch.setattr(LatchRepository, "arrive", head_write_dies)
    with world() as w:
        application_error_on_node_b(w, "headless")
        w.ecs.run_for(6 * MIN)
        assert w.job("headless")["job_state"] == "PENDING_HEALTHCHECK"
        assert state["died"] >= 3
        assert [d for d in w.bus.dead_letters if d.rule == TRAINING_RULE], "the premise: a dead letter"
        state["dying"] = False
        w.ecs.run_for(14 * MIN)
        job = w.job("headless")
        assert (job["job_state"], job["attempt"]) == ("RUNNING", 2), \
            [(h["to"], h.get("reason")) for h in job["history"]]
        assert w.ranks_on("headless") == ["node-a", "node-b"]


def test_a_lost_stop_whose_handling_fails_leaves_the_round_s_other_lost_stops_handled_first() -> None:
    """Given two ranks whose tasks ECS describes STOPPED (their events lost), When handling the
    first as its event is throttled, Then the second is handled all the same and the round
    fails after it (the first is handled at the next round): one failed call does not hold
    back every lost stop of the batch."""
    from botocore.exceptions import ClientError

    from gpu_recovery.domain.models import Rank
    from gpu_recovery.domain.states import RankState
    from gpu_recovery.recovery.lost_stop_events import handle_stopped
    from gpu_recovery.recovery.reactions import Reactions, StoppedEventLost, on

    ranks = [Rank(job_id="j", rank=r, state=RankState.STOP_REQUESTED, attempt=1, task_arn=f"arn:task/{r}",
                  task_definition_arn="arn:td/train:1", container_inst_id=f"node-{r}")
             for r in (0, 1)]

    class Ecs:
        def describe_tasks(self, task_arns: list[str]) -> list[dict[str, Any]]:
            return [{"taskArn": arn, "lastStatus": "STOPPED"} for arn in task_arns]

    handled: list[int] = []

    def handle(event: StoppedEventLost) -> None:
        assert event.rank is not None
        if event.rank.rank == 0:
            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}},
                              "GetItem")
        handled.append(event.rank.rank)

    reactions = Reactions()
    reactions.declare([on(StoppedEventLost, handle)])
    with pytest.raises(ClientError):
        handle_stopped(Ecs(), reactions, ranks, [])
    assert handled == [1]
