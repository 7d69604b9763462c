"""Persistence of the queue scheduler: its lease, the queue head and the launch transitions
of a job (claim with its quota charge and its start intent, finish, requeue, fail).

A launch's claim commits the intent to start every rank (``start_fanout``, kind ``launch``)
with the job's transition, as a gang restart's claim does: the recovery's start fan-out
(``recovery.gang``) starts the ranks, and the recovery sweep sends an intent a dead tick left
unsent again. An aborted launch's transition commits the intent to stop what it started
(``stop_fanout``), which the same sweep drives to its end.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import (
    JOB_BY_QUEUE_INDEX,
    JOB_PK,
    MAX_STOP_ROUNDS,
    QUEUE_BUCKET,
    QUEUE_PK,
    QUEUE_SK,
    job_item_key,
    launch_plan_key,
)
from gpu_recovery.domain.models import container_instance_id
from gpu_recovery.domain.rank_template import LAUNCH
from gpu_recovery.domain.states import (
    RECOVERING_JOB_STATES,
    STARTED_JOB_STATES,
    WAITING_JOB_STATES,
    JobState,
)
from gpu_recovery.repository.base import DEADLINE_ATTRIBUTES, Update, from_ddb, to_ddb
from gpu_recovery.repository.jobs_and_ranks import JobsAndRanks
from gpu_recovery.repository.time_sharing import ChargeClaim, HoldingRepository

LEASE_KEY = "SCHEDULER#LEASE"
PLAN_CHUNK = 80  # ranks per launch-plan item (~10 KB)
# A launch the recovery sweep looks at (then every minute) unless its ranks confirm it first: it
# sends an intent a dead tick left unsent again.
LAUNCH_BACKSTOP_SECONDS = 120
STOP_SWEEP_SECONDS = 60  # an aborted launch's stop intent: the sweep's first look
# Sorted: the condition's placeholders (and so the request) are the same every time.
_STARTED = sorted(STARTED_JOB_STATES, key=lambda s: s.value)
_WAITING = sorted(WAITING_JOB_STATES, key=lambda s: s.value)
# An abort's condition: the launch is not complete (a complete launch is never ended short).
_NOT_LAUNCHED = "attribute_not_exists(#la)"
# A job's consecutive given-up launches (the sweep's give-up of a launch that never completed):
# back to 0 when a launch completes; a placement failure leaves it as it is.
LAUNCH_GIVE_UPS = "launch_give_ups"


def aborted_launch_stopping(item: Mapping[str, Any]) -> bool:
    """A queued job's own last launch was aborted and the intent to stop the ranks it started
    is live (its rounds not spent): the job is not admitted again before it ends (a rank of
    that launch may still run). A stop intent of another kind or attempt left on a queued item
    (a suspension's, a relocated fault's, an earlier launch's) waits for nothing; a spent one
    is given up (the sweep ends it, ``recovery.gang``)."""
    intent = item.get("stop_fanout") or {}
    return bool(intent.get("aborted_launch")) \
        and int(intent.get("attempt") or 0) == int(item.get("attempt") or 0) \
        and int(intent.get("rounds") or 0) < MAX_STOP_ROUNDS


class SchedulingRepository:
    def __init__(self, repo: JobsAndRanks, holding: HoldingRepository | None = None) -> None:
        self.repo = repo
        self.db = repo.db
        self.table = repo.job_table_name
        self.holding = holding  # quota charges (None: no quota table, nothing charged)

    # ----------------------------------------------------------------- lease
    def acquire_lease(self, owner: str, now: float, seconds: float) -> dict[str, dict[str, Any]] | None:
        """Take (or renew) the one scheduler lease: None when another tick holds it, else the
        launch ledger an older release left on the item (``inflight``: job id -> entry, as the
        lease was taken: ReturnValues=ALL_NEW, no GetItem; empty once drained,
        ``queue.ledger_drain``)."""
        item = self.db.apply_returning(Update(
            table=self.table, key={JOB_PK: LEASE_KEY},
            set_fields={"owner": owner, "expires_at": now + seconds, "acquired_at": now,
                        "item_type": "LEASE"},
            condition="attribute_not_exists(#k) OR #e < :now OR #o = :me",
            condition_values={":now": to_ddb(now), ":me": owner},
            condition_names={"#k": JOB_PK, "#e": "expires_at", "#o": "owner"},
        ), returning="ALL_NEW")
        return None if item is None else dict(from_ddb(dict(item.get("inflight") or {})))

    def drop_ledger_entry(self, job_id: str) -> bool:
        """An older release's launch ledger entry, drained (``queue.ledger_drain``)."""
        return self.db.apply(Update(
            table=self.table, key={JOB_PK: LEASE_KEY}, remove_fields=[f"inflight.{job_id}"],
            condition="attribute_exists(#i.#j)", condition_names={"#i": "inflight", "#j": job_id}))

    def release_lease(self, owner: str) -> bool:
        return self.db.apply(Update(
            table=self.table, key={JOB_PK: LEASE_KEY}, set_fields={"expires_at": 0},
            condition="#o = :me", condition_values={":me": owner}, condition_names={"#o": "owner"},
        ))

    # --------------------------------------------------------------- reads
    def job_item(self, job_id: str) -> dict[str, Any] | None:
        return self.repo.get_job_item(job_id)

    def queue_head(self, page_size: int) -> Iterator[dict[str, Any]]:
        """The queue index ascending (priority high -> low, FIFO), page by page, lazily."""
        kwargs: dict[str, Any] = {
            "IndexName": JOB_BY_QUEUE_INDEX,
            "KeyConditionExpression": "#b = :b",
            "ExpressionAttributeNames": {"#b": QUEUE_PK},
            "ExpressionAttributeValues": {":b": QUEUE_BUCKET},
            "ScanIndexForward": True,
            "Limit": page_size,
        }
        while True:
            response = self.db.query_page(self.table, **kwargs)
            for item in response.get("Items", []):
                yield from_ddb(dict(item))
            if "LastEvaluatedKey" not in response:
                return
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    def deadline_job_items(self) -> list[dict[str, Any]]:
        """Every job item carrying a deadline (the sparse index: jobs in recovery, launches and
        restarts in progress, stops being driven), read once for a tick's snapshot."""
        return self.repo.deadlines.job_items()

    def jobs_in_recovery(self, deadline_items: Sequence[Mapping[str, Any]] | None = None
                         ) -> list[dict[str, Any]]:
        """Jobs in PENDING_HEALTHCHECK / PENDING_RESTART / HELD: they carry a deadline, so the
        sparse deadline index lists them (as many items as jobs in recovery)."""
        states = {s.value for s in RECOVERING_JOB_STATES}
        items = self.repo.deadlines.job_items() if deadline_items is None else deadline_items
        return [from_ddb(dict(i)) for i in items
                if i.get("item_type") == "JOB" and i.get("job_state") in states]

    @staticmethod
    def launches_in_progress(deadline_items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Queue launches claimed and not complete (STARTING with a launch's start intent): each
        holds its planned nodes until its ranks are placed."""
        found = []
        for raw in deadline_items:
            item = from_ddb(dict(raw))
            intent = item.get("start_fanout") or {}
            if item.get("item_type") == "JOB" and item.get("job_state") == JobState.STARTING.value \
                    and intent.get("kind") == LAUNCH and item.get("launched_at") is None:
                found.append(item)
        return found

    def jobs_holding_nodes(self, deadline_items: Sequence[Mapping[str, Any]] | None = None
                           ) -> list[dict[str, Any]]:
        """The jobs in recovery (:meth:`jobs_in_recovery`), the gang restarts not placed
        yet (STARTING with the recovery loop's restart of that attempt) and the queue launches in
        progress (:meth:`launches_in_progress`: their nodes are the plan's, :meth:`planned_nodes`):
        each holds its nodes until every rank is placed. All carry a deadline: one read of the
        sparse index (``deadline_items``: that read, as the caller just made it)."""
        items = self.repo.deadlines.job_items() if deadline_items is None else deadline_items
        states = {s.value for s in RECOVERING_JOB_STATES}
        launching = {str(i["job_id"]) for i in self.launches_in_progress(items)}
        return [from_ddb(dict(i)) for i in items if i.get("item_type") == "JOB" and (
            i.get("job_state") in states or str(i.get("job_id")) in launching
            or (i.get("job_state") == JobState.STARTING.value
                and int(i.get("restarted_attempt") or -1) == int(i.get("attempt") or 0)))]

    def planned_nodes(self, item: Mapping[str, Any]) -> set[str]:
        """The nodes (container instance ids) a queue launch in progress planned its ranks on:
        one BatchGetItem of its plan items (one per PLAN_CHUNK ranks); none for any other job."""
        if not self.launches_in_progress([item]):
            return set()
        world_size = int((item.get("launch") or {}).get("world_size") or item.get("world_size") or 1)
        arns, _ = self.plan_nodes(str(item["job_id"]), int(item.get("attempt") or 0), world_size)
        return {container_instance_id(arn) for arn in arns if arn}

    # ----------------------------------------------------------- launches
    def plan_updates(self, job_id: str, attempt: int, nodes: Sequence[str],
                     ec2_instance_ids: Sequence[str]) -> list[Update]:
        """The launch plan's nodes (rank i on nodes[i]) as items of PLAN_CHUNK ranks, so the
        job item stays small whatever the job's size."""
        updates = []
        for chunk, first in enumerate(range(0, len(nodes), PLAN_CHUNK)):
            updates.append(Update(
                table=self.table, key={JOB_PK: launch_plan_key(job_id, attempt, chunk)},
                set_fields={"item_type": "LAUNCH_PLAN", "first": first,
                            "nodes": list(nodes[first:first + PLAN_CHUNK]),
                            "ec2_instance_ids": list(ec2_instance_ids[first:first + PLAN_CHUNK])},
                condition="attribute_not_exists(#k)", condition_names={"#k": JOB_PK}))
        return updates

    def plan_nodes(self, job_id: str, attempt: int, world_size: int) -> tuple[list[str], list[str]]:
        """The launch plan's nodes and EC2 instance ids, by rank."""
        keys = [{JOB_PK: launch_plan_key(job_id, attempt, c)} for c in range(-(-world_size // PLAN_CHUNK))]
        nodes, ec2 = [""] * world_size, [""] * world_size
        for item in self.db.batch_get(self.table, keys):
            item = from_ddb(item)
            first = int(item.get("first") or 0)
            pairs = zip(item.get("nodes") or [], item.get("ec2_instance_ids") or [], strict=False)
            for i, (node, ec2_id) in enumerate(pairs):
                if first + i < world_size:
                    nodes[first + i], ec2[first + i] = str(node), str(ec2_id)
        return nodes, ec2

    def plan_range(self, job_id: str, attempt: int, first: int, last: int) -> tuple[list[str], list[str]]:
        """The launch plan's nodes and EC2 instance ids of ranks ``first`` to ``last - 1`` (a
        start batch: one plan item when it is aligned on PLAN_CHUNK)."""
        chunks = range(first // PLAN_CHUNK, -(-last // PLAN_CHUNK))
        keys = [{JOB_PK: launch_plan_key(job_id, attempt, c)} for c in chunks]
        nodes, ec2 = [""] * (last - first), [""] * (last - first)
        for item in self.db.batch_get(self.table, keys):
            item = from_ddb(item)
            start = int(item.get("first") or 0)
            pairs = zip(item.get("nodes") or [], item.get("ec2_instance_ids") or [], strict=False)
            for i, (node, ec2_id) in enumerate(pairs):
                if first <= start + i < last:
                    nodes[start + i - first], ec2[start + i - first] = str(node), str(ec2_id)
        return nodes, ec2

    def claim_launch(self, job_id: str, current_attempt: int | None, attempt: int, plan: dict[str, Any],
                     now: float, owner: str, reason: str,
                     relocations: Sequence[Mapping[str, Any]] | None = None, *,
                     charge: ChargeClaim | None = None, resumed: bool = False,
                     plan_items: Sequence[Update] = ()) -> bool:
        """QUEUED / PENDING_RESOURCES / SUSPENDED -> STARTING with ``attempt``, out of the
        queue index, the intent to start its ranks (``start_fanout``, kind launch) and the quota
        charge, in one transaction (only while the lease is ours, and only if the quota still
        has room). A job the recovery loop
        relocated records where its ranks moved (``relocations``); a suspended job resumed
        counts it (``resume_count``)."""
        extra: dict[str, Any] = {"relocations": list(relocations)} if relocations is not None else {}
        # Still in the queue: a hold (which takes the job out of the queue index, its state kept)
        # landing after the tick read its page is not undone by the claim.
        conditions = ["attribute_exists(#queued)"]
        names = {"#queued": QUEUE_PK}
        if current_attempt is None:
            conditions.append("attribute_not_exists(#attempt0)")
            names["#attempt0"] = "attempt"
        updates: list[Update] = []
        if charge is not None and self.holding is not None:
            extra.update(self.holding.charge_fields(charge.charge, now))
            conditions.append("attribute_not_exists(#qc)")
            names["#qc"] = "quota_charge"
            updates.append(self.holding.quotas.charge_update(charge.charge, limit_read=charge.limit_read,
                                                             default_limit=charge.default_limit))
        claim = self.repo.job_transition(
            job_id, JobState.STARTING,
            from_states=[JobState.SUSPENDED] if resumed else _WAITING,
            attempt=current_attempt,
            extra_condition=" AND ".join(conditions), extra_names=names,
            reason=reason, actor="scheduler",
            # In the deadline index while it starts: the recovery sweep sends its start intent
            # again if a dead tick left it unsent, and confirms a launch whose ranks' RUNNING
            # events were lost (docs/recovery-loop.md).
            set_fields={"attempt": attempt, "launch": plan, "launch_claimed_at": now, **extra,
                        "start_fanout": {"attempt": attempt, "at": now, "kind": LAUNCH},
                        **self.repo.job_deadline_fields(now + LAUNCH_BACKSTOP_SECONDS)},
            increments={"resume_count": 1} if resumed else None,
            # A stop intent still on the job waits for nothing (``aborted_launch_stopping``: the
            # scheduler admitted it): it goes, or it would stay on the new attempt for good.
            remove_fields=[QUEUE_PK, QUEUE_SK, "launched_at", "wait_reason", "held", "stop_fanout",
                           *(["relocation"] if "relocations" in extra else [])],
        )
        lease = Update(  # only while the lease is ours
            table=self.table, key={JOB_PK: LEASE_KEY}, set_fields={"claimed_at": now},
            condition="#owner = :owner", condition_values={":owner": owner},
            condition_names={"#owner": "owner"},
        )
        return self.db.transact([claim, lease, *updates, *plan_items])

    def finish_launch(self, job_id: str, attempt: int, attempts: Sequence[Mapping[str, Any]],
                      now: float) -> bool:
        """The launch of ``attempt`` is complete (once): the job still STARTING with the launch's
        start intent (or none: an older release's launch, ``queue.ledger_drain``), or RUNNING
        already (its every rank registered, rank 0's RUNNING event confirmed it first and took the
        intent off). Not once it was aborted (requeued or failed, the same attempt), canceled, or
        went into recovery meanwhile."""
        return self.db.apply(Update(
            table=self.table, key={JOB_PK: job_item_key(job_id)},
            set_fields={"launched_at": now, "resource_failures": 0, LAUNCH_GIVE_UPS: 0,
                        "attempts": list(attempts), "updated_at": now},
            condition="#a = :a AND attribute_not_exists(#la) AND ((#s = :starting "
                      "AND (attribute_not_exists(#sf) OR #sf.#sa = :a)) OR #s = :running)",
            condition_values={":a": attempt, ":starting": JobState.STARTING.value,
                              ":running": JobState.RUNNING.value},
            condition_names={"#a": "attempt", "#s": "job_state", "#la": "launched_at", "#sf": "start_fanout",
                             "#sa": "attempt"},
        ))

    def requeue_after_failed_launch(self, job_id: str, attempt: int, *, reason: str, queue_order: str,
                                    not_before: float, resource_failures: int,
                                    attempts: Sequence[Mapping[str, Any]], stop_why: str = "",
                                    given_up: bool = False, give_ups: int | None = None) -> bool:
        """Back to PENDING_RESOURCES at its original queue position, after a back-off.
        From RUNNING too (a rank not placed: the launch is aborted whatever rank 0 does), never
        once the launch is complete (``launched_at``). ``given_up`` (the sweep's give-up of a
        launch that did not complete in time): only while the job is still STARTING, so a launch
        completing under the give-up's read is not ended; ``give_ups``: the job's consecutive
        given-up launches, this one included (``launch_give_ups``, None: left as it is). ``stop_why``:
        the intent to stop the ranks the launch started, in the same write (the job is not admitted
        again until it ends: the recovery sweep drives it)."""
        now = clock.now()
        counted = {} if give_ups is None else {LAUNCH_GIVE_UPS: give_ups}
        return self.db.apply(self.repo.job_transition(
            job_id, JobState.PENDING_RESOURCES, from_states=[JobState.STARTING] if given_up else _STARTED,
            attempt=attempt, reason=reason, actor="scheduler",
            set_fields={QUEUE_PK: QUEUE_BUCKET, QUEUE_SK: queue_order, "not_before": not_before,
                        "resource_failures": resource_failures, "attempts": list(attempts), **counted,
                        "last_error": reason[:1000], **self._stop_fields(attempt, stop_why, now)},
            remove_fields=["launch_claimed_at", "start_fanout", *([] if stop_why else DEADLINE_ATTRIBUTES)],
            extra_condition=_NOT_LAUNCHED, extra_names={"#la": "launched_at"},
        ))

    def fail_launch(self, job_id: str, attempt: int, *, reason: str, failure_kind: str,
                    attempts: Sequence[Mapping[str, Any]], stop_why: str = "", give_ups: int | None = None,
                    owed: Sequence[Update] = ()) -> bool:
        """FAILED (a user error): from RUNNING too, never once the launch is complete. A launch
        given up once too often (``give_ups``: the job's consecutive given-up launches, this one
        included): only while the job is still STARTING, as the give-up's requeue. ``owed``: the
        e-mails that report it (the notice outbox), in the same transaction."""
        now = clock.now()
        counted = {} if give_ups is None else {LAUNCH_GIVE_UPS: give_ups}
        failed = self.repo.job_transition(
            job_id, JobState.FAILED, from_states=_STARTED if give_ups is None else [JobState.STARTING],
            attempt=attempt, reason=reason, actor="scheduler",
            set_fields={"attempts": list(attempts), "last_error": reason[:1000], **counted,
                        "failure_kind": failure_kind, **self._stop_fields(attempt, stop_why, now)},
            remove_fields=["launch_claimed_at", "start_fanout", *([] if stop_why else DEADLINE_ATTRIBUTES)],
            extra_condition=_NOT_LAUNCHED, extra_names={"#la": "launched_at"},
        )
        return self.db.transact([failed, *owed])

    def _stop_fields(self, attempt: int, why: str, now: float) -> dict[str, Any]:
        """An aborted launch's stop intent (``aborted_launch``: it ends once every rank the
        launch registered ended, ``recovery.gang``), with a deadline for the sweep."""
        if not why:
            return {}
        fields = self.repo.stop_fanout_fields(attempt, why, now)
        # Not a remediation: stopped in every remediation mode (as a cancel's stop).
        fields["stop_fanout"].update(aborted_launch=True, remediation=False)
        return {**fields, **self.repo.job_deadline_fields(now + STOP_SWEEP_SECONDS)}

    def cancel_unlaunched(self, job_id: str, reason: str) -> bool:
        """CANCELING with no live rank: no STOPPED event will finish the cancel."""
        return self.repo.mark_job_canceled(job_id, reason, actor="scheduler")

