"""Who owns each kind of evidence, and what it may do on its own (issue 49).

Data beside the fault catalog: the ``evidence_sources`` section of
``catalog/default_fault_catalog.json`` (one source of truth; an override cannot change it).
Each source names its **owner** (``stack``: the stack's own DCGM check and validation, ECS
and EC2 state; ``node``: the node agent's reports under the node's own token; ``aws``: AWS's
own notices; ``tenant``: everything the training program says: exit codes, preflight tables,
progress), the catalog conditions and triggers that draw on it, and the **most** it may
trigger alone (``max_action``).

A catalog rule may act up to the strongest source its conditions hold (the conditions are
all required, so a rule that also needs a node's XID has the node's word behind it); within
one condition listing several triggers, the weakest counts (any one of them matches alone).
A tenant's source never goes past ``health_check``: what a tenant's program says makes a node
a suspect for the stack's own check, never a reboot, reset, replacement or hold on its word.
That bound is code, not data (:data:`TENANT_MAX_ACTION`): no catalog may raise it.

Pure: the validation (``catalog_validation``) refuses a rule asking a source for more, and the
classification (``classify``) caps a decision the same way, should a catalog get past it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from gpu_recovery.domain.fault_vocabulary import ACTION_SEVERITY, Action, Trigger

DEFAULT_CATALOG_PATH = Path(__file__).resolve().parent.parent / "catalog" / "default_fault_catalog.json"
SECTION = "evidence_sources"
STACK, NODE, AWS, TENANT = "stack", "node", "aws", "tenant"
OWNERS = (STACK, NODE, AWS, TENANT)
TENANT_MAX_ACTION = Action.HEALTH_CHECK
SOURCE_FIELDS = {"id", "owner", "conditions", "triggers", "max_action", "description", "acted_on_by"}
TRIGGER_CONDITION = "trigger"


@dataclass(frozen=True)
class EvidenceSource:
    id: str
    owner: str
    max_action: Action
    description: str
    conditions: tuple[str, ...] = ()  # catalog match keys drawing on it (besides "trigger")
    triggers: tuple[Trigger, ...] = ()  # the triggers that are its word
    acted_on_by: str = ""  # a source no catalog condition draws on: where it is acted on

    @property
    def tenant(self) -> bool:
        return self.owner == TENANT

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> EvidenceSource:
        return cls(id=str(raw["id"]), owner=str(raw["owner"]), max_action=Action(raw["max_action"]),
                   description=str(raw.get("description") or ""),
                   conditions=tuple(str(c) for c in raw.get("conditions") or ()),
                   triggers=tuple(Trigger(t) for t in raw.get("triggers") or ()),
                   acted_on_by=str(raw.get("acted_on_by") or ""))


@dataclass(frozen=True)
class EvidenceSources:
    sources: tuple[EvidenceSource, ...]

    def by_id(self, source_id: str) -> EvidenceSource:
        for source in self.sources:
            if source.id == source_id:
                return source
        raise KeyError(source_id)

    def of_trigger(self, trigger: Trigger) -> EvidenceSource | None:
        return next((s for s in self.sources if trigger in s.triggers), None)

    def of_condition(self, key: str) -> EvidenceSource | None:
        return next((s for s in self.sources if key in s.conditions), None)

    def of_match(self, match: Mapping[str, Any]) -> tuple[EvidenceSource, ...]:
        """The source each condition of a rule's (raw) match stands for: for a trigger
        condition, the weakest of its listed triggers."""
        found: list[EvidenceSource] = []
        for key, value in match.items():
            if key == TRIGGER_CONDITION:
                listed = [self.of_trigger(Trigger(t)) for t in value or () if t in _TRIGGER_VALUES]
                known = [s for s in listed if s is not None]
                if known:
                    found.append(min(known, key=lambda s: ACTION_SEVERITY[s.max_action]))
            elif (source := self.of_condition(key)) is not None:
                found.append(source)
        return tuple(dict.fromkeys(found))

    def allowed(self, match: Mapping[str, Any]) -> Action:
        """The most a rule with this match may do (the strongest of its conditions' sources;
        a match naming no known source: only a check)."""
        held = self.of_match(match)
        if not held:
            return TENANT_MAX_ACTION
        return max((s.max_action for s in held), key=lambda a: ACTION_SEVERITY[a])

    def tenant_only(self, match: Mapping[str, Any]) -> bool:
        held = self.of_match(match)
        return bool(held) and all(s.tenant for s in held)


_TRIGGER_VALUES = {t.value for t in Trigger}


def exceeds(action: Action, allowed: Action) -> bool:
    return ACTION_SEVERITY[action] > ACTION_SEVERITY[allowed]


@cache
def default_sources_document() -> tuple[Mapping[str, Any], ...]:
    """The shipped catalog's section (a catalog document without one is held to it)."""
    document = json.loads(DEFAULT_CATALOG_PATH.read_text(encoding="utf-8"))
    return tuple(document[SECTION])


def sources_of(document: Mapping[str, Any]) -> EvidenceSources:
    """The sources of a validated catalog document (the shipped ones when it has none)."""
    raw = document.get(SECTION) or default_sources_document()
    return EvidenceSources(tuple(EvidenceSource.from_dict(s) for s in raw))


def validate_sources(raw: Any, match_keys: Iterable[str]) -> list[str]:
    """Every problem of an ``evidence_sources`` section: each condition and trigger owned by
    exactly one source, owners known, a tenant's source at most ``health_check``."""
    if not isinstance(raw, list) or not raw:
        return [f"{SECTION} must be a non-empty list of sources"]
    errors: list[str] = []
    owner_of_condition: dict[str, str] = {}
    owner_of_trigger: dict[str, str] = {}
    ids: set[str] = set()
    actions = [a.value for a in Action]
    for position, source in enumerate(raw):
        label = f"{SECTION}[{position}]"
        if not isinstance(source, Mapping):
            errors.append(f"{label}: must be an object")
            continue
        label += f" (id {source.get('id')!r})"
        errors += [f"{label}: unknown field {k!r} (allowed: {', '.join(sorted(SOURCE_FIELDS))})"
                   for k in sorted(set(source) - SOURCE_FIELDS)]
        if not isinstance(source.get("id"), str) or not source["id"]:
            errors.append(f"{label}: field 'id' must be a non-empty string")
        elif source["id"] in ids:
            errors.append(f"{label}: duplicate id")
        else:
            ids.add(source["id"])
        if source.get("owner") not in OWNERS:
            errors.append(f"{label}: field 'owner' must be one of {', '.join(OWNERS)}, "
                          f"got {source.get('owner')!r}")
        if not isinstance(source.get("description"), str) or not source["description"].strip():
            errors.append(f"{label}: field 'description' is required: a non-empty string")
        action = source.get("max_action")
        if action not in actions:
            errors.append(f"{label}: field 'max_action' must be one of {', '.join(actions)}, "
                          f"got {action!r}")
        elif source.get("owner") == TENANT and exceeds(Action(action), TENANT_MAX_ACTION):
            errors.append(f"{label}: a tenant's evidence may trigger at most {TENANT_MAX_ACTION.value} "
                          f"alone (the stack's own check), not {action}")
        for key in source.get("conditions") or ():
            if key == TRIGGER_CONDITION or key not in set(match_keys):
                errors.append(f"{label}: condition {key!r} is not a catalog match condition")
            elif key in owner_of_condition:
                errors.append(f"{label}: condition {key!r} is already owned by {owner_of_condition[key]!r}")
            else:
                owner_of_condition[key] = str(source.get("id"))
        for trigger in source.get("triggers") or ():
            if trigger not in _TRIGGER_VALUES:
                errors.append(f"{label}: trigger {trigger!r} is not one of "
                              f"{', '.join(sorted(_TRIGGER_VALUES))}")
            elif trigger in owner_of_trigger:
                errors.append(f"{label}: trigger {trigger!r} is already owned by "
                              f"{owner_of_trigger[trigger]!r}")
            else:
                owner_of_trigger[trigger] = str(source.get("id"))
    for key in sorted(set(match_keys) - {TRIGGER_CONDITION} - set(owner_of_condition)):
        errors.append(f"{SECTION}: no source owns the catalog condition {key!r}")
    for trigger in sorted(_TRIGGER_VALUES - set(owner_of_trigger)):
        errors.append(f"{SECTION}: no source owns the trigger {trigger!r}")
    return errors


def rule_problems(rule: Mapping[str, Any], sources: EvidenceSources) -> list[str]:
    """A rule asking its evidence for more than its owners allow (``action``, ``repeat.action``)."""
    match = rule.get("match")
    if not isinstance(match, Mapping) or not match:
        return []
    allowed = sources.allowed(match)
    owners = ", ".join(f"{s.id} ({s.owner})" for s in sources.of_match(match)) or "no known source"
    errors = []
    wanted = [("action", rule.get("action"))]
    repeat = rule.get("repeat")
    if isinstance(repeat, Mapping):
        wanted.append(("repeat.action", repeat.get("action")))
    for field_, value in wanted:
        if value in {a.value for a in Action} and exceeds(Action(value), allowed):
            errors.append(f"field '{field_}': {value} needs evidence the stack or the node owns; this "
                          f"rule's conditions rest on {owners}, which may trigger at most {allowed.value} "
                          "alone (evidence_sources; a tenant's word only makes the node a suspect for the "
                          "DCGM check)")
    if rule.get("skip_health_check") is True and sources.tenant_only(match):
        errors.append(f"field 'skip_health_check': this rule's evidence is only the tenant's ({owners}): "
                      "it cannot skip the stack's own DCGM check")
    return errors


def table_lines(sources: EvidenceSources) -> list[str]:
    """docs/remediation.md's table "what each kind of evidence may do alone" (a test keeps the
    page equal to this)."""
    lines = ["| source | owner | what it is | catalog conditions | may trigger alone |",
             "|---|---|---|---|---|"]
    for s in sources.sources:
        held = [f"`{c}`" for c in s.conditions] + [f"trigger `{t.value}`" for t in s.triggers]
        where = ", ".join(held) or f"none ({s.acted_on_by})"
        lines.append(f"| `{s.id}` | {s.owner} | {s.description} | {where} | `{s.max_action.value}` |")
    return lines
