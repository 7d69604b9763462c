"""A stop's STOPPED events that never counted, found by the stop fan-out's paced rounds
(``recovery.gang``) and handled as those events.

* A rank asked to stop whose task ECS describes STOPPED lost its event (a DLQ): handled as that
  event instead of being stopped again.
* A rank recorded ended whose end the attempt's latch did not count: the handling of its
  event died after the rank's write, for good (the event dead-lettered, or a lost event's
  handling a round emitted). Nothing else would count it, so the fault or the stop would wait
  for its backstop; its handling again is idempotent (a redelivery's).

Only in the paced rounds: one DescribeTasks per 100 ranks, and the batch's latch shards (one
item per 64 ranks) with the latch's head only when the batch has a rank recorded ended.
"""

from __future__ import annotations

from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from gpu_recovery.domain.gang_batches import GangBatch
from gpu_recovery.domain.latch import Latch
from gpu_recovery.domain.models import Rank
from gpu_recovery.domain.states import HOLDING_RANK_STATES
from gpu_recovery.recovery.reactions import Reactions, StoppedEventLost


class DescribesTasks(Protocol):
    def describe_tasks(self, task_arns: list[str]) -> list[dict[str, Any]]: ...


class CountsEnds(Protocol):
    def arrived(self, job_id: str, attempt: int, ranks: list[int], latch: Latch) -> set[int]: ...
    def counted(self, job_id: str, attempt: int, world_size: int, ranks: list[int],
                latch: Latch) -> set[int]: ...


def ended_uncounted(latches: CountsEnds, batch: GangBatch, ranks: list[Rank]) -> list[Rank]:
    """The batch's ranks (of its attempt) recorded ended whose end the latch did not count (nor
    the latch's head the shard it completed: ``LatchRepository.counted``)."""
    ended = [r for r in ranks if r.state.is_terminal]
    if not ended:
        return []
    numbers = [r.rank for r in ended]
    counted = latches.counted(batch.job_id, batch.attempt, batch.world_size, numbers, Latch.ENDED) \
        if batch.world_size else latches.arrived(batch.job_id, batch.attempt, numbers, Latch.ENDED)
    return [r for r in ended if r.rank not in counted]


def handle_stopped(ecs: DescribesTasks, reactions: Reactions, todo: list[Rank],
                   uncounted: list[Rank]) -> tuple[list[Rank], list[int]]:
    """Of ``todo`` (ranks to ask again) and ``uncounted``, those ECS describes STOPPED handled
    as their STOPPED event. Returns the ranks of ``todo`` still to stop, and those of ``todo``
    found stopped (an ``uncounted`` rank is never stopped again, nor counted as stopped)."""
    asked = todo + uncounted
    described = {t.get("taskArn"): t for t in ecs.describe_tasks([r.task_arn for r in asked])}
    left: list[Rank] = []
    stopped: list[int] = []
    failure: ClientError | BotoCoreError | None = None
    for rank in asked:
        holding = rank.state in HOLDING_RANK_STATES
        task = described.get(rank.task_arn)
        if task is not None and task.get("lastStatus") == "STOPPED":
            try:
                reactions.emit(StoppedEventLost(task, rank))
            except (ClientError, BotoCoreError) as error:
                failure = failure or error  # the others handled first; this one at the next round
                continue
            if holding:
                stopped.append(rank.rank)
        elif holding:
            left.append(rank)
    if failure is not None:
        raise failure
    return left, stopped
