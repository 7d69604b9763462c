"""The fault catalog: evidence -> action, as data (docs/fault-catalog.md).

The default catalog ships in the Lambda asset (``gpu_recovery/catalog/default_fault_catalog.json``);
a deployment may merge an override file onto it. ``validate_catalog`` returns every problem
with the rule and field it is about, so ``cdk synth`` can refuse a bad catalog before anything
is deployed; ``load_catalog`` returns the typed :class:`FaultCatalog` or raises
:class:`CatalogError` with the same messages.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from gpu_recovery.domain.catalog_validation import validate_catalog
from gpu_recovery.domain.evidence_sources import SECTION as SOURCES_SECTION
from gpu_recovery.domain.evidence_sources import EvidenceSources, sources_of
from gpu_recovery.domain.fault_vocabulary import (
    DEFAULT_BUDGET,
    MOVE_JOB,
    Action,
    Budget,
    GpuSignalKind,
    Trigger,
)
from gpu_recovery.domain.gpu_counters import DEFAULT_WINDOW_SECONDS

DEFAULT_CATALOG_PATH = Path(__file__).resolve().parent.parent / "catalog" / "default_fault_catalog.json"
DEFAULT_LOOKBACK_SECONDS = 900
DEFAULT_LOOKAHEAD_SECONDS = 120

__all__ = [
    "DEFAULT_CATALOG_PATH",
    "CatalogError",
    "CatalogRule",
    "FaultCatalog",
    "RepeatRule",
    "RuleMatch",
    "WarningPolicy",
    "catalog_document",
    "checked_document",
    "default_catalog",
    "default_catalog_path",
    "load_catalog",
    "merge_override",
    "read_catalog_file",
    "validate_catalog",
]


class CatalogError(ValueError):
    """A catalog that cannot be used; ``errors`` names each rule and field at fault."""

    def __init__(self, errors: list[str], source: str = "fault catalog") -> None:
        self.errors = list(errors)
        super().__init__(f"{source} is invalid:\n  - " + "\n  - ".join(self.errors))


@dataclass(frozen=True)
class RuleMatch:
    """Every condition given must hold; within one condition any listed value matches."""

    triggers: frozenset[Trigger] = frozenset()
    exit_codes: frozenset[int] = frozenset()
    exit_code_suspect: bool = False  # "exit_code": "suspect" = the deployment's suspect codes
    stop_codes: frozenset[str] = frozenset()
    stopped_reason_contains: tuple[str, ...] = ()
    xids: frozenset[int] = frozenset()
    gpu_signals: frozenset[GpuSignalKind] = frozenset()
    dcgm_verdicts: frozenset[str] = frozenset()
    dcgm_error_ids: frozenset[int] = frozenset()
    dcgm_severities: frozenset[str] = frozenset()
    dcgm_failed_tests: frozenset[str] = frozenset()  # lower case
    # A counter rising at least this fast over the node's reports: (counter, per hour).
    counter_rate: tuple[str, float] | None = None

    @property
    def needs_dcgm(self) -> bool:
        """Only a finished health check can satisfy this rule."""
        return bool(self.dcgm_verdicts or self.dcgm_error_ids or self.dcgm_severities
                    or self.dcgm_failed_tests)

    def conditions(self) -> dict[str, Any]:
        """The conditions this match holds, by catalog key (their owners: evidence_sources)."""
        present = {"trigger": sorted(t.value for t in self.triggers),
                   "exit_code": self.exit_code_suspect or self.exit_codes, "stop_code": self.stop_codes,
                   "stopped_reason_contains": self.stopped_reason_contains, "xid": self.xids,
                   "gpu_signal": self.gpu_signals, "dcgm_verdict": self.dcgm_verdicts,
                   "dcgm_error_id": self.dcgm_error_ids, "dcgm_severity": self.dcgm_severities,
                   "dcgm_failed_test": self.dcgm_failed_tests, "counter_rate": self.counter_rate}
        return {key: value for key, value in present.items() if value}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RuleMatch:
        exit_code = raw.get("exit_code")
        return cls(
            triggers=frozenset(Trigger(t) for t in raw.get("trigger", ())),
            exit_codes=frozenset(exit_code) if isinstance(exit_code, list) else frozenset(),
            exit_code_suspect=exit_code == "suspect",
            stop_codes=frozenset(raw.get("stop_code", ())),
            stopped_reason_contains=tuple(s.lower() for s in raw.get("stopped_reason_contains", ())),
            xids=frozenset(raw.get("xid", ())),
            gpu_signals=frozenset(GpuSignalKind(s) for s in raw.get("gpu_signal", ())),
            dcgm_verdicts=frozenset(raw.get("dcgm_verdict", ())),
            dcgm_error_ids=frozenset(raw.get("dcgm_error_id", ())),
            dcgm_severities=frozenset(raw.get("dcgm_severity", ())),
            dcgm_failed_tests=frozenset(t.lower() for t in raw.get("dcgm_failed_test", ())),
            counter_rate=(str(raw["counter_rate"]["counter"]), float(raw["counter_rate"]["per_hour"]))
            if raw.get("counter_rate") else None,
        )


@dataclass(frozen=True)
class RepeatRule:
    """The rule's action changes when its evidence repeats (e.g. XID 31 twice on one GPU in 24 h)."""

    count: int
    window_seconds: float
    same_gpu: bool
    action: Action

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RepeatRule:
        return cls(count=int(raw.get("count", 2)), window_seconds=float(raw["window_hours"]) * 3600,
                   same_gpu=raw.get("scope", "same_gpu") == "same_gpu", action=Action(raw["action"]))


@dataclass(frozen=True)
class WarningPolicy:
    """A rule the driver's warnings decide on a node still running (docs/driver-warnings.md):
    how sure it is (``announced`` by the driver, or ``predicted`` from a rising counter), and
    what happens to a job running there (``move`` at its next checkpoint, or ``cordon``: the
    node takes nothing new and is repaired once the job leaves)."""

    confidence: str
    busy_node: str = MOVE_JOB

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> WarningPolicy:
        return cls(str(raw["confidence"]), str(raw.get("busy_node", MOVE_JOB)))


@dataclass(frozen=True)
class CatalogRule:
    id: str
    match: RuleMatch
    action: Action
    budget: Budget
    skip_health_check: bool = False
    priority: int = 0
    repeat: RepeatRule | None = None
    description: str = ""
    source: str = ""
    nvidia_bucket: str = ""
    warning: WarningPolicy | None = None  # a driver warning: acted on before any job fault

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CatalogRule:
        action = Action(raw["action"])
        return cls(
            id=raw["id"], match=RuleMatch.from_dict(raw["match"]), action=action,
            budget=Budget(raw["budget"]) if "budget" in raw else DEFAULT_BUDGET[action],
            skip_health_check=bool(raw.get("skip_health_check", False)),
            priority=int(raw.get("priority", 0)),
            repeat=RepeatRule.from_dict(raw["repeat"]) if raw.get("repeat") else None,
            description=raw.get("description", ""), source=raw.get("source", ""),
            nvidia_bucket=raw.get("nvidia_bucket", ""),
            warning=WarningPolicy.from_dict(raw["warning"]) if raw.get("warning") else None,
        )


@dataclass(frozen=True)
class FaultCatalog:
    rules: tuple[CatalogRule, ...]
    unmatched_action: Action = Action.APPLICATION_ERROR
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS  # evidence window before the fault
    lookahead_seconds: float = DEFAULT_LOOKAHEAD_SECONDS  # ... and after it (reports lag)
    document: Mapping[str, Any] | None = None  # the validated (merged) document
    # A counter's rate spans one to two of these (domain.gpu_counters).
    counter_window_seconds: float = DEFAULT_WINDOW_SECONDS
    # Who owns each kind of evidence and what it may do alone (domain.evidence_sources).
    sources: EvidenceSources | None = None

    @property
    def evidence_sources(self) -> EvidenceSources:
        return self.sources if self.sources is not None else sources_of({})

    @property
    def warning_rules(self) -> tuple[CatalogRule, ...]:
        return tuple(r for r in self.rules if r.warning is not None)

    @property
    def repeat_lookback_seconds(self) -> float:
        """How far back XID history must reach for the repeat rules."""
        return max((r.repeat.window_seconds for r in self.rules if r.repeat), default=0.0)

    def allowed_action(self, rule: CatalogRule) -> Action:
        """The most ``rule`` may do on its evidence's owners' word (domain.evidence_sources)."""
        return self.evidence_sources.allowed(rule.match.conditions())

    def rule(self, rule_id: str) -> CatalogRule:
        for rule in self.rules:
            if rule.id == rule_id:
                return rule
        raise KeyError(rule_id)

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> FaultCatalog:
        """A document ``validate_catalog`` accepted."""
        defaults = document.get("defaults") or {}
        return cls(
            rules=tuple(CatalogRule.from_dict(raw) for raw in document["rules"]),
            unmatched_action=Action(defaults.get("unmatched_action", Action.APPLICATION_ERROR.value)),
            lookback_seconds=float(defaults.get("evidence_lookback_seconds", DEFAULT_LOOKBACK_SECONDS)),
            lookahead_seconds=float(defaults.get("evidence_lookahead_seconds", DEFAULT_LOOKAHEAD_SECONDS)),
            document=copy.deepcopy(dict(document)),
            counter_window_seconds=float(defaults.get("counter_rate_window_seconds", DEFAULT_WINDOW_SECONDS)),
            sources=sources_of(document),
        )


def default_catalog_path() -> Path:
    return DEFAULT_CATALOG_PATH


@cache
def default_catalog() -> FaultCatalog:
    """The catalog shipped in the asset, no override (read and validated once per process)."""
    return load_catalog()


def read_catalog_file(path: str | Path) -> dict[str, Any]:
    """A catalog or override file, JSON (what the functions read: synthesis converts a YAML
    override to JSON, ``infra/catalog_file.py``)."""
    path = Path(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        raise CatalogError([f"{path} is YAML: cdk synth reads YAML (infra.catalog_file); here the "
                            "catalog must be JSON"], str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise CatalogError([f"cannot read {path}: {error.strerror or error}"], str(path)) from error
    return catalog_document(text, path)


def catalog_document(text: str, path: str | Path) -> dict[str, Any]:
    """The JSON text of a catalog or override file as a document (``path`` names it in errors)."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise CatalogError([f"{path} is not valid JSON: {error.msg} at line {error.lineno} "
                            f"column {error.colno}"], str(path)) from error
    return checked_document(document, path)


def checked_document(document: Any, path: str | Path) -> dict[str, Any]:
    """``document`` when it is an object (a catalog or override), else the error naming ``path``."""
    if not isinstance(document, dict):
        raise CatalogError([f"{path} must hold an object at the top level"], str(path))
    return document


def merge_override(base: Mapping[str, Any], override: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The base catalog with a per-deployment override applied; errors name the override rule.

    Override fields: ``rules`` (a rule whose ``id`` exists replaces the given fields of that
    rule, ``match`` as a whole; a new ``id`` appends a complete rule), ``remove_rules``
    (ids to drop) and ``defaults`` / ``description`` (merged key by key).
    """
    errors: list[str] = []
    merged = copy.deepcopy(dict(base))
    known = {"schema_version", "description", "defaults", "rules", "remove_rules"}
    if SOURCES_SECTION in override:
        errors.append(f"override: {SOURCES_SECTION!r} cannot be overridden: who owns each kind of evidence "
                      "and what it may do alone is the stack's (docs/remediation.md)")
    for key in sorted(set(override) - known - {SOURCES_SECTION}):
        errors.append(f"override: unknown top-level field {key!r} (allowed: {', '.join(sorted(known))})")
    if "schema_version" in override and override["schema_version"] != merged.get("schema_version"):
        errors.append(f"override: schema_version {override['schema_version']!r} does not match the "
                      f"catalog's {merged.get('schema_version')!r}")
    if "description" in override:
        merged["description"] = override["description"]
    defaults = override.get("defaults", {})
    if not isinstance(defaults, dict):
        errors.append("override: 'defaults' must be an object")
    else:
        merged["defaults"] = {**(merged.get("defaults") or {}), **defaults}
    rules = [dict(r) for r in merged.get("rules", []) if isinstance(r, dict)]
    index = {r.get("id"): i for i, r in enumerate(rules)}
    removed = override.get("remove_rules", [])
    if not isinstance(removed, list) or not all(isinstance(r, str) for r in removed):
        errors.append("override: 'remove_rules' must be a list of rule ids")
        removed = []
    for rule_id in removed:
        if rule_id not in index:
            errors.append(f"override: remove_rules names {rule_id!r}, which the catalog does not have")
    patches = override.get("rules", [])
    if not isinstance(patches, list):
        errors.append("override: 'rules' must be a list")
        patches = []
    for position, patch in enumerate(patches):
        if not isinstance(patch, dict) or not isinstance(patch.get("id"), str):
            errors.append(f"override rules[{position}]: must be an object with a string 'id'")
            continue
        if patch["id"] in removed:
            errors.append(f"override rules[{position}] (id {patch['id']!r}): also listed in remove_rules")
        elif patch["id"] in index:
            rules[index[patch["id"]]].update(copy.deepcopy(patch))
        else:
            index[patch["id"]] = len(rules)
            rules.append(copy.deepcopy(patch))
    merged["rules"] = [r for r in rules if r.get("id") not in set(removed)]
    return merged, errors


def load_catalog(path_or_dict: str | Path | Mapping[str, Any] | None = None,
                 override: str | Path | Mapping[str, Any] | None = None) -> FaultCatalog:
    """The catalog at ``path_or_dict`` (default: the shipped one) with ``override`` merged on.

    Raises :class:`CatalogError` listing every problem (file, JSON, rule and field).
    """
    source = "fault catalog"
    if path_or_dict is None:
        path_or_dict = DEFAULT_CATALOG_PATH
    if isinstance(path_or_dict, Mapping):
        document: dict[str, Any] = copy.deepcopy(dict(path_or_dict))
    else:
        source = str(path_or_dict)
        document = read_catalog_file(path_or_dict)
    errors = validate_catalog(document)
    if errors:
        raise CatalogError(errors, source)
    if override is not None:
        patch = override if isinstance(override, Mapping) else read_catalog_file(override)
        document, errors = merge_override(document, patch)
        errors += validate_catalog(document)
        if errors:
            raise CatalogError(errors, f"{source} with override")
    return FaultCatalog.from_document(document)
