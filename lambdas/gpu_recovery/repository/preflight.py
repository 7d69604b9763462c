"""The gang preflight's items: one per attempt that runs it, and the fleet's baselines.

* ``<job>#PF#a<attempt>`` (job table, ``item_type`` PREFLIGHT): its status (running,
  passed, pinned, inconclusive, abandoned), its round with the round's tests (spans of node
  numbers, a handful) and results, the thresholds it judges by, the search's state, a line
  per round, and, once pinned, the nodes handed to the recovery loop. In the ``by-deadline``
  index while a round runs (its bound) and while a pin is not handed over yet: the sweep
  finishes a round nobody reported, or a handover whose delivery died. Nothing on it grows
  with the job: the loopback results are on each rank's own item, and counted by the
  attempt's latch (``Latch.PREFLIGHT``); only failed loopbacks' ranks are listed (a few:
  more is the fabric, and the search stops).
* ``PREFLIGHT_BASELINE#<node class>#<nodes>`` (instance table): each user's last passing
  runs' busbw, for the users who taught it last (``domain.preflight.baseline``: a few KB,
  whatever the number of users or ranks), learned in the transaction that concludes a
  passing preflight, conditional on the version read: a run is learned once, and two jobs
  learning at once never lose a sample. An item of the old shape (user-less ``samples``) is
  rewritten in the new one, its old attributes removed, by the first run learned.

Every change is conditional on the status and the round it was decided on: a duplicate
report, a late one of an earlier round, two invocations concluding the same round, all
race on the condition and exactly one wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpu_recovery.constants import (
    INSTANCE_PK,
    JOB_PK,
    PREFLIGHT_BASELINE_PREFIX,
    preflight_item_key,
    rank_item_key,
)
from gpu_recovery.domain.preflight.baseline import Baseline, sizes_of
from gpu_recovery.repository.base import DEADLINE_ATTRIBUTES, Update, from_ddb, to_ddb

PREFLIGHT_ITEM_TYPE = "PREFLIGHT"


def preflight_baseline_key(node_class: str, nodes: int) -> str:
    """The learned busbw of (node class, node count), an item of the instance table."""
    return f"{PREFLIGHT_BASELINE_PREFIX}{node_class}#{nodes}"


BASELINE_ITEM_TYPE = "PREFLIGHT_BASELINE"
RUNNING, PASSED, PINNED, INCONCLUSIVE, ABANDONED = "running", "passed", "pinned", "inconclusive", "abandoned"
# The loopbacks failed alike on every node: the job's own image or code, not a node (issue 49).
JOB_FAULT = "job_fault"
MAX_SUMMARY_LINES = 40
MAX_LISTED = 8  # failed loopbacks listed on the item (more: the search stops anyway)
# A baseline item's attributes from before its runs were kept per user (issue 49).
_OLD_BASELINE_FIELDS = ("samples", "sample_ids")


class PreflightRepository:
    def __init__(self, base: Any) -> None:
        self.base = base  # Repository
        self.table = base.job_table_name
        self.instances = base.instance_table_name

    # ------------------------------------------------------------------ reads
    def get(self, job_id: str, attempt: int) -> dict[str, Any] | None:
        item = self.base.db.get(self.table, {JOB_PK: preflight_item_key(job_id, attempt)})
        return from_ddb(item) if item else None

    def rank_items(self, job_id: str, ranks: Iterable[int]) -> dict[int, dict[str, Any]]:
        """The rank items of ``ranks`` (a few: group leaders, pinned nodes), by rank."""
        keys = [{JOB_PK: rank_item_key(job_id, r)} for r in sorted(set(ranks))]
        found = self.base.db.batch_get(self.table, keys) if keys else []
        return {int(from_ddb(i)["rank"]): from_ddb(i) for i in found if "rank" in i}

    def baselines(self, node_class: str, counts: Iterable[int]) -> dict[int, Baseline]:
        """The baselines of ``node_class`` at ``counts`` nodes (empty ones for those never learned)."""
        wanted = sizes_of(counts)
        keys = [{INSTANCE_PK: preflight_baseline_key(node_class, n)} for n in wanted]
        found = {str(i[INSTANCE_PK]): from_ddb(i) for i in (self.base.db.batch_get(self.instances, keys)
                                                              if keys else [])}
        return {n: Baseline.from_item(found.get(preflight_baseline_key(node_class, n)), node_class, n)
                for n in wanted}

    # ------------------------------------------------------------------ writes
    def start(self, job_id: str, attempt: int, fields: Mapping[str, Any], deadline_at: float) -> bool:
        """The preflight of ``attempt`` begins (round 1); False when it exists already."""
        item = {JOB_PK: preflight_item_key(job_id, attempt), "item_type": PREFLIGHT_ITEM_TYPE,
                "pf_job_id": job_id, "attempt": attempt, "status": RUNNING, "round": 1, "results": {},
                **fields, **self.base.job_deadline_fields(deadline_at)}
        return bool(self.base.db.put_if_absent(self.table, _dynamo(item), JOB_PK))

    def record_loopback(self, job_id: str, attempt: int, rank: int, verdict: Mapping[str, Any], *,
                        failed: bool) -> bool:
        """A failed loopback (round 1): its rank and why, on the preflight's short list (at
        most ``MAX_LISTED``: more is the fabric, and the search stops there); rank 0's passing
        loopback, the one loopback learned. Idempotent; the rank's arrival and address are
        its latch's (``LatchRepository.arrive``)."""
        if not failed and rank != 0:
            return True
        if failed:
            cond, values, names = _at_parts(RUNNING, 1)
            names["#lf"] = "loopback_failed"
            values[":cap"] = MAX_LISTED
            entry = f"{rank}|{verdict.get('outcome') or ''!s}|{str(verdict.get('reason') or '')[:160]}"
            return self.base.db.apply(Update(
                table=self.table, key={JOB_PK: preflight_item_key(job_id, attempt)},
                add_to_sets={"loopback_failed": {entry}},
                condition=f"{cond} AND (attribute_not_exists(#lf) OR size(#lf) < :cap)",
                condition_values=values, condition_names=names))
        return self.base.db.apply(Update(
            table=self.table, key={JOB_PK: preflight_item_key(job_id, attempt)},
            set_fields={"rank0_loopback": dict(verdict)}, **_at(RUNNING, 1)))

    def open_gang(self, job_id: str, attempt: int, deadline_at: float, now: float) -> bool:
        """Every loopback arrived: the gang all-reduce may start, with a bound of its own."""
        cond, values, names = _at_parts(RUNNING, 1)
        names["#gr"] = "gang_ready"
        return self.base.db.apply(Update(
            table=self.table, key={JOB_PK: preflight_item_key(job_id, attempt)},
            set_fields={"gang_ready": True, "gang_opened_at": now, "round_started_at": now,
                        **self.base.job_deadline_fields(deadline_at)},
            condition=f"{cond} AND attribute_not_exists(#gr)", condition_values=values,
            condition_names=names))

    def record_result(self, job_id: str, attempt: int, round_: int, test_id: str,
                      verdict: Mapping[str, Any]) -> bool:
        """A group's result; False when the round moved on or the test was reported already."""
        cond, values, names = _at_parts(RUNNING, round_)
        names["#res"] = "results"
        names["#tid"] = test_id
        return self.base.db.apply(Update(
            table=self.table, key={JOB_PK: preflight_item_key(job_id, attempt)},
            set_fields={f"results.{test_id}": dict(verdict)},
            condition=f"{cond} AND attribute_not_exists(#res.#tid)", condition_values=values,
            condition_names=names))

    def next_round(self, job_id: str, attempt: int, from_round: int, *, tests: Sequence[Mapping[str, Any]],
                   thresholds: Mapping[str, Any], pin: Mapping[str, Any], summary: Sequence[str],
                   now: float, deadline_at: float) -> bool:
        """Round ``from_round`` judged: the next one's tests, thresholds and bound."""
        return self.base.db.apply(Update(
            table=self.table, key={JOB_PK: preflight_item_key(job_id, attempt)},
            set_fields={"round": from_round + 1, "round_started_at": now, "tests": [dict(t) for t in tests],
                        "thresholds": dict(thresholds), "results": {}, "pin": dict(pin),
                        "summary": list(summary)[-MAX_SUMMARY_LINES:],
                        **self.base.job_deadline_fields(deadline_at)},
            **_at(RUNNING, from_round)))

    def conclude(self, job_id: str, attempt: int, from_round: int, status: str, *, verdict: str,
                 summary: Sequence[str], now: float, pin: Mapping[str, Any] | None = None,
                 pinned: Sequence[Mapping[str, Any]] = (), handover_at: float | None = None,
                 learned: Sequence[Baseline] = ()) -> bool:
        """The preflight ends (passed, pinned, inconclusive), and the baselines it teaches, in
        one transaction. A pin keeps a deadline until it is handed over."""
        fields: dict[str, Any] = {"status": status, "verdict": verdict[:1000], "concluded_at": now,
                                  "summary": list(summary)[-MAX_SUMMARY_LINES:]}
        if pin is not None:
            fields["pin"] = dict(pin)
        if pinned:
            fields.update(pinned=[dict(p) for p in pinned], handed_over=False)
        remove: list[str] = []
        if handover_at is not None:
            fields.update(self.base.job_deadline_fields(handover_at))
        else:
            remove = list(DEADLINE_ATTRIBUTES)
        updates = [Update(table=self.table, key={JOB_PK: preflight_item_key(job_id, attempt)},
                          set_fields=fields, remove_fields=remove, **_at(RUNNING, from_round))]
        updates += [self._learn(b) for b in learned]
        return self.base.db.transact(updates) if len(updates) > 1 else self.base.db.apply(updates[0])

    def handed_over(self, job_id: str, attempt: int, now: float) -> bool:
        """The pinned nodes are the recovery loop's now (or the job told its own preflight
        failed): out of the deadline index."""
        return self.base.db.apply(Update(
            table=self.table, key={JOB_PK: preflight_item_key(job_id, attempt)},
            set_fields={"handed_over": True, "handed_over_at": now},
            remove_fields=list(DEADLINE_ATTRIBUTES),
            condition="#st IN (:st, :jf)", condition_values={":st": PINNED, ":jf": JOB_FAULT},
            condition_names={"#st": "status"}))

    def abandon(self, job_id: str, attempt: int, why: str, now: float) -> bool:
        """The job moved on (another fault, canceled, a newer attempt): nothing more to do."""
        return self.base.db.apply(Update(
            table=self.table, key={JOB_PK: preflight_item_key(job_id, attempt)},
            set_fields={"status": ABANDONED, "verdict": why[:500], "concluded_at": now},
            remove_fields=list(DEADLINE_ATTRIBUTES),
            condition="#st = :st", condition_values={":st": RUNNING}, condition_names={"#st": "status"}))

    def settle(self, job_id: str, attempt: int) -> bool:
        """A concluded preflight out of the deadline index (nothing is due)."""
        return self.base.db.apply(Update(
            table=self.table, key={JOB_PK: preflight_item_key(job_id, attempt)},
            remove_fields=list(DEADLINE_ATTRIBUTES),
            condition="#st <> :st", condition_values={":st": RUNNING}, condition_names={"#st": "status"}))

    def rearm(self, job_id: str, attempt: int, deadline_at: float) -> bool:
        return self.base.db.apply(Update(
            table=self.table, key={JOB_PK: preflight_item_key(job_id, attempt)},
            set_fields=self.base.job_deadline_fields(deadline_at),
            condition="attribute_exists(#k)", condition_names={"#k": JOB_PK}))

    def _learn(self, baseline: Baseline) -> Update:
        """The baseline as learned, conditional on the version it was read at."""
        if baseline.version <= 1:
            condition, values = "attribute_not_exists(#ver) OR #ver = :prev", {":prev": 0}
        else:
            condition, values = "#ver = :prev", {":prev": baseline.version - 1}
        return Update(
            table=self.instances,
            key={INSTANCE_PK: preflight_baseline_key(baseline.node_class, baseline.nodes)},
            set_fields={"item_type": BASELINE_ITEM_TYPE, **baseline.to_item()},
            remove_fields=list(_OLD_BASELINE_FIELDS), condition=condition, condition_values=values,
            condition_names={"#ver": "version"})


def _at_parts(status: str, round_: int) -> tuple[str, dict[str, Any], dict[str, str]]:
    return ("#st = :st AND #rd = :rd", {":st": status, ":rd": round_}, {"#st": "status", "#rd": "round"})


def _at(status: str, round_: int) -> dict[str, Any]:
    condition, values, names = _at_parts(status, round_)
    return {"condition": condition, "condition_values": values, "condition_names": names}


def _dynamo(item: Mapping[str, Any]) -> dict[str, Any]:
    return dict(to_ddb(dict(item)))
