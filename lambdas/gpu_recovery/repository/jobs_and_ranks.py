"""A job and its ranks: reads and intents (one aggregate: the job item and its rank items,
written together in one transaction when a rank's stop and the job's reaction belong
together; their registration is ``registrations``).

Every intent is a conditional write on the job's state (checked against the one job
state machine) and attempt, or on the rank's state and task: False when the condition did
not hold (a duplicate, a race lost, a state moved on).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import (
    JOB_BY_INSTANCE_INDEX,
    JOB_BY_INSTANCE_PK,
    JOB_PK,
    job_item_key,
    rank_item_key,
)
from gpu_recovery.domain import goodput
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.state_machine import sources_of
from gpu_recovery.domain.states import (
    HOLDING_RANK_STATES,
    LIVE_RANK_STATES,
    JobState,
    RankState,
)
from gpu_recovery.repository.base import DEADLINE_ATTRIBUTES, Update, from_ddb, state_condition
from gpu_recovery.repository.records import is_rank_item
from gpu_recovery.repository.tables import RecoveryTables

# The budgets a restart spends, and the job item's counter of each.
SPEND_INFRASTRUCTURE = "infrastructure"
SPEND_APPLICATION = "application"
SPEND_COUNTER = {SPEND_INFRASTRUCTURE: "recoveries_used", SPEND_APPLICATION: "app_restarts_used"}
# A checkpoint is recorded while the attempt's ranks may train (SUSPENDING: rank 0 saves
# during its grace).
CHECKPOINT_JOB_STATES = frozenset({JobState.STARTING, JobState.RUNNING, JobState.SUSPENDING,
                                   JobState.NODE_LOST, JobState.HUNG})


@dataclass(frozen=True)
class RankStop:
    """A rank's STOPPED event, written in the same transaction as the job's reaction."""

    rank: Rank
    to: RankState
    fields: dict[str, Any] = field(default_factory=dict)
    # The stop names the rank's node a suspect (fault evidence): its instance item is fenced
    # in the same write (``Instance.suspect_fence``), so the node is out of the stack's
    # placements from the moment the stop is recorded until its check clears it.
    fence: dict[str, Any] | None = None



@dataclass(frozen=True)
class TaskLookup:
    """What the task index knows of a task: its rank, or that it was found not protected."""

    rank: Rank | None = None
    unprotected: bool = False


class JobsAndRanks(RecoveryTables):
    """Reads and intents of jobs and their ranks."""

    # ==================================================================== reads
    def get_job(self, job_id: str) -> Job | None:
        item = self.db.get(self.job_table_name, {JOB_PK: job_item_key(job_id)})
        return self.job_from_item(item) if item else None

    def get_job_item(self, job_id: str) -> dict[str, Any] | None:
        item = self.db.get(self.job_table_name, {JOB_PK: job_item_key(job_id)})
        return from_ddb(item) if item else None

    def get_rank(self, job_id: str, rank: int) -> Rank | None:
        item = self.db.get(self.job_table_name, {JOB_PK: rank_item_key(job_id, rank)})
        return self.rank_from_item(item) if item and is_rank_item(item) else None

    def get_ranks_numbered(self, job_id: str, numbers: Iterable[int]) -> list[Rank]:
        """The rank items of ``numbers`` that exist, by key, in rank order."""
        keys = [{JOB_PK: rank_item_key(job_id, r)} for r in numbers]
        ranks = [self.rank_from_item(i) for i in self.db.batch_get(self.job_table_name, keys)
                 if is_rank_item(i)]
        return sorted(ranks, key=lambda r: r.rank)

    def get_rank_range(self, job_id: str, first: int, last: int) -> list[Rank]:
        """Ranks ``first`` to ``last - 1`` of a job (one batch of a fan-out), by key."""
        return self.get_ranks_numbered(job_id, range(first, last))

    def get_ranks(self, job: Job) -> list[Rank]:
        """All rank items of a job, strongly consistent, by key (world_size items): for
        operators' views and small gangs, never per event of a large one."""
        return self.get_ranks_numbered(job.job_id, range(job.world_size))

    def live_ranks_on_instance(self, container_inst_id: str) -> list[Rank]:
        """Ranks still holding GPUs on an instance (sparse index: history is never read)."""
        items = self.db.query_all(
            self.job_table_name,
            IndexName=JOB_BY_INSTANCE_INDEX,
            KeyConditionExpression="#i = :i",
            ExpressionAttributeNames={"#i": JOB_BY_INSTANCE_PK},
            ExpressionAttributeValues={":i": container_inst_id},
        )
        return [self.rank_from_item(i) for i in items]

    # ================================================================ rank intents
    def request_rank_stop(self, rank: Rank, why: str, now: float, *, watched: bool = False) -> bool:
        """Mark a live rank STOP_REQUESTED (once) before asking ECS to stop it; ``watched`` (a
        suspension's stop): it stays in the heartbeat index until STOPPED, so a node lost under
        the stop is still decided by the heartbeat sweep (``heartbeat.escalation``)."""
        return self.db.apply(self.rank_update(rank, RankState.STOP_REQUESTED, from_states=LIVE_RANK_STATES,
                                              set_fields={"stop_reason": why[:300],
                                                          "stop_requested_at": now},
                                              keep_watched=watched))

    def rank_stop_updates(self, stop: RankStop) -> list[Update]:
        """The rank's stop (first), and the fence of its node when the stop makes it a suspect
        (an unconditional SET: the node's item exists since the rank registered)."""
        updates = [self.rank_update(stop.rank, stop.to, from_states=HOLDING_RANK_STATES,
                                    set_fields=stop.fields)]
        if stop.fence and stop.rank.container_inst_id:
            updates.append(self.instance_update(stop.rank.container_inst_id,
                                                set_fields={"suspect_fence": dict(stop.fence)}))
        return updates

    # ================================================================= job intents
    def stop_fanout_fields(self, attempt: int, why: str, now: float) -> dict[str, Any]:
        """The intent to stop every live rank of ``attempt`` (a fan-out of StopTask batches),
        committed with the job's transition; the sweep sends it again until confirmed."""
        return {"stop_fanout": {"attempt": attempt, "why": why[:300], "at": now, "rounds": 0}}

    def finish_job(self, job_id: str, attempt: int | None, to: JobState, reason: str, *,
                   actor: str = "recovery", fields: dict[str, Any] | None = None,
                   from_states: Iterable[JobState] | None = None,
                   rank_stop: RankStop | None = None, stop_ranks_of: int | None = None,
                   stop_why: str = "", also: Sequence[Update] = (),
                   ledger: Mapping[str, Any] | None = None) -> bool:
        """Move a job to a terminal state (from any state that may reach it). With
        ``stop_ranks_of`` (an attempt) the intent to stop that attempt's live ranks is
        committed too, and a deadline kept until the fan-out is confirmed."""
        sources = [s for s in (from_states or sources_of(to))]
        now = clock.now()
        extra = dict(fields or {})
        remove = list(DEADLINE_ATTRIBUTES)
        if stop_ranks_of is not None:
            extra.update(self.stop_fanout_fields(stop_ranks_of, stop_why or reason, now))
            extra.update(self.job_deadline_fields(now + 60))
            remove = []
        job = self.job_transition(job_id, to, from_states=sources, attempt=attempt, reason=reason,
                                  actor=actor, set_fields=extra, remove_fields=remove, ledger=ledger)
        return self.commit_with_rank_stop(job, rank_stop, also)

    def commit_with_rank_stop(self, job_update: Update, rank_stop: RankStop | None,
                              also: Sequence[Update] = ()) -> bool:
        """A job's transition in one transaction with the rank's stop that caused it (a retry
        never finds one written without the other) and ``also``."""
        rank = self.rank_stop_updates(rank_stop) if rank_stop is not None else []
        return self.db.transact([*rank, job_update, *also])

    def mark_job_canceled(self, job_id: str, reason: str, actor: str = "recovery") -> bool:
        return self.db.apply(self.job_transition(
            job_id, JobState.CANCELED, from_states=[JobState.CANCELING], attempt=None,
            reason=reason, actor=actor))

    def record_checkpoint(self, job_id: str, attempt: int, step: int, now: float) -> bool:
        """Rank 0 saved a checkpoint (``gpu_recovery_client.checkpoint_saved``): kept on the job
        item, one small map overwritten (a fault's lost work is measured from it). Only while
        the attempt runs, and never backwards in steps within the attempt (a late duplicate)."""
        condition, values, names = state_condition(
            "job_state", [s.value for s in CHECKPOINT_JOB_STATES], "cs",
            "#att = :att AND (attribute_not_exists(#ck) OR #ck.#att <> :att OR #ck.#st <= :step)")
        values.update({":att": attempt, ":step": step})
        names.update({"#att": "attempt", "#ck": "checkpoint", "#st": "step"})
        return self.db.apply(Update(
            table=self.job_table_name, key={JOB_PK: job_item_key(job_id)},
            set_fields={"checkpoint": {"step": step, "at": now, "attempt": attempt}},
            condition=condition, condition_values=values, condition_names=names))

    def conclude_fault(self, job: Job, to: JobState, *, reason: str, error: str, spend: str,
                       restart_reason: str, deadline_at: float | None, also: Sequence[Update] = (),
                       ledger: Mapping[str, Any] | None = None) -> bool:
        """Every verdict in (counted once every rank ended): the job leaves
        PENDING_HEALTHCHECK on the tally as read."""
        condition, values, names = self.faults.tally_condition(job)
        now = clock.now()
        fields: dict[str, Any] = {}
        if error:
            fields["last_error"] = error[:1000]
        if restart_reason:
            fields["restart_reason"] = restart_reason[:500]
        if deadline_at is not None:
            fields.update(self.job_deadline_fields(deadline_at))
        if to.is_terminal:
            fields.update(self.stop_fanout_fields(job.attempt, error or reason, now))
            fields.update(self.job_deadline_fields(now + 60))
        return self.db.transact([self.job_transition(
            job.job_id, to, from_states=[job.state], attempt=job.attempt, reason=reason, actor="recovery",
            set_fields=fields, increments={SPEND_COUNTER[spend]: 1} if spend else None,
            extra_condition=condition, extra_values=values, extra_names=names,
            ledger={**goodput.stop_marks(job.stopped, job.attempt), **(ledger or {})}), *also])
