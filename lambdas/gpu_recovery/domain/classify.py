"""Evidence + fault catalog (+ the node's fault history) -> a decision. Pure.

Call it twice per fault:

* before the health check (``evidence.dcgm is None``): the decision is the action itself
  (application error, restart, none), a definitive node action that skips the DCGM diag
  (``skip_health_check``), or ``health_check`` when the diag must decide;
* after it (``evidence.with_dcgm(...)``): rules on DCGM results, definitive rules and the
  mild ones (none / application error / restart job) compete; rules that only asked for the
  diag have had their answer.

Among the rules that match, the highest ``priority`` wins, then the most severe action, then
a definitive rule (``skip_health_check``), then the earlier rule in the catalog. Rules whose
action is ``none`` are informational: they are noted but never decide a fault.

``reset_as_reboot`` (a deployment that cannot reset GPUs yet): a ``reset_gpu`` rule competes
and decides as ``reboot``, exactly as before the action existed, with a note saying so.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpu_recovery.domain.escalation import NodeFaultRecord
from gpu_recovery.domain.evidence import Evidence, XidEvent
from gpu_recovery.domain.evidence_sources import exceeds
from gpu_recovery.domain.fault_catalog import CatalogRule, FaultCatalog
from gpu_recovery.domain.fault_vocabulary import (
    ACTION_SEVERITY,
    DCGM_VERDICT_FALLBACK,
    DEFAULT_BUDGET,
    NODE_ACTIONS,
    Action,
    Budget,
    Trigger,
)

UNMATCHED_RULE = "default:unmatched"
RESET_AS_REBOOT_NOTE = ("the catalog says reset_gpu; carried out as a reboot: no GPU-reset stage in "
                        "this deployment yet (a reboot resets the GPUs too)")
FALLBACK_RULE_PREFIX = "builtin:dcgm-verdict-"
MILD_ACTIONS = frozenset({Action.NONE, Action.APPLICATION_ERROR, Action.RESTART_JOB})


@dataclass(frozen=True)
class Decision:
    action: Action
    rule_id: str  # the catalog rule that decided; also the "cause" escalation counts by
    reason: str
    budget: Budget  # which job budget the fault spends
    skip_health_check: bool = False  # a definitive rule: act without the DCGM diag
    after_health_check: bool = False
    expected_action: Action | None = None  # health_check: what the matching rule expects
    repeated: bool = False  # a repeat rule changed the action
    matched_rules: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def cause(self) -> str:
        return self.rule_id

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action.value, "rule_id": self.rule_id, "reason": self.reason,
                "budget": self.budget.value, "skip_health_check": self.skip_health_check,
                "after_health_check": self.after_health_check,
                "expected_action": self.expected_action.value if self.expected_action else None,
                "repeated": self.repeated, "matched_rules": list(self.matched_rules),
                "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Decision:
        expected = raw.get("expected_action")
        return cls(action=Action(raw["action"]), rule_id=str(raw["rule_id"]), reason=str(raw["reason"]),
                   budget=Budget(raw["budget"]), skip_health_check=bool(raw.get("skip_health_check")),
                   after_health_check=bool(raw.get("after_health_check")),
                   expected_action=Action(expected) if expected else None,
                   repeated=bool(raw.get("repeated")),
                   matched_rules=tuple(raw.get("matched_rules") or ()), notes=tuple(raw.get("notes") or ()))


@dataclass(frozen=True)
class _Match:
    rule: CatalogRule
    position: int
    action: Action
    facts: tuple[str, ...]
    repeated: bool
    as_reboot: bool = False  # a reset_gpu action classified as reboot (reset_as_reboot)
    capped: str = ""  # the action its evidence's owners allow was less (evidence_sources)

    @property
    def definitive(self) -> bool:
        return self.rule.skip_health_check and not self.capped

    def rank(self) -> tuple[int, int, bool, int]:
        return (self.rule.priority, ACTION_SEVERITY[self.action], self.definitive, -self.position)


def _facts(rule: CatalogRule, ev: Evidence, suspect_exit_codes: Collection[int]) -> list[str] | None:
    """What in the evidence satisfies every condition of ``rule``, or None."""
    m, facts = rule.match, []
    if m.triggers:
        if ev.trigger not in m.triggers:
            return None
        facts.append(f"trigger {ev.trigger.value}")
    if m.exit_codes or m.exit_code_suspect:
        allowed = set(m.exit_codes) | (set(suspect_exit_codes) if m.exit_code_suspect else set())
        if ev.exit_code is None or ev.exit_code not in allowed:
            return None
        facts.append(f"exit code {ev.exit_code}" + (" (suspect)" if m.exit_code_suspect else ""))
    if m.stop_codes:
        if ev.stop_code not in m.stop_codes:
            return None
        facts.append(f"stop code {ev.stop_code}")
    if m.stopped_reason_contains:
        if not any(s in ev.stopped_reason.lower() for s in m.stopped_reason_contains):
            return None
        facts.append(f"stopped reason {ev.stopped_reason[:80]!r}")
    if m.xids:
        hits = [x for x in ev.xids if x.xid in m.xids]
        if not hits:
            return None
        facts.append("XID " + ", ".join(sorted({f"{x.xid} on {x.gpu}" for x in hits})))
    if m.gpu_signals:
        signals = [s for s in ev.gpu_signals if s.kind in m.gpu_signals]
        if not signals:
            return None
        facts.append(", ".join(sorted({f"{s.kind.value} on {s.gpu}" for s in signals})))
    if m.counter_rate is not None:
        counter, per_hour = m.counter_rate
        # Held to the limit by its lower bound: noise around a rate below it never matches.
        rising = [r for r in ev.counter_rates if r.counter == counter and r.lower_per_hour >= per_hour]
        if not rising:
            return None
        facts.append(", ".join(sorted(f"{r.describe()} (rate limit {per_hour:g}/h)" for r in rising)))
    if m.needs_dcgm and ev.dcgm is None:
        return None
    if ev.dcgm is not None:
        d = ev.dcgm
        if m.dcgm_verdicts:
            if d.verdict not in m.dcgm_verdicts:
                return None
            facts.append(f"DCGM verdict {d.verdict}")
        if m.dcgm_error_ids:
            ids = sorted({e.error_id for e in d.errors if e.error_id in m.dcgm_error_ids})
            if not ids:
                return None
            facts.append("DCGM error " + ", ".join(str(i) for i in ids))
        if m.dcgm_severities:
            names = sorted({e.severity_name for e in d.errors if e.severity_name in m.dcgm_severities})
            if not names:
                return None
            facts.append("DCGM severity " + ", ".join(names))
        if m.dcgm_failed_tests:
            tests = sorted({t for t in d.failed_tests if t.lower() in m.dcgm_failed_tests})
            if not tests:
                return None
            facts.append("DCGM failed test " + ", ".join(tests))
    return facts


def matching_rules(evidence: Evidence, catalog: FaultCatalog, rules: Iterable[CatalogRule] | None = None,
                   suspect_exit_codes: Collection[int] = ()
                   ) -> list[tuple[int, CatalogRule, tuple[str, ...]]]:
    """(position in the catalog, rule, the facts it matched) of every rule of ``rules``
    (default: the catalog's) the evidence satisfies, repeats left aside."""
    chosen = catalog.rules if rules is None else tuple(rules)
    positions = {id(r): i for i, r in enumerate(catalog.rules)}
    found = []
    for rule in chosen:
        facts = _facts(rule, evidence, suspect_exit_codes)
        if facts is not None:
            found.append((positions.get(id(rule), len(positions)), rule, tuple(facts)))
    return found


def _xid_pool(ev: Evidence, history: Iterable[NodeFaultRecord]) -> set[XidEvent]:
    pool = set(ev.xids) | set(ev.xid_history)
    for record in history:
        pool.update(record.xids)
    return pool


def _repeat(rule: CatalogRule, ev: Evidence, pool: set[XidEvent]) -> str | None:
    """Why the rule's repeat condition holds (e.g. "XID 31 3 times on GPU-1 within 24 h")."""
    if rule.repeat is None:
        return None
    repeat, since = rule.repeat, ev.fault_at - rule.repeat.window_seconds
    for current in sorted((x for x in ev.xids if x.xid in rule.match.xids),
                          key=lambda x: (x.at, x.gpu, x.xid)):
        same = {e for e in pool if e.xid == current.xid and e.at >= since
                and (not repeat.same_gpu or e.gpu == current.gpu)}
        if len(same) >= repeat.count:
            where = f"on {current.gpu}" if repeat.same_gpu else "on this node"
            return (f"XID {current.xid} {len(same)} times {where} within "
                    f"{repeat.window_seconds / 3600:g} h")
    return None


def classify(evidence: Evidence, catalog: FaultCatalog, *, history: Iterable[NodeFaultRecord] = (),
             suspect_exit_codes: Collection[int] = (), reset_as_reboot: bool = False) -> Decision:
    """The decision for ``evidence`` (before or after its health check)."""
    history = tuple(history)
    after = evidence.dcgm is not None
    pool = _xid_pool(evidence, history)
    matches: list[_Match] = []
    for position, rule in enumerate(catalog.rules):
        facts = _facts(rule, evidence, suspect_exit_codes)
        if facts is None:
            continue
        why_repeat = _repeat(rule, evidence, pool)
        action = rule.repeat.action if why_repeat and rule.repeat else rule.action
        as_reboot = reset_as_reboot and action is Action.RESET_GPU
        action = Action.REBOOT if as_reboot else action
        allowed = catalog.allowed_action(rule)
        capped = ""
        if exceeds(action, allowed):
            # What its evidence's owners may do alone (a tenant's word: only the stack's check).
            owners = catalog.evidence_sources.of_match(rule.match.conditions())
            capped = (f"{rule.id} asks {action.value}; its evidence ({', '.join(s.id for s in owners)}) "
                      f"may trigger at most {allowed.value} alone")
            action, as_reboot = allowed, False
        match = _Match(rule, position, action, tuple(facts + ([why_repeat] if why_repeat else [])),
                       why_repeat is not None, as_reboot, capped)
        # After the diag, rules that only wanted the diag have had their answer.
        if after and not (rule.match.needs_dcgm or match.definitive or action in MILD_ACTIONS):
            continue
        matches.append(match)
    matched_ids = tuple(m.rule.id for m in matches)
    informational = tuple(f"informational: {m.rule.id} ({'; '.join(m.facts)})"
                          for m in matches if m.action is Action.NONE)
    deciding = [m for m in matches if m.action is not Action.NONE]
    if not deciding:
        unmatched = _unmatched(evidence, catalog, after, reset_as_reboot)
        return replace(unmatched, matched_rules=matched_ids, notes=informational + unmatched.notes)
    best = max(deciding, key=_Match.rank)
    notes = informational + tuple(f"also matched {m.rule.id} ({m.action.value})"
                                  for m in deciding if m is not best)
    notes += (RESET_AS_REBOOT_NOTE,) if best.as_reboot else ()
    notes += (best.capped,) if best.capped else ()
    rule, action = best.rule, best.action
    budget = rule.budget if action is rule.action or best.as_reboot else DEFAULT_BUDGET[action]
    reason = f"catalog rule {rule.id!r}: {rule.description} [{'; '.join(best.facts)}]"
    if not after and action in NODE_ACTIONS and not best.definitive:
        return Decision(Action.HEALTH_CHECK, rule.id, f"{reason}; {action.value} expected, the DCGM "
                        "diag decides", Budget.NONE, expected_action=action, repeated=best.repeated,
                        matched_rules=matched_ids, notes=notes)
    return Decision(action, rule.id, f"{reason} -> {action.value}", budget,
                    skip_health_check=not after and action in NODE_ACTIONS, after_health_check=after,
                    repeated=best.repeated, matched_rules=matched_ids, notes=notes)


def _unmatched(evidence: Evidence, catalog: FaultCatalog, after: bool, reset_as_reboot: bool) -> Decision:
    if after and evidence.dcgm is not None:
        verdict = evidence.dcgm.verdict
        action = DCGM_VERDICT_FALLBACK[verdict]
        as_reboot = reset_as_reboot and action is Action.RESET_GPU
        action = Action.REBOOT if as_reboot else action
        return Decision(action, FALLBACK_RULE_PREFIX + verdict,
                        f"no catalog rule decided; the health check's verdict {verdict!r} -> {action.value}",
                        DEFAULT_BUDGET[action], after_health_check=True,
                        notes=(RESET_AS_REBOOT_NOTE,) if as_reboot else ())
    # GPU telemetry alone is no job fault: with nothing to go on, there is nothing to do.
    action = Action.NONE if evidence.trigger is Trigger.TELEMETRY else catalog.unmatched_action
    if action in NODE_ACTIONS:
        return Decision(Action.HEALTH_CHECK, UNMATCHED_RULE, "no catalog rule decided; the catalog's "
                        f"default {action.value} is confirmed by the DCGM diag first", Budget.NONE,
                        expected_action=action)
    return Decision(action, UNMATCHED_RULE,
                    f"no catalog rule decided; the default for {evidence.trigger.value} -> {action.value}",
                    DEFAULT_BUDGET[action])
