"""The emulated account's state the stateful request limits read: a container instance's
custom attributes and the tables' key schemas, from moto's backend (the moto world) or from
the scale world's own control plane."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .prose_limits import is_custom_attribute

KeySchemas = Mapping[str, tuple[str, str | None]]


def key_schemas(tables: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[str, str | None]]:
    """Table name -> (partition key, sort key) from CreateTable-style definitions."""
    out: dict[str, tuple[str, str | None]] = {}
    for name, definition in tables.items():
        keys = {k["KeyType"]: k["AttributeName"] for k in definition.get("KeySchema", [])}
        out[name] = (keys["HASH"], keys.get("RANGE"))
    return out


def _short(ref: str) -> str:
    return str(ref).rsplit("/", 1)[-1]


class MotoState:
    """moto's ECS backend (container instances' attributes) and the stack's tables."""

    def __init__(self, account_id: str, region: str, tables: KeySchemas) -> None:
        self._account_id = account_id
        self._region = region
        self._tables = dict(tables)

    def custom_attributes(self, cluster: str | None, target: str) -> Mapping[str, Any] | None:
        from moto.ecs.models import ecs_backends

        backend = ecs_backends[self._account_id][self._region]
        by_cluster = backend.container_instances.get(_short(cluster or "default"), {})
        instance = by_cluster.get(_short(target))
        if instance is None:
            return None
        return {k: v for k, v in (instance.attributes or {}).items() if is_custom_attribute(k)}

    def key_schema(self, table: str) -> tuple[str, str | None] | None:
        return self._tables.get(_short(table))


class ClusterState:
    """The scale world's ECS cluster (``node_by_ref``: a container instance by ARN or id)
    and its tables."""

    def __init__(self, node_by_ref: Callable[[str], Any], tables: KeySchemas) -> None:
        self._node_by_ref = node_by_ref
        self._tables = dict(tables)

    def custom_attributes(self, cluster: str | None, target: str) -> Mapping[str, Any] | None:
        node = self._node_by_ref(target)
        if node is None:
            return None
        return {k: v for k, v in node.attributes.items() if is_custom_attribute(k)}

    def key_schema(self, table: str) -> tuple[str, str | None] | None:
        return self._tables.get(_short(table))
