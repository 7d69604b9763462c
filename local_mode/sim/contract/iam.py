"""A small IAM identity-policy evaluator: Allow and Deny statements with wildcards in actions
and resources and the condition operators the stack's policies use.

IAM's rules as the IAM User Guide states them ("Policy evaluation logic", "IAM JSON policy
elements"), for identity-based policies in one account (no resource policies, boundaries,
SCPs or session policies: the stack's functions have none):

* a request is allowed when some Allow statement matches it and no Deny statement does
  (an explicit Deny wins; nothing matching is an implicit deny);
* ``Action`` / ``NotAction`` match case-insensitively, ``Resource`` / ``NotResource``
  case-sensitively, both with ``*`` (any run of characters) and ``?`` (one character);
* every condition operator of a statement must hold, every key of an operator must hold,
  and a key holds when any of the policy's values matches any of the request's (for a
  single-valued key: its one value). ``ForAllValues:`` holds when every request value
  matches some policy value (vacuously for an absent key), ``ForAnyValue:`` when one does;
  ``...IfExists`` holds for an absent key; any other operator fails for an absent key
  (``Null`` tests presence). Condition keys are case-insensitive.

A condition key the caller does not supply for that action is *unknown to the evaluator*,
not "absent": such a statement cannot be decided and is reported (:class:`Decision.unknown`)
instead of silently matching or not matching.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: condition operators (without set prefix or IfExists) -> how a policy value matches a request value
_STRING_OPS = {"StringEquals", "StringNotEquals", "StringEqualsIgnoreCase", "StringNotEqualsIgnoreCase",
               "StringLike", "StringNotLike"}
_ARN_OPS = {"ArnEquals", "ArnNotEquals", "ArnLike", "ArnNotLike"}
_NUMERIC_OPS = {"NumericEquals", "NumericNotEquals", "NumericLessThan", "NumericLessThanEquals",
                "NumericGreaterThan", "NumericGreaterThanEquals"}
_NEGATED = {"StringNotEquals", "StringNotEqualsIgnoreCase", "StringNotLike", "ArnNotEquals", "ArnNotLike",
            "NumericNotEquals"}
SUPPORTED_OPERATORS = _STRING_OPS | _ARN_OPS | _NUMERIC_OPS | {"Bool", "Null"}


@functools.lru_cache(maxsize=4096)
def glob_regex(pattern: str, *, ignore_case: bool = False) -> re.Pattern[str]:
    """IAM's wildcard match: ``*`` any run of characters, ``?`` one; the rest literal."""
    parts = (".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)
    return re.compile("".join(parts), re.IGNORECASE | re.DOTALL if ignore_case else re.DOTALL)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


class PolicyError(ValueError):
    """A statement the evaluator cannot read (an unknown operator, a malformed element)."""


@dataclass(frozen=True)
class Condition:
    """One ``operator: {key: values}`` entry, split per key."""

    operator: str  # as written, e.g. "ForAllValues:StringEquals"
    base: str  # StringEquals
    qualifier: str  # "", "ForAllValues" or "ForAnyValue"
    if_exists: bool
    key: str  # lower-case
    values: tuple[str, ...]

    def holds(self, request: Sequence[str] | None) -> bool:
        """``request``: the request's values of the key (None: the key is absent)."""
        if self.base == "Null":
            wanted = self.values[0].lower() == "true"
            return (request is None or not request) == wanted
        if request is None or (not request and self.qualifier != "ForAllValues"):
            if self.qualifier == "ForAllValues":
                return True
            return self.if_exists
        if self.qualifier == "ForAllValues":
            return all(self._matches_any(v) for v in request)
        return any(self._matches_any(v) for v in request)

    def _matches_any(self, value: str) -> bool:
        negated = self.base in _NEGATED
        matched = any(self._match(policy_value, value) for policy_value in self.values)
        return not matched if negated else matched

    def _match(self, policy: str, value: str) -> bool:
        base = self.base
        if base in ("StringEquals", "StringNotEquals"):
            return policy == value
        if base in ("StringEqualsIgnoreCase", "StringNotEqualsIgnoreCase"):
            return policy.lower() == value.lower()
        if base in ("StringLike", "StringNotLike"):
            return glob_regex(policy).fullmatch(value) is not None
        if base in _ARN_OPS:
            return arn_matches(policy, value)
        if base in _NUMERIC_OPS:
            a, b = float(value), float(policy)
            return {"NumericEquals": a == b, "NumericNotEquals": a == b, "NumericLessThan": a < b,
                    "NumericLessThanEquals": a <= b, "NumericGreaterThan": a > b,
                    "NumericGreaterThanEquals": a >= b}[base]
        if base == "Bool":
            return policy.lower() == value.lower()
        raise PolicyError(f"condition operator {self.operator} is not supported")


def arn_matches(policy: str, value: str) -> bool:
    """ArnEquals / ArnLike (the same test): each of the six colon-separated parts matched on
    its own, wildcards allowed in each (a ``*`` does not reach into the next part)."""
    wanted, got = policy.split(":", 5), value.split(":", 5)
    return len(wanted) == len(got) == 6 and all(
        glob_regex(w).fullmatch(g) is not None for w, g in zip(wanted, got, strict=True))


def parse_conditions(block: Mapping[str, Any] | None) -> tuple[Condition, ...]:
    found: list[Condition] = []
    for operator, keys in (block or {}).items():
        qualifier, _, rest = operator.partition(":") if ":" in operator else ("", "", operator)
        if qualifier not in ("", "ForAllValues", "ForAnyValue"):
            raise PolicyError(f"condition operator {operator}: unknown set qualifier")
        base = rest.removesuffix("IfExists")
        if base not in SUPPORTED_OPERATORS:
            raise PolicyError(f"condition operator {operator} is not supported by the evaluator")
        if not isinstance(keys, Mapping):
            raise PolicyError(f"condition {operator}: a map of keys expected")
        for key, values in keys.items():
            found.append(Condition(operator, base, qualifier, rest.endswith("IfExists"), key.lower(),
                                   tuple(str(v).lower() if isinstance(v, bool) else str(v)
                                         for v in _as_list(values))))
    return tuple(found)


@dataclass(frozen=True)
class Statement:
    """One statement of a role's policies, its patterns compiled."""

    index: int  # its position in the function's list (the grants file)
    ident: str  # unique among the statements the guard knows (usage reports)
    sid: str
    effect: str  # Allow | Deny
    actions: tuple[str, ...]
    not_action: bool
    resources: tuple[str, ...]
    not_resource: bool
    conditions: tuple[Condition, ...]
    _action_res: tuple[re.Pattern[str], ...] = field(repr=False, compare=False, default=())
    _resource_res: tuple[re.Pattern[str], ...] = field(repr=False, compare=False, default=())

    @classmethod
    def from_json(cls, index: int, raw: Mapping[str, Any], ident: str = "") -> Statement:
        if ("Action" in raw) == ("NotAction" in raw) or ("Resource" in raw) == ("NotResource" in raw):
            raise PolicyError(f"statement {index}: exactly one of Action/NotAction and of "
                              "Resource/NotResource")
        effect = str(raw.get("Effect", ""))
        if effect not in ("Allow", "Deny"):
            raise PolicyError(f"statement {index}: Effect {effect!r}")
        actions = tuple(str(a) for a in _as_list(raw.get("Action", raw.get("NotAction"))))
        resources = tuple(str(r) for r in _as_list(raw.get("Resource", raw.get("NotResource"))))
        return cls(index, ident or str(index), str(raw.get("Sid", "")), effect, actions, "NotAction" in raw,
                   resources,
                   "NotResource" in raw, parse_conditions(raw.get("Condition")),
                   tuple(glob_regex(a, ignore_case=True) for a in actions),
                   tuple(glob_regex(r) for r in resources))

    def names_action(self, action: str) -> bool:
        hit = any(r.fullmatch(action) for r in self._action_res)
        return not hit if self.not_action else hit

    def names_resource(self, resource: str) -> bool:
        hit = any(r.fullmatch(resource) for r in self._resource_res)
        return not hit if self.not_resource else hit

    @property
    def condition_keys(self) -> frozenset[str]:
        return frozenset(c.key for c in self.conditions)


@dataclass
class Decision:
    """The outcome for one (action, resource, context)."""

    allowed: bool
    allowed_by: Statement | None = None
    denied_by: Statement | None = None
    #: statements that name the action and resource but whose conditions use keys the caller
    #: did not supply (not decidable): (statement, the keys)
    unknown: list[tuple[Statement, tuple[str, ...]]] = field(default_factory=list)
    #: statements that name the action and resource but whose conditions did not hold
    failed_conditions: list[Statement] = field(default_factory=list)


#: the key of a condition the request does not supply at all (not the same as absent: None)
_UNSUPPLIED = object()


class PolicySet:
    """One principal's statements, indexed by action for cheap repeated decisions."""

    def __init__(self, statements: Iterable[Statement]) -> None:
        self.statements = list(statements)
        self._by_action: dict[str, list[Statement]] = {}
        #: (action, resource) -> the statements naming both, and the condition keys they use
        self._by_request: dict[tuple[str, str], tuple[list[Statement], tuple[str, ...]]] = {}
        self._decided: dict[tuple[str, str, tuple[Any, ...]], Decision] = {}

    def candidates(self, action: str) -> list[Statement]:
        """The statements whose Action (or NotAction) covers ``action``."""
        key = action.lower()
        found = self._by_action.get(key)
        if found is None:
            found = [s for s in self.statements if s.names_action(action)]
            self._by_action[key] = found
        return found

    def decide(self, action: str, resource: str, context: Mapping[str, Sequence[str] | None]) -> Decision:
        """``context``: condition key (lower-case) -> the request's values, or None when the
        request has no such key; a key not in ``context`` at all is unknown to the caller.

        The decision is remembered (and the same object returned: do not modify it) keyed by
        everything it reads: the action, the resource, and for each condition key of the
        statements naming them whether the request supplies it and its values (a resource's
        tags included, as the caller read them for this request). A request with other tags,
        leading keys or cluster is a new key, never a stale answer."""
        found = self._by_request.get((action, resource))
        if found is None:
            named = [s for s in self.candidates(action) if s.names_resource(resource)]
            found = (named, tuple(sorted({k for s in named for k in s.condition_keys})))
            if len(self._by_request) < 65536:  # resources repeat (tables, the cluster): a bounded cache
                self._by_request[(action, resource)] = found
        named, keys = found
        try:  # not context.get: a Context answers its resource's tags through [] and `in` only
            key = (action, resource, tuple(context[k] if k in context else _UNSUPPLIED  # noqa: SIM401
                                           for k in keys))
            decision = self._decided.get(key)
        except TypeError:  # values of a kind that cannot key a cache (a list): decided afresh
            return self._decide(named, context)
        if decision is None:
            decision = self._decide(named, context)
            if len(self._decided) < 65536:
                self._decided[key] = decision
        return decision

    @staticmethod
    def _decide(named: list[Statement], context: Mapping[str, Sequence[str] | None]) -> Decision:
        decision = Decision(False)
        for statement in named:
            missing = tuple(sorted(k for k in statement.condition_keys if k not in context))
            if missing:
                decision.unknown.append((statement, missing))
                continue
            if not all(c.holds(context[c.key]) for c in statement.conditions):
                decision.failed_conditions.append(statement)
                continue
            if statement.effect == "Deny":
                decision.denied_by = statement
                decision.allowed = False
                return decision
            if decision.allowed_by is None:
                decision.allowed_by = statement
        # A Deny statement that could not be decided makes the decision no allow either.
        decision.allowed = decision.allowed_by is not None and not any(
            s.effect == "Deny" for s, _ in decision.unknown)
        return decision
