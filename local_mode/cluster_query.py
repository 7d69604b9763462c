"""The part of the ECS cluster query language the simulation evaluates: attribute
expressions, as in a ``memberOf`` placement constraint or the ``filter`` of
ListContainerInstances (moto does not implement that filter).

Supported: ``attribute:<name> exists``, ``attribute:<name> !exists``,
``attribute:<name> == <value>``, ``attribute:<name> != <value>``, and ``registeredAt``
compared (``==``, ``!=``, ``>``, ``>=``, ``<``, ``<=``) with a date in one of ECS's formats
(``2018-06-18T22:28:28+00:00``, ``2018-06-18T22:28:28Z``, ``2018-06-18T22:28:28``,
``2018-06-18``: the cluster query language's page), ``ec2InstanceId == i-...`` and
``ec2InstanceId in ['i-...', 'i-...']`` (AWS's notices name instances), joined by ``and``.
Anything else raises ``ValueError`` (ECS answers InvalidParameterException), so a test
never passes on an expression the simulation silently ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime

_CLAUSE = re.compile(
    r"^attribute:(?P<name>[A-Za-z0-9_.\-/:]+)\s+(?P<op>!exists|exists|==|!=)\s*(?P<value>\S*)$")


_REGISTERED = re.compile(r"^registeredAt\s*(?P<op>==|!=|>=|<=|>|<)\s*(?P<value>\S+)$")
_EC2_ID = re.compile(r"^ec2InstanceId\s+(?P<op>==|in)\s*(?P<value>.+)$")
_DATE_FORMATS = ("%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d")


def _date(value: str) -> float:
    for fmt in _DATE_FORMATS:
        try:
            parsed = datetime.strptime(value, fmt)
        except ValueError:
            continue
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
    raise ValueError(f"registeredAt takes a date such as 2018-06-18T22:28:28Z, got {value!r}")


def _ec2_ids(op: str, value: str) -> set[str]:
    if op == "==":
        return {value.strip().strip("'\"")}
    inner = value.strip()
    if not (inner.startswith("[") and inner.endswith("]")):
        raise ValueError(f"ec2InstanceId in takes a list such as ['i-abcd1234'], got {value!r}")
    return {v.strip().strip("'\"") for v in inner[1:-1].split(",") if v.strip()}


def matches(expression: str, attributes: Mapping[str, str | None],
            registered_at: float | None = None, ec2_instance_id: str = "") -> bool:
    """Whether a container instance with ``attributes`` (name -> value), registered at
    ``registered_at`` (epoch seconds), on ``ec2_instance_id``, satisfies ``expression``."""
    clauses = [c.strip() for c in re.split(r"\s+and\s+", expression.strip()) if c.strip()]
    if not clauses:
        raise ValueError(f"empty cluster query expression: {expression!r}")
    for clause in clauses:
        ec2 = _EC2_ID.match(clause)
        if ec2 is not None:
            if ec2_instance_id not in _ec2_ids(ec2["op"], ec2["value"]):
                return False
            continue
        registered = _REGISTERED.match(clause)
        if registered is not None:
            when, at = _date(registered["value"]), float(registered_at or 0.0)
            if not {"==": at == when, "!=": at != when, ">": at > when, ">=": at >= when, "<": at < when,
                    "<=": at <= when}[registered["op"]]:
                return False
            continue
        found = _CLAUSE.match(clause)
        if found is None:
            raise ValueError(f"cluster query expression not supported by the simulation: {clause!r}")
        name, op, value = found["name"], found["op"], found["value"]
        if op in ("exists", "!exists") and value:
            raise ValueError(f"{op} takes no value: {clause!r}")
        if op in ("==", "!=") and not value:
            raise ValueError(f"{op} needs a value: {clause!r}")
        present = name in attributes
        ok = {"exists": present, "!exists": not present,
              "==": present and str(attributes[name] or "") == value,
              "!=": not present or str(attributes[name] or "") != value}[op]
        if not ok:
            return False
    return True
