"""Persistence of time sharing: node quotas and their usage, the quota charge a queue job
holds while it holds nodes, and the suspension of a job.

Quota accounting is exact under concurrent ticks, submissions and crashes:

* a job's **charge** is written in the same transaction as its launch claim (see
  :meth:`~gpu_recovery.repository.scheduling.SchedulingRepository.claim_launch`): the
  job item gets ``quota_charge`` and the quota item's ``used_nodes`` grows, on the
  condition that the limit the tick read is still the limit and the usage leaves room
  (DynamoDB conditions cannot add, so the tick passes ``limit - nodes``);
* a charge is **released** once, in one transaction that removes ``quota_charge`` from
  the job item (condition: that very charge, and a state that holds no nodes) and
  lowers the usage. A tick that dies between two releases leaves the rest for the next.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_recovery.constants import (
    HOLDING_BUCKET,
    HOLDING_PK,
    HOLDING_SK,
    JOB_BY_HOLDING_INDEX,
    JOB_PK,
    QUEUE_BUCKET,
    QUEUE_PK,
    QUEUE_SK,
    QUOTA_BUCKET,
    QUOTA_PK,
    QUOTA_SK,
    job_item_key,
)
from gpu_recovery.domain import goodput
from gpu_recovery.domain.states import HOLDING_JOB_STATES, QUEUED_JOB_STATES, JobState
from gpu_recovery.domain.time_sharing import QuotaEntry, quota_key
from gpu_recovery.repository.base import (
    DEADLINE_ATTRIBUTES,
    DynamoGateway,
    Update,
    from_ddb,
    state_condition,
    to_ddb,
)
from gpu_recovery.repository.jobs_and_ranks import JobsAndRanks

_NOT_HOLDING = sorted(s.value for s in JobState if s not in HOLDING_JOB_STATES)
_QUEUED = sorted(s.value for s in QUEUED_JOB_STATES)
_HOLDING_ATTRS = [HOLDING_PK, HOLDING_SK]
# A suspend its owner does not hold (``suspend.hold`` absent or False; ``:held`` is True).
_NOT_HELD = "attribute_not_exists(#sp.#h) OR #sp.#h <> :held"


@dataclass(frozen=True)
class QuotaCharge:
    """Nodes a job holds against one user's quota at one level."""

    subject: str
    priority: int
    nodes: int

    @property
    def key(self) -> str:
        return quota_key(self.subject, self.priority)

    def to_item(self, at: float) -> dict[str, Any]:
        return {"key": self.key, "subject": self.subject, "priority": self.priority,
                "nodes": self.nodes, "at": at}

    @classmethod
    def from_item(cls, raw: Mapping[str, Any]) -> QuotaCharge:
        return cls(str(raw["subject"]), int(raw["priority"]), int(raw["nodes"]))


@dataclass(frozen=True)
class ChargeClaim:
    """A charge to take with a launch claim, and what the tick read of the quota."""

    charge: QuotaCharge
    limit_read: int | None  # the user's limit at that level as read (None: not set)
    default_limit: int | None  # the deployment's default for that level (None: unlimited)


class QuotaRepository:
    """The quota table: one item per (user, level): ``max_nodes`` (absent: the deployment's
    default, or none) and ``used_nodes``."""

    def __init__(self, dynamodb: Any, table: str) -> None:
        self.db = DynamoGateway(dynamodb)
        self.table = table

    @staticmethod
    def _key(subject: str, priority: int) -> dict[str, Any]:
        return {QUOTA_PK: QUOTA_BUCKET, QUOTA_SK: quota_key(subject, priority)}

    # ------------------------------------------------------------------ reads
    def get(self, subject: str, priority: int) -> dict[str, Any] | None:
        item = self.db.get(self.table, self._key(subject, priority))
        return from_ddb(item) if item else None

    def entry(self, subject: str, priority: int) -> QuotaEntry | None:
        item = self.get(subject, priority)
        if item is None:
            return None
        limit = item.get("max_nodes")
        return QuotaEntry(None if limit is None else int(limit), int(item.get("used_nodes") or 0))

    def of_subject(self, subject: str) -> list[dict[str, Any]]:
        items = self.db.query_all(
            self.table, KeyConditionExpression="#p = :p AND begins_with(#k, :s)",
            ExpressionAttributeNames={"#p": QUOTA_PK, "#k": QUOTA_SK},
            ExpressionAttributeValues={":p": QUOTA_BUCKET, ":s": f"{subject}#"})
        return [from_ddb(dict(i)) for i in items if str(i.get("subject")) == subject]

    def page(self, limit: int, start_key: Mapping[str, Any] | None = None
             ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        kwargs: dict[str, Any] = {
            "KeyConditionExpression": "#p = :p", "ExpressionAttributeNames": {"#p": QUOTA_PK},
            "ExpressionAttributeValues": {":p": QUOTA_BUCKET}, "Limit": limit}
        if start_key:
            kwargs["ExclusiveStartKey"] = to_ddb(dict(start_key))
        response = self.db.query_page(self.table, **kwargs)
        return [from_ddb(dict(i)) for i in response.get("Items", [])], response.get("LastEvaluatedKey")

    # ----------------------------------------------------------------- writes
    def set_limit(self, subject: str, priority: int, max_nodes: int, *, by: str, now: float
                  ) -> dict[str, Any] | None:
        return self.db.apply_returning(Update(
            table=self.table, key=self._key(subject, priority),
            set_fields={"subject": subject, "priority": priority, "max_nodes": max_nodes,
                        "updated_at": now, "updated_by": by[:512]},
            set_if_absent={"used_nodes": 0}))

    def remove_limit(self, subject: str, priority: int, *, by: str, now: float) -> bool:
        """Back to the deployment's default (the usage counter stays: jobs still hold nodes);
        False when no limit was set."""
        return self.db.apply(Update(
            table=self.table, key=self._key(subject, priority), remove_fields=["max_nodes"],
            set_fields={"updated_at": now, "updated_by": by[:512]},
            condition="attribute_exists(#m)", condition_names={"#m": "max_nodes"}))

    def charge_update(self, charge: QuotaCharge, *, limit_read: int | None, default_limit: int | None
                      ) -> Update:
        """Usage + nodes, only if the limit is still the one read and leaves room."""
        names = {"#m": "max_nodes", "#u": "used_nodes"}
        values: dict[str, Any] = {}
        if limit_read is not None:
            values[":m"] = limit_read
            values[":room"] = limit_read - charge.nodes
            condition = "#m = :m AND (attribute_not_exists(#u) OR #u <= :room)"
        elif default_limit is not None:
            values[":room"] = default_limit - charge.nodes
            condition = "attribute_not_exists(#m) AND (attribute_not_exists(#u) OR #u <= :room)"
        else:
            condition = "attribute_not_exists(#m)"
            names.pop("#u")
        return Update(
            table=self.table, key=self._key(charge.subject, charge.priority),
            set_if_absent={"subject": charge.subject, "priority": charge.priority},
            increments={"used_nodes": charge.nodes},
            condition=condition, condition_values=values, condition_names=names)

    def release_update(self, charge: QuotaCharge) -> Update:
        return Update(table=self.table, key=self._key(charge.subject, charge.priority),
                      increments={"used_nodes": -charge.nodes})


class HoldingRepository:
    """Queue jobs that hold nodes: their quota charges and what the scheduler changes on
    them (release, demotion)."""

    def __init__(self, base: JobsAndRanks, quotas: QuotaRepository) -> None:
        self.base = base
        self.quotas = quotas
        self.db = base.db
        self.table = base.job_table_name

    def holding_jobs(self) -> list[dict[str, Any]]:
        """Every job item in the sparse holding index (projected attributes only)."""
        items = self.db.query_all(
            self.table, IndexName=JOB_BY_HOLDING_INDEX, KeyConditionExpression="#p = :p",
            ExpressionAttributeNames={"#p": HOLDING_PK}, ExpressionAttributeValues={":p": HOLDING_BUCKET})
        return [from_ddb(dict(i)) for i in items]

    def charge_fields(self, charge: QuotaCharge, now: float) -> dict[str, Any]:
        """Job-item attributes of a charge (written with the launch claim)."""
        return {"quota_charge": charge.to_item(now), HOLDING_PK: HOLDING_BUCKET, HOLDING_SK: now}

    def release(self, job_id: str, charge: QuotaCharge) -> bool:
        """Give the nodes back to the quota of a job that no longer holds them (once)."""
        condition, values, names = state_condition(
            "job_state", _NOT_HOLDING, "nh", "#qc.#qk = :key")
        values[":key"] = charge.key
        names.update({"#qc": "quota_charge", "#qk": "key"})
        job = Update(table=self.table, key={JOB_PK: job_item_key(job_id)},
                     remove_fields=["quota_charge", *_HOLDING_ATTRS],
                     condition=condition, condition_values=values, condition_names=names)
        return self.db.transact([job, self.quotas.release_update(charge)])

    def demote(self, job_id: str, attempt: int, *, from_priority: int, to_priority: int,
               reason: str) -> bool:
        return self.db.apply(self.base.job_transition(
            job_id, JobState.RUNNING, from_states=[JobState.RUNNING], attempt=attempt, reason=reason,
            actor="scheduler", set_fields={"priority": to_priority, "demoted_from": from_priority},
            extra_condition="#pr = :pr", extra_values={":pr": from_priority},
            extra_names={"#pr": "priority"}))

    def record_wait_reason(self, job_id: str, reason: str) -> bool:
        """Why a queued job is not starting (shown by ``gpujobs show``); no history entry."""
        condition, values, names = state_condition("job_state", _QUEUED, "q")
        return self.db.apply(Update(
            table=self.table, key={JOB_PK: job_item_key(job_id)}, set_fields={"wait_reason": reason[:500]},
            condition=condition, condition_values=values, condition_names=names))


class SuspensionRepository:
    """The suspension of a queue job (RUNNING -> SUSPENDING -> SUSPENDED -> queued)."""

    def __init__(self, base: JobsAndRanks) -> None:
        self.base = base
        self.db = base.db
        self.table = base.job_table_name

    def request(self, job_id: str, attempt: int, *, suspend: Mapping[str, Any], deadline_at: float,
                reason: str, actor: str) -> bool:
        """RUNNING -> SUSPENDING: rank 0 is told (control API) and has until ``deadline_at``."""
        return self.db.apply(self.base.job_transition(
            job_id, JobState.SUSPENDING, from_states=[JobState.RUNNING], attempt=attempt, reason=reason,
            actor=actor, set_fields={"suspend": dict(suspend), **self.base.job_deadline_fields(deadline_at)},
            ledger=goodput.cause_marks(goodput.suspend_cause(str(suspend.get("kind") or "")))))

    def record_stop(self, job_id: str, attempt: int, *, now: float, why: str, deadline_at: float,
                    actor: str) -> bool:
        """The intent to stop every rank, committed before the first StopTask (once)."""
        return self.db.apply(self.base.job_transition(
            job_id, JobState.SUSPENDING, from_states=[JobState.SUSPENDING], attempt=attempt,
            reason=f"stopping every rank: {why}", actor=actor,
            set_fields={"suspend.stop_requested_at": now, "suspend.stop_reason": why[:300],
                        "stop_fanout": {"attempt": attempt, "why": f"suspended: {why}"[:300], "at": now,
                                        "rounds": 0, "remediation": False},
                        **self.base.job_deadline_fields(deadline_at)},
            extra_condition="attribute_not_exists(#sp.#sr)",
            extra_names={"#sp": "suspend", "#sr": "stop_requested_at"}))

    def rearm(self, job_id: str, attempt: int, deadline_at: float) -> bool:
        return self.db.apply(Update(
            table=self.table, key={JOB_PK: job_item_key(job_id)},
            set_fields=self.base.job_deadline_fields(deadline_at),
            condition="#st = :st AND #att = :att",
            condition_values={":st": JobState.SUSPENDING.value, ":att": attempt},
            condition_names={"#st": "job_state", "#att": "attempt"}))

    def finish(self, job_id: str, attempt: int, *, queue_order: str, hold: bool, reason: str,
               actor: str = "recovery", moves: list[dict[str, Any]] | None = None,
               also: Sequence[Update] = ()) -> bool:
        """SUSPENDING -> SUSPENDED: every rank stopped. Back in the queue at its original
        position (a move off a warned node: at the head of its priority), or held (a user's
        suspend) until resumed. ``moves``: the job's moves with this one (a move).

        ``hold`` is the suspend's hold as read, and the condition is that it still is: a
        suspend or resume by the owner (``set_hold``) committed since is not overwritten
        (False: the caller reads the job again)."""
        fields: dict[str, Any] = {"held": hold, "not_before": 0}
        if not hold:
            fields.update({QUEUE_PK: QUEUE_BUCKET, QUEUE_SK: queue_order})
        if moves is not None:
            fields["moves"] = moves
        update = self.base.job_transition(
            job_id, JobState.SUSPENDED, from_states=[JobState.SUSPENDING], attempt=attempt, reason=reason,
            actor=actor, set_fields=fields, increments={"suspend_count": 1},
            # Every rank stopped: nothing is left to stop (the intent ends here when the sweep,
            # not the last STOPPED event, finishes the suspension).
            remove_fields=[*DEADLINE_ATTRIBUTES, "launched_at", "launch_claimed_at", "wait_reason",
                           "stop_fanout", *([QUEUE_PK, QUEUE_SK] if hold else [])],
            extra_condition="#sp.#h = :held" if hold else _NOT_HELD, extra_values={":held": True},
            extra_names={"#sp": "suspend", "#h": "hold"})
        return self.db.transact([update, *also]) if also else self.db.apply(update)

    def fail_unstopped(self, job_id: str, attempt: int, *, reason: str, rounds: int, now: float,
                       also: Sequence[Update] = ()) -> bool:
        """SUSPENDING -> FAILED: the stop fan-out's ``rounds`` (as read: spent) passed with a rank
        of ``attempt`` still not confirmed stopped. Only while the job is still SUSPENDING on that
        attempt with that stop intent, its rounds not fewer than read (a STOPPED event that
        finished the suspension first, or a newer intent, wins). The spent intent stays, due
        ``now``: the sweep ends it (a terminal job's given-up stops) and the job leaves the
        deadline index; FAILED holds no nodes, so the scheduler's tick releases the charge."""
        return self.db.transact([self.base.job_transition(
            job_id, JobState.FAILED, from_states=[JobState.SUSPENDING], attempt=attempt, reason=reason,
            actor="recovery", set_fields={"last_error": reason[:1000], **self.base.job_deadline_fields(now)},
            extra_condition="#sf.#sa = :att AND #sf.#r >= :r",
            extra_values={":r": rounds},
            extra_names={"#sf": "stop_fanout", "#sa": "attempt", "#r": "rounds"}),
            *also])

    def decline_move(self, job_id: str, attempt: int, *, reason: str, moves: list[dict[str, Any]],
                     also: Sequence[Update] = ()) -> bool:
        """SUSPENDING -> RUNNING: a move off a warned node that the job did not take within its
        bound (no go_suspend(), no stop asked yet, not held by its owner: a held move is
        stopped instead): it keeps running; rank 0 is told no more."""
        update = self.base.job_transition(
            job_id, JobState.RUNNING, from_states=[JobState.SUSPENDING], attempt=attempt, reason=reason,
            actor="recovery", set_fields={"moves": moves}, remove_fields=["suspend", *DEADLINE_ATTRIBUTES],
            extra_condition=f"#sp.#sk = :moved AND attribute_not_exists(#sp.#sr) AND ({_NOT_HELD})",
            extra_values={":moved": "moved", ":held": True},
            extra_names={"#sp": "suspend", "#sk": "kind", "#sr": "stop_requested_at", "#h": "hold"})
        return self.db.transact([update, *also])

    def hold_waiting(self, job_id: str, current: JobState, *, suspend: Mapping[str, Any], reason: str,
                     actor: str) -> bool:
        """A waiting job the owner suspends: out of the queue, held until resumed."""
        return self.db.apply(self.base.job_transition(
            job_id, JobState.SUSPENDED, from_states=[current], attempt=None, reason=reason, actor=actor,
            set_fields={"held": True, "suspend": dict(suspend)},
            remove_fields=[QUEUE_PK, QUEUE_SK, "wait_reason"]))

    def set_hold(self, job_id: str, hold: bool, *, reason: str, actor: str) -> bool:
        """A user's suspend of a job already being suspended (hold it), or a resume of one
        (queue it again once stopped)."""
        return self.db.apply(self.base.job_transition(
            job_id, JobState.SUSPENDING, from_states=[JobState.SUSPENDING], attempt=None, reason=reason,
            actor=actor, set_fields={"suspend.hold": hold}))

    def resume_held(self, job_id: str, *, queue_order: str, reason: str, actor: str) -> bool:
        """A held SUSPENDED job back into the queue at its original position."""
        return self.db.apply(self.base.job_transition(
            job_id, JobState.SUSPENDED, from_states=[JobState.SUSPENDED], attempt=None, reason=reason,
            actor=actor,
            set_fields={"held": False, "not_before": 0, QUEUE_PK: QUEUE_BUCKET, QUEUE_SK: queue_order},
            extra_condition="#h = :true", extra_values={":true": True}, extra_names={"#h": "held"}))

    def job_item(self, job_id: str) -> dict[str, Any] | None:
        return self.base.get_job_item(job_id)
