"""Persistence of node heartbeats and GPU telemetry, in intents (node tokens: ``node_tokens``).

The heartbeat service (:mod:`gpu_recovery.heartbeat`) and the token store
(:mod:`gpu_recovery.heartbeat.tokens`) never touch DynamoDB themselves: every read and every
conditional write they need is a method here, so no condition expression lives
outside the repository package.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import (
    HB_AT,
    HB_BUCKET,
    HB_PK,
    HB_SHARDS,
    HB_SK,
    INSTANCE_PK,
    JOB_BY_HEARTBEAT_INDEX,
    JOB_BY_INSTANCE_INDEX,
    JOB_BY_INSTANCE_PK,
    JOB_BY_TASK_PK,
    JOB_PK,
    InstanceState,
    JobState,
    RankState,
    job_item_key,
    rank_item_key,
)
from gpu_recovery.domain.heartbeat_policy import heartbeat_shard, heartbeat_slot
from gpu_recovery.domain.models import Instance, Job, Rank
from gpu_recovery.domain.states import ACTIVE_JOB_STATES
from gpu_recovery.repository import Repository, Update, from_ddb, records, to_ddb
from gpu_recovery.repository.base import DEADLINE_ATTRIBUTES

# Job states in which ranks are watched (a queue job is STARTING until every rank runs; a
# SUSPENDING job may go back to RUNNING, a move declined: a node lost meanwhile must be caught).
WATCHED_JOB_STATES = tuple(sorted(ACTIVE_JOB_STATES | {JobState.SUSPENDING}, key=lambda s: s.value))
# Attribute that orders a node's reports: the timestamp of its last accepted report.
TASKS_REPORT_KEY = "last_tasks_report_ts"
GPU_REPORT_KEY = "last_gpu_report_ts"
GPU_REPORT_VERSION = "gpu_report_version"
# On a NODE_LOST rank: when the sweep first read its node's ECS agent disconnected (this spell).
DISCONNECTED_SEEN = "ecs_disconnected_seen_at"
# The ranks the lost-node escalation decides on: lost, or asked to stop by a suspension and
# still watched (their node may be lost under the stop: ``heartbeat.escalation``).
LOST_RANK_STATES = frozenset({RankState.NODE_LOST, RankState.STOP_REQUESTED})


def lost_attr(attempt: int) -> str:
    return f"hb_lost_a{attempt}"


def hung_attr(attempt: int) -> str:
    return f"hb_hung_a{attempt}"


def _watched_job_condition(attempt: int) -> tuple[str, dict[str, Any], dict[str, str]]:
    values: dict[str, Any] = {f":j{i}": s.value for i, s in enumerate(WATCHED_JOB_STATES)}
    values[":att"] = attempt
    placeholders = ", ".join(f":j{i}" for i in range(len(WATCHED_JOB_STATES)))
    return (f"#att = :att AND #js IN ({placeholders})", values,
            {"#att": "attempt", "#js": "job_state"})


# What a settling step of a job requires of its per-attempt lost / hung rank sets.
SETTLE_CONDITIONS = {
    "none_lost": "attribute_not_exists(#lost)",
    "none_hung_or_some_lost": "attribute_not_exists(#hung) OR attribute_exists(#lost)",
    "some_lost": "attribute_exists(#lost)",
    "some_hung_none_lost": "attribute_exists(#hung) AND attribute_not_exists(#lost)",
}


class HeartbeatRepository:
    """Heartbeat bookkeeping on the job and container-instance tables."""

    def __init__(self, base: Repository, *, shards: int = HB_SHARDS) -> None:
        self.base = base
        self.tables = base.tables  # the gateway and the update builders
        self.shards = shards  # the heartbeat index's partition keys (HB_SHARDS deployed)
        self._jobs = base.tables._ddb.Table(base.tables.job_table_name)
        self._instances = base.tables._ddb.Table(base.tables.instance_table_name)

    # ------------------------------------------------------------------ reads
    def get_job(self, job_id: str) -> Job | None:
        return self.base.jobs.get_job(job_id)

    def get_instance(self, node_id: str) -> Instance | None:
        return self.base.instances.get_instance(node_id)

    def live_ranks_on_instance(self, node_id: str) -> list[Rank]:
        return self.base.jobs.live_ranks_on_instance(node_id)

    @staticmethod
    def rank_from_item(item: dict[str, Any]) -> Rank:
        return records.rank_from_item(item)

    @staticmethod
    def instance_from_item(item: dict[str, Any]) -> Instance:
        return records.instance_from_item(item)

    def node_item(self, node_id: str) -> dict[str, Any] | None:
        raw = self._instances.get_item(Key={INSTANCE_PK: node_id}, ConsistentRead=True).get("Item")
        return from_ddb(dict(raw)) if raw else None

    def node_items(self, node_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        keys = [{INSTANCE_PK: n} for n in sorted(set(node_ids))]
        return {str(raw[INSTANCE_PK]): from_ddb(dict(raw))
                for raw in self.tables.db.batch_get(self.tables.instance_table_name, keys)}

    def rank_item(self, key: str) -> dict[str, Any] | None:
        raw = self._jobs.get_item(Key={JOB_PK: key}, ConsistentRead=True).get("Item")
        return from_ddb(dict(raw)) if raw else None

    def job_item(self, job_id: str) -> dict[str, Any] | None:
        return self.rank_item(job_item_key(job_id))

    def live_rank_items_on_node(self, node_id: str) -> list[dict[str, Any]]:
        """Every live rank item on the node (sparse ``by-container-instance`` index)."""
        return self._query_all({
            "IndexName": JOB_BY_INSTANCE_INDEX,
            "KeyConditionExpression": "#i = :i",
            "ExpressionAttributeNames": {"#i": JOB_BY_INSTANCE_PK},
            "ExpressionAttributeValues": {":i": node_id},
        })

    def stale_rank_items(self, cutoff: float) -> list[dict[str, Any]]:
        """Watched ranks whose last heartbeat is older than ``cutoff``: each shard of the
        sparse index read for the slots that start before it (keys only), then those items
        (BatchGetItem) kept if their exact last heartbeat is. Reads grow with the stale
        ranks (and the ``shards`` Queries), never with the healthy ones."""
        keys: list[dict[str, Any]] = []
        for shard in range(self.shards):
            keys.extend({JOB_PK: entry[JOB_PK]} for entry in self._query_all({
                "IndexName": JOB_BY_HEARTBEAT_INDEX,
                "KeyConditionExpression": "#b = :b AND #h < :cutoff",
                "ExpressionAttributeNames": {"#b": HB_PK, "#h": HB_SK},
                "ExpressionAttributeValues": {":b": _shard_key(shard), ":cutoff": to_ddb(float(cutoff))},
            }))
        items = [from_ddb(dict(raw)) for raw in self.tables.db.batch_get(self.tables.job_table_name, keys)]
        return sorted((i for i in items if i.get(HB_PK) and isinstance(i.get(HB_AT), int | float)
                       and not isinstance(i.get(HB_AT), bool) and float(i[HB_AT]) < cutoff),
                      key=lambda i: str(i[JOB_PK]))

    def heartbeat_fields(self, job_id: str, rank: int, at: float, slot_seconds: int) -> dict[str, Any]:
        return heartbeat_index_fields(job_id, rank, at, slot_seconds, self.shards)

    def _query_all(self, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        while True:
            page = self._jobs.query(**kwargs)
            items.extend(from_ddb(dict(i)) for i in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    # ----------------------------------------------------------- node reports
    def register_node(self, instance: Instance) -> bool:
        return self.base.instances.put_instance_if_absent(instance)

    def record_tasks_report(self, node_id: str, report_ts: float,
                            fields: dict[str, Any]) -> dict[str, Any] | None:
        """Accept a task report unless it repeats the last accepted one (same timestamp);
        returns the node item as written, None when the node is unknown or it is a repeat.

        Reports are ordered by the server's receive time: a node clock that steps back
        (within the allowed skew) is not a replay.
        """
        return self.tables.db.apply_returning(
            self._report_update(node_id, TASKS_REPORT_KEY, report_ts, fields))

    def _report_update(self, node_id: str, key_attr: str, report_ts: float,
                       fields: dict[str, Any], version: int | None = None,
                       extra: dict[str, Any] | None = None) -> Update:
        names = {"#k": INSTANCE_PK, "#ts": key_attr}
        values: dict[str, Any] = {":ts": report_ts}
        condition = "attribute_exists(#k) AND (attribute_not_exists(#ts) OR #ts <> :ts)"
        set_fields = {**fields, key_attr: report_ts}
        if version is not None:
            names["#v"] = GPU_REPORT_VERSION
            if version == 0:
                condition += " AND attribute_not_exists(#v)"
            else:
                condition += " AND #v = :v"
                values[":v"] = version
            set_fields[GPU_REPORT_VERSION] = version + 1
        return Update(table=self.tables.instance_table_name, key={INSTANCE_PK: node_id},
                      set_fields=set_fields, condition=condition, condition_values=values,
                      condition_names=names, **(extra or {}))

    def record_gpu_report(self, node_id: str, report_ts: float, version: int,
                          fields: dict[str, Any], clear_error: bool, also: Sequence[Update] = ()) -> bool:
        """Write a GPU report over the version read (optimistic: a concurrent report
        of the same node makes this one fail, and the caller re-reads); with ``also`` (the
        e-mail it decides, owed) in one transaction."""
        update = self._report_update(node_id, GPU_REPORT_KEY, report_ts, fields, version,
                                     {"remove_fields": ["gpu_report_error"] if clear_error else []})
        return self.tables.db.transact([update, *also]) if also else self.tables.db.apply(update)

    def flag_suspect(self, node_id: str, now: float, reason: str) -> bool:
        """AVAILABLE (or unknown) -> SUSPECT."""
        return self.tables.db.apply(self.base.decisions.suspect_flag(node_id, now, reason, origin="telemetry",
                                                                     allow_missing=True))

    def record_warning(self, node_id: str, record: dict[str, Any], now: float, *,
                       stale_before: float | None = None) -> bool:
        """The driver's warning on a node no recovery owns (AVAILABLE / SUSPECT): its record,
        due for the recovery sweep now (the intent: the sweep repairs or moves). Only once per
        warning rule (a repeat report writes nothing), unless the one kept is older than the
        node's last repair (``stale_before``)."""
        condition = "attribute_not_exists(#w) OR #w.#r <> :r"
        values: dict[str, Any] = {":r": record["rule"]}
        names = {"#w": "warning", "#r": "rule"}
        if stale_before is not None:
            condition += " OR #w.#s < :rep"
            values[":rep"] = stale_before
            names["#s"] = "since"
        return self.tables.db.apply(self.base.instances.instance_update(
            node_id, from_states=[InstanceState.AVAILABLE, InstanceState.SUSPECT],
            set_fields={"warning": record}, deadline_at=now, extra_condition=condition,
            extra_values=values, extra_names=names))

    # ------------------------------------------------------------------ ranks
    def refresh_rank(self, rank: Rank, fields: dict[str, Any]) -> bool:
        """Record a heartbeat on a rank still in the state (and task) it was read in."""
        return self.tables.db.apply(self.base.jobs.rank_update(rank, rank.state, from_states=[rank.state],
                                                               set_fields=fields))

    def move_rank(self, rank: Rank, from_state: RankState, to: RankState, fields: dict[str, Any],
                  *, add: set[str] | None = None, delete: set[str] | None = None,
                  remove: list[str] | None = None, also: Sequence[Update] = ()) -> bool:
        """Rank transition and the job's per-attempt lost / hung sets (and ``also``: an e-mail
        owed), atomically; only while the job is watched and on the rank's attempt."""
        rank_update = self.base.jobs.rank_update(rank, to, from_states=[from_state], set_fields=fields)
        rank_update.remove_fields.extend(remove or [])
        member = {str(rank.rank)}
        condition, values, names = _watched_job_condition(rank.attempt)
        job_update = Update(
            table=self.tables.job_table_name, key={JOB_PK: job_item_key(rank.job_id)},
            set_fields={"updated_at": clock.now()},
            add_to_sets={a: member for a in (add or set())},
            delete_from_sets={d: member for d in (delete or set())},
            condition=condition, condition_values=values, condition_names=names,
        )
        return self.tables.db.transact([rank_update, job_update, *also])

    def mark_rank_lost(self, rank: Rank, heartbeat_seen: Any, fields: dict[str, Any]) -> bool:
        """RUNNING / HUNG -> NODE_LOST, unless a heartbeat landed since ``heartbeat_seen``."""
        rank_update = self.base.jobs.rank_update(rank, RankState.NODE_LOST, from_states=[rank.state],
                                                 set_fields=fields)
        rank_update.condition = f"({rank_update.condition}) AND #hbseen = :hbseen"
        rank_update.condition_names["#hbseen"] = HB_AT
        rank_update.condition_values[":hbseen"] = heartbeat_seen
        member = {str(rank.rank)}
        condition, values, names = _watched_job_condition(rank.attempt)
        job_update = Update(
            table=self.tables.job_table_name, key={JOB_PK: job_item_key(rank.job_id)},
            set_fields={"updated_at": clock.now()},
            add_to_sets={lost_attr(rank.attempt): member},
            delete_from_sets={hung_attr(rank.attempt): member} if rank.state is RankState.HUNG else {},
            condition=condition, condition_values=values, condition_names=names,
        )
        return self.tables.db.transact([rank_update, job_update])

    def record_disconnected(self, rank: Rank, seen_at: float, hand_over_by: float,
                            job_state: JobState = JobState.NODE_LOST) -> bool:
        """The first reading of a lost node's ECS agent disconnected, on the job's first lost
        rank there (the intent: a later sweep visit that reads it disconnected again decides),
        and the job's ``heartbeat_escalate_at`` moved to ``hand_over_by`` (the recovery
        sweep's backstop waits for that visit); only while the rank is as read (NODE_LOST, or a
        suspension's rank STOP_REQUESTED, still watched) and its job in ``job_state`` as read
        (NODE_LOST, or SUSPENDING: no backstop moved, its suspension's own deadline is the
        sweep's)."""
        if job_state not in (JobState.NODE_LOST, JobState.SUSPENDING):
            raise ValueError(f"a lost node's reading is kept for a NODE_LOST or SUSPENDING job, "
                             f"not {job_state.value}")
        if rank.state not in LOST_RANK_STATES:
            raise ValueError(f"a lost node's reading is kept on a NODE_LOST or STOP_REQUESTED rank, "
                             f"not {rank.state.value}")
        rank_update = self.base.jobs.rank_update(rank, rank.state, from_states=[rank.state],
                                                 set_fields={DISCONNECTED_SEEN: seen_at}, keep_watched=True)
        fields: dict[str, Any] = {"updated_at": clock.now()}
        if job_state is JobState.NODE_LOST:
            fields["heartbeat_escalate_at"] = hand_over_by
        job_update = Update(
            table=self.tables.job_table_name, key={JOB_PK: job_item_key(rank.job_id)},
            set_fields=fields,
            condition="#att = :att AND #js = :js",
            condition_values={":att": rank.attempt, ":js": job_state.value},
            condition_names={"#att": "attempt", "#js": "job_state"},
        )
        return self.tables.db.transact([rank_update, job_update])

    def forget_disconnected(self, rank: Rank) -> bool:
        """The node's ECS agent read connected again: its earlier disconnected reading no longer
        counts (the next one starts over)."""
        update = self.base.jobs.rank_update(rank, rank.state, from_states=[rank.state], keep_watched=True)
        update.remove_fields.append(DISCONNECTED_SEEN)
        return self.tables.db.apply(update)

    def unwatch_rank(self, rank: Rank) -> bool:
        """Drop a rank from the heartbeat index (its job no longer needs watching)."""
        return self.tables.db.apply(Update(
            table=self.tables.job_table_name, key={JOB_PK: rank_item_key(rank.job_id, rank.rank)},
            remove_fields=[HB_PK],
            condition="#t = :t AND attribute_exists(#hb)",
            condition_values={":t": rank.task_arn},
            condition_names={"#t": JOB_BY_TASK_PK, "#hb": HB_PK},
        ))

    # ------------------------------------------------------------------- jobs
    def settle_job(self, job_id: str, attempt: int, source: JobState, target: JobState,
                   requires: str, reason: str, actor: str, *, deadline_at: float | None = None,
                   escalate_at: float | None = None) -> bool:
        """One step of a job following its lost / hung rank sets (see SETTLE_CONDITIONS).
        A job leaving RUNNING keeps ``deadline_at`` in the deadline index (the recovery
        sweep's backstop: ``escalate_at`` is when the heartbeat sweep should have handed it
        to the recovery loop, None: never); back to RUNNING, it leaves the index."""
        condition = SETTLE_CONDITIONS[requires]
        names = {k: v for k, v in (("#lost", lost_attr(attempt)), ("#hung", hung_attr(attempt)))
                 if k in condition}
        fields: dict[str, Any] = {}
        remove: list[str] = []
        if target is JobState.RUNNING:
            remove = [*DEADLINE_ATTRIBUTES, "heartbeat_escalate_at"]
        elif deadline_at is not None:
            fields = {**self.base.jobs.job_deadline_fields(deadline_at), "heartbeat_escalate_at": escalate_at}
        return self.tables.db.apply(self.base.jobs.job_transition(
            job_id, target, from_states=[source], attempt=attempt, reason=reason, actor=actor,
            set_fields=fields, remove_fields=remove, extra_condition=condition, extra_names=names))

    # A node lost with its agent disconnected is a node decision of the recovery loop
    # (``NodeDecisionRepository.record`` with ``lost_job_failure``): the breaker and observe
    # mode apply to its quarantine like to any other.


def heartbeat_index_fields(job_id: str, rank: int, at: float, slot_seconds: int,
                           shards: int = HB_SHARDS) -> dict[str, Any]:
    """What a heartbeat at ``at`` sets on a rank item: the exact time and the rank's place in
    the heartbeat index (its shard of ``shards``, the slot ``at`` falls in)."""
    shard = heartbeat_shard(job_id, rank, shards)
    return {HB_AT: at, HB_PK: _shard_key(shard), HB_SK: heartbeat_slot(at, slot_seconds, shard, shards)}


def _shard_key(shard: int) -> str:
    return f"{HB_BUCKET}#{shard:02d}"
