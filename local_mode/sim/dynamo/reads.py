"""BatchGetItem, Query and Scan: pages over a table or a GSI partition, projections, filters."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from typing import Any

from moto.dynamodb.exceptions import DynamodbException
from moto.dynamodb.models.dynamo_type import DynamoType, Item
from moto.dynamodb.parsing.key_condition_expression import parse_expression as parse_key_condition

from .core import DynamoCore
from .expressions import _check_tokens_used, _condition
from .projections import project, projection_paths, read_projection
from .storage import _Index, _project, _read_units, _Table, _Usages
from .values import (
    MAX_BATCH_GET_BYTES,
    MAX_BATCH_GET_KEYS,
    MAX_PAGE_BYTES,
    _copy,
    _from_moto,
    _python,
    _sortable,
    _typed,
    _validation,
    item_size,
)


class Reads(DynamoCore):
    """The multi-item reads of :class:`~local_mode.sim.dynamo.MemoryDynamo`."""

    def _op_BatchGetItem(self, p: dict[str, Any], usages: _Usages, _invocation: str) -> dict[str, Any]:
        requests = p["RequestItems"]
        total_keys = sum(len(r.get("Keys") or []) for r in requests.values())
        if total_keys > MAX_BATCH_GET_KEYS:
            raise _validation("Too many items requested for the BatchGetItem call")
        # Each table's projection is checked before any read (a refusal refuses the call).
        projections = {name: read_projection(request) for name, request in requests.items()}
        responses: dict[str, list[dict[str, Any]]] = {}
        unprocessed: dict[str, Any] = {}
        returned = 0
        for name, request in requests.items():
            table = self._table(name)
            paths = projections[name]
            consistent = bool(request.get("ConsistentRead"))
            seen: set[tuple[Any, ...]] = set()
            found: list[dict[str, Any]] = []
            for n, wire_key in enumerate(request.get("Keys") or []):
                key, _, _ = table.key_of(wire_key)
                if key in seen:
                    raise _validation("Provided list of item keys contains duplicates")
                seen.add(key)
                stored = table.items.get(key)
                size = stored.size if stored else 0
                if returned + size > MAX_BATCH_GET_BYTES:
                    left = dict(request)
                    left["Keys"] = list(request["Keys"][n:])
                    unprocessed[name] = left
                    break
                self._count_read(usages, 1, size, _read_units(size, consistent))
                if stored is not None:
                    returned += size
                    item = stored.item if paths is None else project(stored.item, paths)
                    found.append(_copy(stored.python()) if item is stored.item
                                 else {k: _python(v) for k, v in item.attrs.items()})
            responses[name] = found
        return {"Responses": responses, "UnprocessedKeys": unprocessed}

    def _op_Query(self, p: dict[str, Any], usages: _Usages, _invocation: str) -> dict[str, Any]:
        table, index_name, index = self._read_target(p)
        consistent = bool(p.get("ConsistentRead"))
        if index_name and consistent:
            raise _validation("Consistent reads are not supported on global secondary indexes")
        expression = p.get("KeyConditionExpression")
        if not expression:
            raise _validation("Either the KeyConditions or KeyConditionExpression parameter must be "
                              "specified in the request.")
        _check_tokens_used(p, expression, p.get("FilterExpression"), p.get("ProjectionExpression"))
        schema = [{"AttributeName": index.hash_key, "KeyType": "HASH"}]
        if index.range_key:
            schema.append({"AttributeName": index.range_key, "KeyType": "RANGE"})
        try:
            hash_conditions, range_conditions, _ = parse_key_condition(
                expression, dict(p.get("ExpressionAttributeValues") or {}),
                dict(p.get("ExpressionAttributeNames") or {}), schema)
        except DynamodbException as error:
            raise _from_moto(error) from None
        (_, hash_value), = hash_conditions
        hashed = _sortable(DynamoType(hash_value))
        partition = index.partitions.get(hashed, [])
        entries = _range_slice(partition, range_conditions)
        forward = p.get("ScanIndexForward", True) is not False
        if not forward:
            entries = list(reversed(entries))
        start = p.get("ExclusiveStartKey")
        if start is not None:
            entries = _after(entries, table, index, start, forward)
        return self._page(p, usages, table, index, entries, consistent, partition=hashed)

    def _read_target(self, p: Mapping[str, Any]) -> tuple[_Table, str | None, _Index]:
        """A Query's or Scan's table, the index it names (None: the table's own) and that index."""
        table = self._table(p["TableName"])
        index_name = p.get("IndexName")
        index = table.primary if not index_name else table.gsis.get(index_name)
        if index is None:
            raise _validation(f"The table does not have the specified index: {index_name}")
        return table, index_name, index

    def _page(self, p: Mapping[str, Any], usages: _Usages, table: _Table, index: _Index,
              entries: Iterable[tuple[Any, tuple[Any, ...]]], consistent: bool,
              partition: Any = None) -> dict[str, Any]:
        """One page; ``partition``: the Query's partition key value (its read units are
        taken on that partition when throughput is modelled; a Scan's are not)."""
        limit = p.get("Limit")
        if limit is not None and limit < 1:
            raise _validation("Limit must be greater than or equal to 1")
        filter_op = _condition(p.get("FilterExpression"), p.get("ExpressionAttributeNames"),
                               p.get("ExpressionAttributeValues"), "FilterExpression")
        projection = p.get("ProjectionExpression")
        paths = projection_paths(projection, p.get("ExpressionAttributeNames") or {}) if projection else None
        select = p.get("Select") or "ALL_ATTRIBUTES"
        items: list[dict[str, Any]] = []
        evaluated = matched = size = 0
        last: Item | None = None
        more = False
        for _, key in entries:
            stored = table.items[key]
            item = _project(index, table, stored.item)
            item_bytes = stored.size if item is stored.item else item_size(item.attrs)
            if evaluated and size + item_bytes > MAX_PAGE_BYTES:
                more = True
                break
            evaluated += 1
            size += item_bytes
            last = item
            if filter_op is None or filter_op.expr(item):
                matched += 1
                if select != "COUNT":
                    if paths is not None:
                        items.append({k: _python(v) for k, v in project(item, paths).attrs.items()})
                    elif item is stored.item:
                        items.append(_copy(stored.python()))
                    else:
                        items.append({k: _python(v) for k, v in item.attrs.items()})
            if limit is not None and evaluated >= limit:
                more = True
                break
        if partition is not None:
            load = ((table.name, index.name, partition), _read_units(size, consistent))
            throttled = self._throttled([load], write=False)
            if throttled is not None:
                raise throttled
        self._count_read(usages, evaluated, size, _read_units(size, consistent))
        out: dict[str, Any] = {"Count": matched, "ScannedCount": evaluated}
        if select != "COUNT":
            out["Items"] = items
        if more and last is not None:
            lek = {n: _python(last.attrs[n]) for n in table.key_names}
            for name in (index.hash_key, index.range_key):
                if name:
                    lek[name] = _python(last.attrs[name])
            out["LastEvaluatedKey"] = lek
        return out

    def _op_Scan(self, p: dict[str, Any], usages: _Usages, _invocation: str) -> dict[str, Any]:
        table, index_name, index = self._read_target(p)
        _check_tokens_used(p, p.get("FilterExpression"), p.get("ProjectionExpression"))
        keys = sorted(index.entries) if index_name else sorted(table.items)
        entries = [((), k) for k in keys]
        start = p.get("ExclusiveStartKey")
        if start is not None:
            key, _, _ = table.key_of({n: start[n] for n in table.key_names})
            entries = [e for e in entries if e[1] > key]
        return self._page(p, usages, table, index, entries, bool(p.get("ConsistentRead")))

    # --- batch write and transactions ------------------------------------------------------



_Entry = tuple[Any, tuple[Any, ...]]  # (sort value, table key) in an index partition


def _range_slice(partition: list[_Entry], conditions: list[tuple[str, str, list[dict[str, Any]]]]
                 ) -> list[_Entry]:
    """The entries of a partition (sorted by sort key) that meet the range condition."""
    if not conditions:
        return list(partition)
    (_, comparison, values), = conditions
    bounds = [_sortable(DynamoType(v)) for v in values]
    op = comparison.upper()
    lo, hi = 0, len(partition)

    def left(v: Any) -> int:
        return bisect_left(partition, v, key=lambda e: e[0])

    def right(v: Any) -> int:
        return bisect_right(partition, v, key=lambda e: e[0])

    if op == "=":
        lo, hi = left(bounds[0]), right(bounds[0])
    elif op == "<":
        hi = left(bounds[0])
    elif op == "<=":
        hi = right(bounds[0])
    elif op == ">":
        lo = right(bounds[0])
    elif op == ">=":
        lo = left(bounds[0])
    elif op == "BETWEEN":
        if bounds[0] > bounds[1]:
            raise _validation("Invalid KeyConditionExpression: The BETWEEN operator requires upper bound "
                              "to be greater than or equal to lower bound")
        lo, hi = left(bounds[0]), right(bounds[1])
    elif op == "BEGINS_WITH":
        prefix = bounds[0]
        lo = left(prefix)
        hi = lo
        while hi < len(partition) and partition[hi][0][:len(prefix)] == prefix:
            hi += 1
    else:
        raise _validation(f"Invalid KeyConditionExpression: unsupported operator {comparison}")
    return partition[lo:hi]


def _after(entries: list[tuple[Any, tuple[Any, ...]]], table: _Table, index: _Index,
           start: Mapping[str, Any], forward: bool) -> list[tuple[Any, tuple[Any, ...]]]:
    """Entries strictly after an ExclusiveStartKey (in the query's direction)."""
    key, _, _ = table.key_of({n: start[n] for n in table.key_names if n in start})
    sort = _sortable(_typed(start[index.range_key])) if index.range_key and index.range_key in start else None
    marker = (sort, key)
    if forward:
        return [e for e in entries if e > marker]
    return [e for e in entries if e < marker]
