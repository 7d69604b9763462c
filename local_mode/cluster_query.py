"""The part of the ECS cluster query language the simulation evaluates: attribute
expressions, as in a ``memberOf`` placement constraint or the ``filter`` of
ListContainerInstances (moto does not implement that filter).

Supported: ``attribute:<name> exists``, ``attribute:<name> !exists``,
``attribute:<name> == <value>``, ``attribute:<name> != <value>``, joined by ``and``.
Anything else raises ``ValueError`` (ECS answers InvalidParameterException), so a test
never passes on an expression the simulation silently ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_CLAUSE = re.compile(
    r"^attribute:(?P<name>[A-Za-z0-9_.\-/:]+)\s+(?P<op>!exists|exists|==|!=)\s*(?P<value>\S*)$")


def matches(expression: str, attributes: Mapping[str, str | None]) -> bool:
    """Whether a container instance with ``attributes`` (name -> value) satisfies
    ``expression``."""
    clauses = [c.strip() for c in re.split(r"\s+and\s+", expression.strip()) if c.strip()]
    if not clauses:
        raise ValueError(f"empty cluster query expression: {expression!r}")
    for clause in clauses:
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
