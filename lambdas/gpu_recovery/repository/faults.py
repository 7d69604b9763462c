"""A fault's records: one item per suspect node, counts on the job item.

A suspect item (``<job>#S#a<attempt>#<node>``) holds the node's verdict for the job, the
evidence and decision of its fault, and the ranks that failed there; it is opened once
(idempotent) and decided once (``PENDING`` -> a label, in the same transaction as the
job's tally). The job item carries only the tally (``fault``: decided, fatal, reboot,
rebooting, total), so it never grows with the number of checked nodes. A healthy verdict
that changes nothing else on the job is counted off the job item, after its transaction, on
one of the fault's tally shards (``<job>#T#a<attempt>#<shard>``, picked by the node; as many
as ``domain.fault_tally.tally_shard_count`` gives for the job's size): its node is added to
the shard's set with a plain UpdateItem, so a retry or a lost response never counts it
twice, and thousands of verdicts at once never conflict (no transaction touches a shard).
The suspect records that it is counted there (``counted_on_shard``): a verdict whose writer
died before counting is counted by the sweep (:meth:`recount`). Whoever needs the complete
count (the restart's gate, the conclusion of an all-healthy fault, the verdicts once every
rank ended) adds the shards (:meth:`counted`, one BatchGetItem, strongly consistent); each
verdict counts before it settles the job, so the last one to count sees every count. A gang restart
that moves ranks off unusable nodes writes its moves on a placement item
(``<job>#P#a<attempt>``) in the claim's transaction.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpu_recovery.constants import (
    DEADLINE_BUCKET,
    DEADLINE_PK,
    DEADLINE_SK,
    INSTANCE_PK,
    JOB_BY_JOB_INDEX,
    JOB_BY_JOB_PK,
    JOB_BY_JOB_SK,
    JOB_PK,
    fault_tally_shard_key,
    job_item_key,
    placement_item_key,
    suspect_item_key,
    suspect_key_prefix,
)
from gpu_recovery.domain.fault_tally import tally_shard_count
from gpu_recovery.domain.models import Instance, Job, Suspect
from gpu_recovery.domain.shards import stable_shard
from gpu_recovery.domain.states import InstanceState, SuspectVerdict
from gpu_recovery.repository.base import Update, from_ddb

# The most moves one relocation may record: its placement item stays far below 64 KB.
MAX_MOVED_NODES = 64


def suspect_from_item(item: Mapping[str, Any]) -> Suspect:
    item = from_ddb(dict(item))
    return Suspect(
        job_id=str(item["job_id"]), attempt=int(item.get("attempt") or 0), node=str(item.get("node") or ""),
        verdict=SuspectVerdict(item.get("verdict") or SuspectVerdict.PENDING.value),
        findings=dict(item.get("findings") or {}), record=dict(item.get("record") or {}),
        ranks={int(r) for r in item.get("ranks") or ()}, opened_at=float(item.get("opened_at") or 0.0),
        rebooting=bool(item.get("rebooting", False)),
        counted_on_shard=str(item.get("counted_on_shard") or ""),
        validation=dict(item.get("validation") or {}))


class FaultRepository:
    def __init__(self, base: Any) -> None:
        self.base = base  # Repository
        self.table = base.job_table_name

    # ------------------------------------------------------------------ suspects
    def open_suspect(self, job_id: str, attempt: int, node: str, *, rank: int | None, record: dict[str, Any],
                     now: float, retry_at: float) -> Suspect:
        """Open (or find) the node's suspect item of the attempt's fault and add ``rank`` to
        the ranks that failed there. Idempotent; the first record of the fault is kept. Until
        its health check is asked for (:meth:`health_check_requested`) it carries a deadline,
        so the sweep asks for it if this delivery dies."""
        update = Update(
            table=self.table, key={JOB_PK: suspect_item_key(job_id, attempt, node)},
            set_if_absent={"item_type": "SUSPECT", JOB_BY_JOB_PK: job_id, "attempt": attempt, "node": node,
                           "verdict": SuspectVerdict.PENDING.value, "opened_at": now, "record": record,
                           DEADLINE_PK: DEADLINE_BUCKET, DEADLINE_SK: retry_at},
            add_to_sets={"ranks": {rank}} if rank is not None else {})
        written = self.base.db.apply_returning(update, returning="ALL_NEW") or {}
        return suspect_from_item({**written, JOB_BY_JOB_PK: job_id})

    def fence_suspect(self, node: str, fence: dict[str, Any]) -> bool:
        """The node out of the stack's placements until it is judged (``Instance.suspect_fence``,
        lifted by its decision, as a rank's stop fences it): a fence already there is kept, a
        node without an item is not created. False: nothing written."""
        return bool(self.base.db.apply(self.base.instance_update(
            node, set_fields={"suspect_fence": dict(fence)},
            extra_condition="attribute_exists(#ik) AND attribute_not_exists(#sf)",
            extra_names={"#ik": INSTANCE_PK, "#sf": "suspect_fence"})))

    def health_check_requested(self, suspect: Suspect) -> bool:
        """Its health check is open (or its verdict known): the sweep need not ask again."""
        return self.base.db.apply(Update(
            table=self.table, key={JOB_PK: suspect_item_key(suspect.job_id, suspect.attempt, suspect.node)},
            remove_fields=[DEADLINE_PK, DEADLINE_SK], condition="attribute_exists(#dl)",
            condition_names={"#dl": DEADLINE_SK}))

    def rearm_suspect(self, suspect: Suspect, deadline_at: float) -> bool:
        return self.base.db.apply(Update(
            table=self.table, key={JOB_PK: suspect_item_key(suspect.job_id, suspect.attempt, suspect.node)},
            set_fields={DEADLINE_PK: DEADLINE_BUCKET, DEADLINE_SK: deadline_at},
            condition="attribute_exists(#dl)", condition_names={"#dl": DEADLINE_SK}))

    def get_suspect(self, job_id: str, attempt: int, node: str) -> Suspect | None:
        item = self.base.db.get(self.table, {JOB_PK: suspect_item_key(job_id, attempt, node)})
        return suspect_from_item(item) if item else None

    def suspects(self, job_id: str, attempt: int, *, limit: int | None = None) -> list[Suspect]:
        """The attempt's suspects (by the job's index, then by key), at most ``limit``."""
        keys = list(self._suspect_keys(job_id, attempt, limit))
        if not keys:
            return []
        items = self.base.db.batch_get(self.table, [{JOB_PK: k} for k in keys])
        return sorted((suspect_from_item(i) for i in items), key=lambda s: s.node)

    def _suspect_keys(self, job_id: str, attempt: int, limit: int | None) -> Iterator[str]:
        kwargs: dict[str, Any] = {
            "IndexName": JOB_BY_JOB_INDEX,
            "KeyConditionExpression": "#j = :j AND begins_with(#k, :p)",
            "ExpressionAttributeNames": {"#j": JOB_BY_JOB_PK, "#k": JOB_BY_JOB_SK},
            "ExpressionAttributeValues": {":j": job_id, ":p": suspect_key_prefix(job_id, attempt)},
        }
        found = 0
        while True:
            if limit is not None:
                kwargs["Limit"] = max(1, min(1000, limit - found))
            page = self.base.db.query_page(self.table, **kwargs)
            for item in page.get("Items", []):
                yield str(item[JOB_PK])
                found += 1
                if limit is not None and found >= limit:
                    return
            if "LastEvaluatedKey" not in page:
                return
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def labels(self, job: Job, attempt: int | None = None) -> dict[str, str]:
        """node -> label of the attempt's suspects (operators' views and tests)."""
        return {s.node: s.verdict.value for s in self.suspects(job.job_id, attempt or job.tally.attempt
                                                                 or job.attempt)}

    def records(self, job: Job, attempt: int) -> dict[str, dict[str, Any]]:
        """node -> the evidence and decision of the fault of ``attempt`` (its suspects, and
        the single node of a fault that needed none), for operators' views."""
        found = {s.node: {**s.record, "label": s.verdict.value, "findings": s.findings}
                 for s in self.suspects(job.job_id, attempt)}
        last = job.last_fault
        if last and int(last.get("attempt") or 0) == attempt and last.get("node"):
            found.setdefault(str(last["node"]), dict(last))
        return found

    # ------------------------------------------------------------------- tally
    def record_total(self, job: Job, total: int) -> Job | None:
        """Every rank of the fault's attempt ended: the number of suspects is final. Returns
        the job as written (None: not this fault, or known already)."""
        written = self.base.db.apply_returning(Update(
            table=self.table, key={JOB_PK: job_item_key(job.job_id)},
            set_fields={"fault.total": total},
            condition="#f.#a = :a AND attribute_not_exists(#f.#t)",
            condition_values={":a": job.tally.attempt},
            condition_names={"#f": "fault", "#a": "attempt", "#t": "total"}))
        return self.base.job_from_item(written) if written else None

    def note_exit(self, job: Job, exits: Sequence[float]) -> bool:
        """The fault's first exits (``FaultTally.exits``) as a later suspect's stop makes them.
        Unconditional but for the fault: two suspects writing at once may lose one's time,
        which only makes a later exit a suspect too (``domain.suspects.coupled``)."""
        return self.base.db.apply(Update(
            table=self.table, key={JOB_PK: job_item_key(job.job_id)},
            set_fields={"fault.exits": list(exits)}, condition="#f.#a = :a",
            condition_values={":a": job.tally.attempt}, condition_names={"#f": "fault", "#a": "attempt"}))

    def escalate(self, job: Job, total: int) -> Job | None:
        """The fault's checks found nothing: its coupled nodes are checked too, ``total`` raised
        to count them (once: the count it was read at). Returns the job as written (None: not
        this fault, or raised already)."""
        written = self.base.db.apply_returning(Update(
            table=self.table, key={JOB_PK: job_item_key(job.job_id)},
            set_fields={"fault.total": total, "fault.escalated": True},
            condition="#f.#a = :a AND #f.#t = :t AND attribute_not_exists(#f.#e)",
            condition_values={":a": job.tally.attempt, ":t": job.tally.total},
            condition_names={"#f": "fault", "#a": "attempt", "#t": "total", "#e": "escalated"}))
        return self.base.job_from_item(written) if written else None

    def count_healthy(self, job: Job, node: str, kind: str) -> None:
        """A healthy verdict that changes nothing else on the job (its suspect decided and
        marked ``counted_on_shard`` in the verdict's transaction), counted on its tally shard:
        ``node`` added to the shard's sets. Idempotent; no transaction, so no conflict."""
        adds: dict[str, set[Any]] = {"decided_nodes": {node}}
        if kind in ("infra", "undiagnosed"):  # ``JobVerdict.shard_kind``: healthy, infra or undiagnosed
            adds[f"{kind}_nodes"] = {node}
        self.base.db.apply(Update(table=self.table, key=self._tally_shard_key(job, self._shard_of(job, node)),
                                  set_fields={"item_type": "TALLY_SHARD"}, add_to_sets=adds))

    def counted(self, job: Job) -> Job:
        """``job`` with the verdicts counted on its fault's tally shards added to its tally,
        when they can matter: every rank ended (the suspects are counted) and the job item
        alone does not account for every suspect. One BatchGetItem, strongly consistent."""
        tally = job.tally
        if not job.in_fault or tally.total is None or tally.decided >= tally.total:
            return job
        shards = self._shard_items(job)
        # A fault in flight across an upgrade: the release before counted plain numbers
        # (``decided``, ``infra``) on the same keys; they still count.
        decided = sum(len(i.get("decided_nodes") or ()) + int(i.get("decided") or 0) for i in shards.values())
        infra = sum(len(i.get("infra_nodes") or ()) + int(i.get("infra") or 0) for i in shards.values())
        undiagnosed = sum(len(i.get("undiagnosed_nodes") or ()) for i in shards.values())
        return replace(job, tally=replace(tally, shard_decided=decided, shard_infra=infra,
                                          shard_undiagnosed=undiagnosed))

    def recount(self, job: Job) -> int:
        """The sweep's repair for a fault whose count is short: every suspect decided healthy
        and marked counted on a shard that its shard does not hold (its writer died between
        the verdict's transaction and the count) is counted now. Reads the attempt's suspects:
        only for a job still waiting, once a sweep. Returns how many were missing."""
        owed = [s for s in self.suspects(job.job_id, job.tally.attempt or job.attempt)
                if s.counted_on_shard and not s.pending]
        if not owed:
            return 0
        shards = self._shard_items(job)
        counted = {node for item in shards.values() for node in item.get("decided_nodes") or ()}
        missing = [s for s in owed if s.node not in counted]
        for suspect in missing:
            self.count_healthy(job, suspect.node, suspect.counted_on_shard)
        return len(missing)

    def _shard_items(self, job: Job) -> dict[int, dict[str, Any]]:
        """shard -> its item, for every tally shard of ``job``'s fault (one BatchGetItem)."""
        keys = [self._tally_shard_key(job, shard) for shard in range(tally_shard_count(job.world_size))]
        items = self.base.db.batch_get(self.table, keys)
        return {int(str(i[JOB_PK]).rsplit("#", 1)[1]): i for i in items}

    @staticmethod
    def _shard_of(job: Job, node: str) -> int:
        return stable_shard(node, tally_shard_count(job.world_size))

    @staticmethod
    def _tally_shard_key(job: Job, shard: int) -> dict[str, Any]:
        """The key of ``shard`` of the tally's shards: the tally's fault attempt, for the
        writer (``count_healthy``) and the readers (``counted``, ``recount``) alike."""
        return {JOB_PK: fault_tally_shard_key(job.job_id, job.tally.attempt, shard)}

    @staticmethod
    def tally_condition(job: Job) -> tuple[str, dict[str, Any], dict[str, str]]:
        """The tally exactly as read: a concurrent verdict (or the total) makes the write
        fail, and the writer decides again on fresh counts."""
        tally = job.tally
        names = {"#tf": "fault", "#ta": "attempt", "#td": "decided", "#tt": "total"}
        values: dict[str, Any] = {":ta": tally.attempt, ":td": tally.decided}
        condition = "#tf.#ta = :ta AND #tf.#td = :td AND "
        if tally.total is None:
            condition += "attribute_not_exists(#tf.#tt)"
        else:
            condition += "#tf.#tt = :tt"
            values[":tt"] = tally.total
        return condition, values, names

    def decide_suspect(self, job: Job, node: str, label: SuspectVerdict, *, findings: Mapping[str, Any],
                       record: Mapping[str, Any] | None, rebooting: bool, now: float,
                       counted_on_shard: str = "") -> Update:
        """PENDING -> ``label`` on the suspect item, exactly once (in the verdict's transaction;
        ``counted_on_shard``: the verdict is counted on a tally shard after it, see
        :meth:`count_healthy`)."""
        fields: dict[str, Any] = {"verdict": label.value, "findings": dict(findings), "decided_at": now,
                                  "rebooting": rebooting}
        if counted_on_shard:
            fields["counted_on_shard"] = counted_on_shard
        if record is not None:
            fields["record"] = dict(record)
        return Update(
            table=self.table, key={JOB_PK: suspect_item_key(job.job_id, job.attempt, node)},
            set_fields={**fields, "item_type": "SUSPECT", JOB_BY_JOB_PK: job.job_id, "attempt": job.attempt,
                        "node": node},
            remove_fields=[DEADLINE_PK, DEADLINE_SK],
            condition="attribute_not_exists(#v) OR #v = :pending",
            condition_values={":pending": SuspectVerdict.PENDING.value}, condition_names={"#v": "verdict"})

    def verdict_after_leaving(self, instance: Instance, findings: Mapping[str, Any] | None,
                              node_state: InstanceState, now: float) -> list[Update]:
        """The node's verdict on the LEFT suspects of the jobs that left it before it (in the
        node decision's transaction): the job's record says what the node turned out to be.
        Unconditional: nothing may keep the node's own decision from landing."""
        updates = []
        for job_id, attempt in instance.left_jobs:
            updates.append(Update(
                table=self.table, key={JOB_PK: suspect_item_key(job_id, attempt, instance.container_inst_id)},
                set_fields={"after_leaving": {"at": now, "node_state": node_state.value,
                                              "findings": dict(findings or {})}}))
        return updates

    def relabel_suspect(self, job: Job, node: str, label: SuspectVerdict, *,
                        rebooting: bool = False) -> Update:
        """A decided node's label changes (its reboot timed out): no count moves."""
        return Update(
            table=self.table, key={JOB_PK: suspect_item_key(job.job_id, job.attempt, node)},
            set_fields={"verdict": label.value, "rebooting": rebooting, "item_type": "SUSPECT",
                        JOB_BY_JOB_PK: job.job_id, "attempt": job.attempt, "node": node},
            remove_fields=[DEADLINE_PK, DEADLINE_SK])

    def node_back(self, job: Job, node: str) -> Update:
        """The rebooted node the job waited for is back: it no longer holds the restart."""
        return Update(
            table=self.table, key={JOB_PK: suspect_item_key(job.job_id, job.attempt, node)},
            set_fields={"rebooting": False}, condition="#r = :t",
            condition_values={":t": True}, condition_names={"#r": "rebooting"})

    def tally_back(self, job: Job) -> Update:
        return Update(
            table=self.table, key={JOB_PK: job_item_key(job.job_id)},
            increments={"fault.rebooting": -1}, condition="#f.#a = :a AND #att = :att",
            condition_values={":a": job.tally.attempt, ":att": job.attempt},
            condition_names={"#f": "fault", "#a": "attempt", "#att": "attempt"})

    # --------------------------------------------------------------- placement
    def placement_update(self, job_id: str, attempt: int, moves: Mapping[str, Mapping[str, str]],
                         reason: str) -> Update:
        """The moves of the gang restart that starts ``attempt`` (node -> target), written in
        the claim's transaction, read by every launch batch."""
        if len(moves) > MAX_MOVED_NODES:
            raise ValueError(f"a relocation moves at most {MAX_MOVED_NODES} nodes, not {len(moves)}")
        return Update(
            table=self.table, key={JOB_PK: placement_item_key(job_id, attempt)},
            set_fields={"item_type": "PLACEMENT", "moves": {k: dict(v) for k, v in moves.items()},
                        "reason": reason[:500]},
            condition="attribute_not_exists(#k)", condition_names={"#k": JOB_PK})

    def move_again(self, job_id: str, attempt: int, leaving: str, taken: str,
                   move: Mapping[str, str]) -> bool:
        """The restart's ranks of ``leaving`` moved to ``move`` instead of ``taken``, their target
        another scheduler took (False: the move no longer names ``taken``: moved already)."""
        return self.base.db.apply(Update(
            table=self.table, key={JOB_PK: placement_item_key(job_id, attempt)},
            set_fields={f"moves.{leaving}": dict(move)}, condition="#m.#l.#n = :taken",
            condition_values={":taken": taken}, condition_names={"#m": "moves", "#l": leaving, "#n": "node"}))

    def placement(self, job_id: str, attempt: int) -> dict[str, dict[str, str]]:
        item = self.base.db.get(self.table, {JOB_PK: placement_item_key(job_id, attempt)}) or {}
        return {str(k): {str(a): str(b) for a, b in dict(v).items()}
                for k, v in dict(from_ddb(item).get("moves") or {}).items()}
