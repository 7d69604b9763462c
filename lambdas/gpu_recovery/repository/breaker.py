"""The blast-radius breaker's item (one per cluster, in the instance table) and the jobs it
holds.

The breaker's state is written only with a condition on the version read
(:meth:`BreakerRepository.update`), in the transaction of the node decision it
answered; the operator's reset writes it the same way. A job that cannot move while a
node's reboot is held back waits HELD (``domain.breaker.hold``) with its hold on the job
item. The policy: ``domain.breaker``; the gate and the
operations: ``recovery.breaker``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_recovery.constants import BREAKER_ITEM_KEY, INSTANCE_PK
from gpu_recovery.domain.breaker.hold import BreakerHold
from gpu_recovery.domain.models import Job
from gpu_recovery.domain.states import JobState
from gpu_recovery.repository.base import Update, from_ddb
from gpu_recovery.repository.cordons import Worklist, worklist_from
from gpu_recovery.repository.jobs_and_ranks import SPEND_COUNTER
from gpu_recovery.repository.tables import RecoveryTables


class BreakerRepository:
    """The breaker's item, and the transitions of the jobs it holds (``repo.breaker``)."""

    def __init__(self, tables: RecoveryTables) -> None:
        self.tables = tables
        self.db = tables.db

    # ============================================================ breaker item
    def read(self) -> dict[str, Any] | None:
        item = self.db.get(self.tables.instance_table_name, {INSTANCE_PK: BREAKER_ITEM_KEY})
        return from_ddb(item) if item else None

    def worklist_and_state(self) -> tuple[Worklist, dict[str, Any] | None]:
        """The cordon worklist and the breaker's item (None: there is none) in one
        BatchGetItem, both on the instance table: the recovery sweep's first read each minute."""
        key = {INSTANCE_PK: BREAKER_ITEM_KEY}
        keys = [*self.tables.cordons.worklist_keys(), key]
        items = self.db.batch_get(self.tables.instance_table_name, keys)
        breaker = next((i for i in items if i.get(INSTANCE_PK) == BREAKER_ITEM_KEY), None)
        return worklist_from(items), from_ddb(dict(breaker)) if breaker else None

    def update(self, state: Mapping[str, Any], read_version: int | None) -> Update:
        """Write the breaker's state, only if nobody wrote it since it was read (its version;
        ``None``: the item did not exist)."""
        fields = {k: state.get(k) for k in ("state", "version", "window", "backlog", "tripped_at",
                                             "trip_reason", "trips", "last_reset_at", "last_reset_by",
                                             "tripped_nodes", "needs_operator", "backlog_dropped")}
        fields["item_type"] = "BREAKER"
        for extra in ("released", "limit", "cluster_gpu_nodes", "window_seconds", "auto_close", "cordons"):
            if extra in state:
                fields[extra] = state[extra]
        if read_version is None:
            condition, values, names = "attribute_not_exists(#k)", {}, {"#k": INSTANCE_PK}
        else:
            condition, values, names = "#v = :v", {":v": read_version}, {"#v": "version"}
        return Update(table=self.tables.instance_table_name, key={INSTANCE_PK: BREAKER_ITEM_KEY},
                      set_fields=fields, condition=condition, condition_values=values,
                      condition_names=names)

    def save(self, state: Mapping[str, Any], read_version: int | None,
             also: Sequence[Update] = ()) -> bool:
        """The breaker's new state (conditional on ``read_version``), with ``also`` (the
        notices it owes: closed by itself, stays open until an operator) in one transaction."""
        return self.db.transact([self.update(state, read_version), *also])

    def drop_released(self, node: str) -> bool:
        """A released backlog entry was carried out (or is moot): remove it."""
        return self.db.apply(Update(
            table=self.tables.instance_table_name, key={INSTANCE_PK: BREAKER_ITEM_KEY},
            remove_fields=[f"released.{node}"], condition="attribute_exists(#r.#n)",
            condition_names={"#r": "released", "#n": node}))

    # =========================================================== held jobs
    def hold_job(self, job: Job, hold: BreakerHold, deadline_at: float, also: Sequence[Update] = ()) -> bool:
        """A job that cannot move waits for a node whose reboot the breaker held back:
        PENDING_RESTART -> HELD on the same attempt with its hold and a deadline (the sweep
        looks again); nothing is charged. A hold of this attempt already written (the job
        went on and is held again for another node) keeps its deadline: the caller passes it."""
        return self.db.transact([self.tables.job_transition(
            job.job_id, JobState.HELD, from_states=[JobState.PENDING_RESTART], attempt=job.attempt,
            reason=hold.waiting_reason(), actor="recovery",
            set_fields={"breaker_hold": hold.to_item(),
                        **self.tables.job_deadline_fields(deadline_at)}), *also])

    def resume_held_job(self, job: Job, hold: BreakerHold, reason: str, now: float) -> bool:
        """Every node the held job waited for is back: HELD -> PENDING_RESTART on the same
        attempt, its restart charged now (once: the transition is conditional on HELD, and it
        leaves the hold nothing more to charge should the job be held again on this fault)."""
        return self.db.apply(self.tables.job_transition(
            job.job_id, JobState.PENDING_RESTART, from_states=[JobState.HELD], attempt=job.attempt,
            reason=reason, actor="recovery",
            set_fields={"breaker_hold.resumed_at": now, "breaker_hold.spend": "",
                        **self.tables.job_deadline_fields(now + 60)},
            increments={SPEND_COUNTER[hold.spend]: 1} if hold.spend in SPEND_COUNTER else None))
