"""Validation of a fault-catalog document: every error names the rule and the field.

Pure Python (no JSON Schema library in the Lambda runtime); re-exported by
:mod:`gpu_recovery.domain.fault_catalog`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from gpu_recovery.domain.evidence_sources import SECTION as SOURCES_SECTION
from gpu_recovery.domain.evidence_sources import (
    EvidenceSources,
    rule_problems,
    sources_of,
    validate_sources,
)
from gpu_recovery.domain.fault_vocabulary import (
    BUSY_NODE_POLICIES,
    DCGM_SEVERITY_NAMES,
    DCGM_VERDICT_NAMES,
    SKIPPABLE_ACTIONS,
    WARNING_ACTIONS,
    WARNING_CONFIDENCES,
    Action,
    Budget,
    GpuSignalKind,
    Trigger,
)
from gpu_recovery.domain.gpu_counters import COUNTERS

SUPPORTED_SCHEMA_VERSIONS = (1,)
RULE_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
RULE_FIELDS = {"id", "match", "action", "budget", "skip_health_check", "priority", "repeat",
               "description", "source", "nvidia_bucket", "warning"}
REPEAT_FIELDS = {"count", "window_hours", "scope", "action"}
WARNING_FIELDS = {"confidence", "busy_node"}
COUNTER_RATE_FIELDS = {"counter", "per_hour"}
MAX_PER_HOUR = 1e9
DEFAULT_FIELDS = {"unmatched_action", "evidence_lookback_seconds", "evidence_lookahead_seconds",
                  "counter_rate_window_seconds"}
TOP_FIELDS = {"schema_version", "description", "defaults", "rules", SOURCES_SECTION}
MAX_XID = 1023  # the driver prints Xids as small integers; anything larger is a typo


def _names(values: Any) -> list[str]:
    return [v.value if hasattr(v, "value") else str(v) for v in values]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _list_of(check: Callable[[Any], bool], what: str) -> Callable[[Any], str | None]:
    def validate(value: Any) -> str | None:
        if not isinstance(value, list) or not value:
            return f"must be a non-empty list of {what}"
        bad = [v for v in value if not check(v)]
        return f"must be a list of {what}; not: {', '.join(json.dumps(b) for b in bad[:5])}" if bad else None
    return validate


def _exit_codes(value: Any) -> str | None:
    if value == "suspect":
        return None
    problem = _list_of(lambda v: _is_int(v) and 1 <= v <= 255, "exit codes 1..255")(value)
    return f"{problem}, or the string \"suspect\" (the deployment's suspect exit codes)" if problem else None


def _one_of(allowed: list[str]) -> Callable[[Any], str | None]:
    return _list_of(lambda v: v in allowed, "values from: " + ", ".join(allowed))


def _nonempty_strings(value: Any) -> str | None:
    return _list_of(lambda v: isinstance(v, str) and v.strip() != "", "non-empty strings")(value)


def _counter_rate(value: Any) -> str | None:
    what = f"must be an object {{\"counter\": one of {', '.join(COUNTERS)}, \"per_hour\": a number > 0}}"
    if not isinstance(value, Mapping):
        return what
    unknown = sorted(set(value) - COUNTER_RATE_FIELDS)
    if unknown:
        return f"{what}; unknown field(s): {', '.join(unknown)}"
    if value.get("counter") not in COUNTERS:
        return f"{what}; counter {value.get('counter')!r} is not one of them"
    rate = value.get("per_hour")
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0 < rate <= MAX_PER_HOUR:
        return f"{what}; per_hour {rate!r} is not a number in (0, {MAX_PER_HOUR:g}]"
    return None


MATCH_KEYS: dict[str, Callable[[Any], str | None]] = {
    "trigger": _one_of(_names(Trigger)),
    "exit_code": _exit_codes,
    "stop_code": _nonempty_strings,
    "stopped_reason_contains": _nonempty_strings,
    "xid": _list_of(lambda v: _is_int(v) and 1 <= v <= MAX_XID, f"XID numbers 1..{MAX_XID}"),
    "gpu_signal": _one_of(_names(GpuSignalKind)),
    "dcgm_verdict": _one_of(list(DCGM_VERDICT_NAMES)),
    "dcgm_error_id": _list_of(lambda v: _is_int(v) and v >= 0, "DCGM error ids (integers >= 0)"),
    "dcgm_severity": _one_of(list(DCGM_SEVERITY_NAMES.values())),
    "dcgm_failed_test": _nonempty_strings,
    "counter_rate": _counter_rate,
}
# What a node reports while it still runs: the only conditions a driver warning may match.
WARNING_MATCH_KEYS = {"gpu_signal", "counter_rate"}
DCGM_MATCH_KEYS = {"dcgm_verdict", "dcgm_error_id", "dcgm_severity", "dcgm_failed_test"}
REPEAT_MATCH_KEYS = {"xid"}  # repeats are counted over the node's reported XID events


def validate_catalog(document: Any) -> list[str]:
    """Every problem of a catalog document, each naming its rule (index and id) and field."""
    if not isinstance(document, Mapping):
        return ["the catalog must be a JSON object with 'schema_version' and 'rules'"]
    errors: list[str] = []
    for key in sorted(set(document) - TOP_FIELDS):
        errors.append(f"unknown top-level field {key!r} (allowed: {', '.join(sorted(TOP_FIELDS))})")
    if document.get("schema_version") not in SUPPORTED_SCHEMA_VERSIONS:
        errors.append(f"schema_version must be one of {list(SUPPORTED_SCHEMA_VERSIONS)}, "
                      f"got {document.get('schema_version')!r}")
    if "description" in document and not isinstance(document["description"], str):
        errors.append("description must be a string")
    errors += _validate_defaults(document.get("defaults", {}))
    source_errors = (validate_sources(document[SOURCES_SECTION], MATCH_KEYS)
                     if SOURCES_SECTION in document else [])
    errors += source_errors
    sources = sources_of({} if source_errors else document)
    rules = document.get("rules")
    if not isinstance(rules, list) or not rules:
        return [*errors, "rules must be a non-empty list of rule objects"]
    seen_ids: dict[str, int] = {}
    seen_matches: dict[str, str] = {}
    for position, rule in enumerate(rules):
        label = f"rules[{position}]"
        if not isinstance(rule, Mapping):
            errors.append(f"{label}: must be an object")
            continue
        rule_id = rule.get("id")
        if isinstance(rule_id, str):
            label = f"{label} (id {rule_id!r})"
            if rule_id in seen_ids:
                errors.append(f"{label}: duplicate id, also rules[{seen_ids[rule_id]}]")
            seen_ids.setdefault(rule_id, position)
        errors += [f"{label}: {problem}" for problem in _validate_rule(rule, sources)]
        if isinstance(rule.get("match"), Mapping):
            key = json.dumps(rule["match"], sort_keys=True)
            if key in seen_matches:
                errors.append(f"{label}: field 'match': same conditions as rule {seen_matches[key]!r}; "
                              "merge the two rules or make one more specific")
            seen_matches.setdefault(key, str(rule_id))
    return errors


def _validate_defaults(defaults: Any) -> list[str]:
    if not isinstance(defaults, Mapping):
        return ["defaults must be an object"]
    errors = [f"defaults: unknown field {k!r} (allowed: {', '.join(sorted(DEFAULT_FIELDS))})"
              for k in sorted(set(defaults) - DEFAULT_FIELDS)]
    if "unmatched_action" in defaults and defaults["unmatched_action"] not in _names(Action):
        errors.append(f"defaults: field 'unmatched_action' must be one of {', '.join(_names(Action))}, "
                      f"got {defaults['unmatched_action']!r}")
    for key in ("evidence_lookback_seconds", "evidence_lookahead_seconds"):
        value = defaults.get(key, 0)
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 86400:
            errors.append(f"defaults: field {key!r} must be a number of seconds 0..86400, got {value!r}")
    window = defaults.get("counter_rate_window_seconds", 600)
    if not isinstance(window, int | float) or isinstance(window, bool) or not 60 <= window <= 86400:
        errors.append("defaults: field 'counter_rate_window_seconds' must be a number of seconds 60..86400 "
                      f"(a counter's rate spans one to two of these), got {window!r}")
    return errors


def _validate_rule(rule: Mapping[str, Any], sources: EvidenceSources) -> list[str]:
    errors = [f"unknown field {k!r} (allowed: {', '.join(sorted(RULE_FIELDS))})"
              for k in sorted(set(rule) - RULE_FIELDS)]
    rule_id = rule.get("id")
    if not isinstance(rule_id, str) or not RULE_ID.match(rule_id):
        errors.append("field 'id' must be 1-64 characters of a-z, 0-9, '.', '_', '-' "
                      f"starting with a letter or digit, got {rule_id!r}")
    action = rule.get("action")
    if action not in _names(Action):
        errors.append(f"field 'action' must be one of {', '.join(_names(Action))}, got {action!r}")
    if "budget" in rule and rule["budget"] not in _names(Budget):
        errors.append(f"field 'budget' must be one of {', '.join(_names(Budget))}, got {rule['budget']!r}")
    for key in ("source", "description"):
        if not isinstance(rule.get(key), str) or not rule[key].strip():
            errors.append(f"field {key!r} is required: a non-empty string"
                          + (" naming where the mapping comes from" if key == "source" else ""))
    if "nvidia_bucket" in rule and not isinstance(rule["nvidia_bucket"], str):
        errors.append("field 'nvidia_bucket' must be a string (NVIDIA's Immediate Action)")
    if "priority" in rule and (not _is_int(rule["priority"]) or not -100 <= rule["priority"] <= 100):
        errors.append(f"field 'priority' must be an integer -100..100, got {rule['priority']!r}")
    match = rule.get("match")
    if not isinstance(match, Mapping) or not match:
        errors.append("field 'match' must be an object with at least one condition "
                      f"({', '.join(MATCH_KEYS)})")
        match = {}
    for key, value in match.items():
        check = MATCH_KEYS.get(key)
        if check is None:
            errors.append(f"field 'match': unknown condition {key!r} (allowed: {', '.join(MATCH_KEYS)})")
        elif (problem := check(value)) is not None:
            errors.append(f"field 'match.{key}' {problem}")
    skip = rule.get("skip_health_check", False)
    if not isinstance(skip, bool):
        errors.append(f"field 'skip_health_check' must be true or false, got {skip!r}")
    elif skip:
        if action in _names(Action) and Action(action) not in SKIPPABLE_ACTIONS:
            errors.append("field 'skip_health_check': only a rule whose action is "
                          f"{', '.join(sorted(_names(SKIPPABLE_ACTIONS)))} may skip the DCGM diag")
        if DCGM_MATCH_KEYS & set(match):
            errors.append("field 'skip_health_check': a rule matching DCGM results runs after the "
                          "diag by definition; it cannot skip it")
    if DCGM_MATCH_KEYS & set(match) and action == Action.HEALTH_CHECK.value:
        errors.append("field 'action': a rule matching DCGM results cannot ask for another "
                      "health check (it would loop)")
    errors += rule_problems(rule, sources)
    if "repeat" in rule:
        errors += _validate_repeat(rule["repeat"], match)
    if "warning" in rule:
        errors += _validate_warning(rule["warning"], rule, match)
    return errors


def _validate_warning(warning: Any, rule: Mapping[str, Any], match: Mapping[str, Any]) -> list[str]:
    """A driver warning acts on a node that still runs: what it matches must be in the node's
    reports, and what it does must be a repair decided without the diag."""
    if not isinstance(warning, Mapping):
        return ["field 'warning' must be an object {confidence, busy_node}"]
    errors = [f"field 'warning': unknown field {k!r} (allowed: {', '.join(sorted(WARNING_FIELDS))})"
              for k in sorted(set(warning) - WARNING_FIELDS)]
    if warning.get("confidence") not in WARNING_CONFIDENCES:
        errors.append(f"field 'warning.confidence' must be one of {', '.join(WARNING_CONFIDENCES)} "
                      f"(announced: the driver says so; predicted: a counter's trend), "
                      f"got {warning.get('confidence')!r}")
    if warning.get("busy_node", "move") not in BUSY_NODE_POLICIES:
        errors.append(f"field 'warning.busy_node' must be one of {', '.join(BUSY_NODE_POLICIES)}, "
                      f"got {warning.get('busy_node')!r}")
    if rule.get("action") not in _names(WARNING_ACTIONS):
        errors.append("field 'warning': only a rule whose action is "
                      f"{', '.join(sorted(_names(WARNING_ACTIONS)))} can repair a node on a warning")
    if rule.get("skip_health_check") is not True:
        errors.append("field 'warning': needs 'skip_health_check': true (a warning repairs an idle "
                      "node without the DCGM diag)")
    others = sorted(set(match) - WARNING_MATCH_KEYS)
    if others or not set(match) & WARNING_MATCH_KEYS:
        errors.append("field 'warning': the rule may only match what a node reports while it runs "
                      f"({', '.join(sorted(WARNING_MATCH_KEYS))})"
                      + (f", not {', '.join(others)}" if others else ""))
    return errors


def _validate_repeat(repeat: Any, match: Mapping[str, Any]) -> list[str]:
    if not isinstance(repeat, Mapping):
        return ["field 'repeat' must be an object {count, window_hours, scope, action}"]
    errors = [f"field 'repeat': unknown field {k!r} (allowed: {', '.join(sorted(REPEAT_FIELDS))})"
              for k in sorted(set(repeat) - REPEAT_FIELDS)]
    if not REPEAT_MATCH_KEYS & set(match):
        errors.append("field 'repeat' needs an 'xid' condition in 'match' (repeats are counted "
                      "over the XIDs the node reported)")
    count = repeat.get("count", 2)
    if not _is_int(count) or not 2 <= count <= 100:
        errors.append(f"field 'repeat.count' must be an integer 2..100, got {count!r}")
    window = repeat.get("window_hours")
    if not isinstance(window, int | float) or isinstance(window, bool) or not 0 < window <= 24 * 30:
        errors.append(f"field 'repeat.window_hours' must be a number of hours in (0, 720], got {window!r}")
    if repeat.get("scope", "same_gpu") not in ("same_gpu", "node"):
        errors.append(f"field 'repeat.scope' must be \"same_gpu\" or \"node\", got {repeat.get('scope')!r}")
    if repeat.get("action") not in _names(Action):
        errors.append(f"field 'repeat.action' must be one of {', '.join(_names(Action))}, "
                      f"got {repeat.get('action')!r}")
    return errors
