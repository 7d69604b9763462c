"""Calls made against a deadline AWS sets (a node it takes away: ``recovery.aws_notices``).

The sweep's minute and a delivery's retry may both come too late, so a failed call is tried
again at once (``once_more.twice``), and the ranks on the node AWS takes are asked to stop before
their gang's others (:func:`stop_first`): the deadline is theirs alone, and a large gang's stop
is paced by the stack's ECS budget (8,192 ranks take minutes).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import partial
from typing import Protocol

from botocore.exceptions import BotoCoreError, ClientError

from gpu_recovery import clock
from gpu_recovery.adapters.ecs_budget import RateLimited
from gpu_recovery.domain.models import Rank
from gpu_recovery.domain.states import system_stop_reason
from gpu_recovery.once_more import twice

logger = logging.getLogger(__name__)


class StopMarks(Protocol):
    def request_rank_stop(self, rank: Rank, why: str, now: float, *, watched: bool = False) -> bool: ...


class TaskStopper(Protocol):
    def stop_task_before_deadline(self, task_arn: str, reason: str) -> None: ...


def stop_first(ranks: Iterable[Rank], why: str, marks: StopMarks, ecs: TaskStopper, *,
               watched: bool = False) -> None:
    """Each rank marked asked (as the gang's stop does; a mark tried again finds it written and
    answers False), then StopTask (idempotent), each tried again at once. The gang's stop then
    finds them asked; if this fails, the gang's stop asks a rank not marked and the paced rounds
    (or the notice's sweep) a marked one. The StopTask is not held back by the ECS budget's own
    item failing (``stop_task_before_deadline``). ``watched``: a suspension's
    (``request_rank_stop``).
    Never raises: the stop goes on."""
    for rank in ranks:
        try:
            twice(partial(marks.request_rank_stop, rank, why, clock.now(), watched=watched))
            twice(partial(ecs.stop_task_before_deadline, rank.task_arn, system_stop_reason(why)))
        except (ClientError, BotoCoreError, RateLimited) as error:
            logger.warning("a rank on a node AWS takes not asked first: the gang's stop or the "
                           "sweep asks it", extra={"job_id": rank.job_id, "rank": rank.rank,
                                                   "error": str(error)})
