"""Tables and their GSIs as Python dictionaries with sorted index partitions, and the meter of
what each call reads and writes (items, capacity units)."""

from __future__ import annotations

import math
import time as _time
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from moto.dynamodb.models.dynamo_type import DynamoType, Item

from .values import (
    MAX_ITEM_BYTES,
    READ_UNIT_BYTES,
    WRITE_UNIT_BYTES,
    _new_item,
    _python,
    _sortable,
    _typed,
    _validation,
    _wire,
    value_size,
)


# ================================================================== metering
@dataclass
class Usage:
    """DynamoDB consumption of one label (or of everything)."""

    calls: Counter[str] = field(default_factory=Counter)
    items_read: int = 0
    bytes_read: int = 0
    read_units: float = 0.0
    items_written: int = 0
    write_units: float = 0.0
    index_write_units: float = 0.0
    failed_writes: int = 0  # condition failed, cancelled, conflict, refused
    conflicts: int = 0  # TransactionConflict / TransactionConflictException
    conflicts_by_item: Counter[str] = field(default_factory=Counter)  # table:key -> conflicts on it
    largest_item_bytes: int = 0
    largest_item: str = ""  # table and key of the largest item written
    errors: Counter[str] = field(default_factory=Counter)

    def add(self, other: Usage) -> None:
        self.calls.update(other.calls)
        self.errors.update(other.errors)
        self.conflicts_by_item.update(other.conflicts_by_item)
        for name in ("items_read", "bytes_read", "read_units", "items_written", "write_units",
                     "index_write_units", "failed_writes", "conflicts"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.largest_item_bytes > self.largest_item_bytes:
            self.largest_item_bytes, self.largest_item = other.largest_item_bytes, other.largest_item

    def as_dict(self) -> dict[str, Any]:
        return {"calls": dict(sorted(self.calls.items())), "items_read": self.items_read,
                "bytes_read": self.bytes_read, "read_units": round(self.read_units, 1),
                "items_written": self.items_written, "write_units": round(self.write_units, 1),
                "index_write_units": round(self.index_write_units, 1), "failed_writes": self.failed_writes,
                "conflicts": self.conflicts,
                "conflicts_by_item": dict(self.conflicts_by_item.most_common()),
                "largest_item_bytes": self.largest_item_bytes,
                "largest_item": self.largest_item, "errors": dict(sorted(self.errors.items()))}


class Meter:
    """Usage in total and per label; ``reset()`` starts a new measurement."""

    def __init__(self) -> None:
        self.total = Usage()
        self.by_label: dict[str, Usage] = {}

    def usage(self, label: str) -> tuple[Usage, Usage]:
        per = self.by_label.get(label)
        if per is None:
            per = self.by_label[label] = Usage()
        return self.total, per

    def reset(self) -> None:
        self.total = Usage()
        self.by_label = {}


_Usages = tuple[Usage, Usage]  # (total, the caller's label)


def _read_units(size: int, consistent: bool) -> float:
    units = max(1, math.ceil(size / READ_UNIT_BYTES))
    return float(units) if consistent else units / 2


def _write_units(size: int) -> float:
    return float(max(1, math.ceil(size / WRITE_UNIT_BYTES)))


# ================================================================== storage
class _Stored:
    """One stored item, with its size and Python form cached per top-level attribute (an
    update recomputes only the attributes it touched)."""

    __slots__ = ("_py", "attr_py", "attr_sizes", "item", "size")

    def __init__(self, item: Item, attr_sizes: dict[str, int], attr_py: dict[str, Any] | None = None) -> None:
        self.item = item
        self.attr_sizes = attr_sizes
        self.size = sum(attr_sizes.values())
        self.attr_py: dict[str, Any] = attr_py if attr_py is not None else {}
        self._py: dict[str, Any] | None = None

    def python(self) -> dict[str, Any]:
        if self._py is None:
            cache = self.attr_py
            out = {}
            for name, value in self.item.attrs.items():
                converted = cache.get(name, _MISSING)
                if converted is _MISSING:
                    converted = cache[name] = _python(value)
                out[name] = converted
            self._py = out
        return self._py


_MISSING = object()


def _attr_sizes(attrs: Mapping[str, Any], previous: _Stored | None = None,
                touched: set[str] | None = None) -> dict[str, int]:
    """Bytes per top-level attribute (name + value); untouched ones are taken from
    ``previous``."""
    sizes = {}
    for name, value in attrs.items():
        if previous is not None and touched is not None and name not in touched \
                and name in previous.attr_sizes:
            sizes[name] = previous.attr_sizes[name]
        else:
            sizes[name] = len(name.encode()) + value_size(_typed(value))
    return sizes


@dataclass
class _Index:
    """A GSI (or the table's own key, ``name`` ""): partitions of (sort, table key) lists."""

    name: str
    hash_key: str
    range_key: str | None
    projection: str  # ALL | KEYS_ONLY | INCLUDE
    include: frozenset[str] = frozenset()
    partitions: dict[Any, list[tuple[Any, tuple[Any, ...]]]] = field(default_factory=dict)
    entries: dict[tuple[Any, ...], tuple[Any, Any]] = field(default_factory=dict)  # key -> (hash, sort)

    def position(self, item: Item) -> tuple[Any, Any] | None:
        h = item.attrs.get(self.hash_key)
        if h is None:
            return None
        if self.range_key is None:
            return _sortable(h), None
        r = item.attrs.get(self.range_key)
        return None if r is None else (_sortable(h), _sortable(r))

    def put(self, key: tuple[Any, ...], item: Item | None) -> None:
        old = self.entries.get(key)
        new = self.position(item) if item is not None else None
        if old == new:
            return
        if old is not None:
            part = self.partitions[old[0]]
            entry = (old[1], key)
            i = bisect_left(part, entry)
            if i < len(part) and part[i] == entry:
                del part[i]
            if not part:
                del self.partitions[old[0]]
            del self.entries[key]
        if new is not None:
            part = self.partitions.setdefault(new[0], [])
            entry = (new[1], key)
            part.insert(bisect_right(part, entry), entry)
            self.entries[key] = new


class _TableShape:
    """What moto's update validator reads from a table."""

    def __init__(self, table_key_attrs: list[str], attribute_keys: list[str], attr: list[dict[str, str]]):
        self.table_key_attrs = table_key_attrs
        self.attribute_keys = attribute_keys
        self.attr = attr


class _Table:
    def __init__(self, name: str, definition: Mapping[str, Any]) -> None:
        self.name = name
        self.definition = dict(definition)
        self.created = _time.time()
        self.ttl: dict[str, Any] = {"TimeToLiveStatus": "DISABLED"}
        schema = {k["KeyType"]: k["AttributeName"] for k in definition["KeySchema"]}
        self.hash_key: str = schema["HASH"]
        self.range_key: str | None = schema.get("RANGE")
        self.attr_types = {a["AttributeName"]: a["AttributeType"]
                           for a in definition.get("AttributeDefinitions", [])}
        self.items: dict[tuple[Any, ...], _Stored] = {}
        self.primary = _Index("", self.hash_key, self.range_key, "ALL")
        self.gsis: dict[str, _Index] = {}
        for gsi in definition.get("GlobalSecondaryIndexes") or []:
            keys = {k["KeyType"]: k["AttributeName"] for k in gsi["KeySchema"]}
            projection = gsi.get("Projection") or {"ProjectionType": "ALL"}
            self.gsis[gsi["IndexName"]] = _Index(
                gsi["IndexName"], keys["HASH"], keys.get("RANGE"), projection["ProjectionType"],
                frozenset(projection.get("NonKeyAttributes") or ()))
        self.key_names = [k for k in (self.hash_key, self.range_key) if k]
        index_keys = {k for i in self.gsis.values() for k in (i.hash_key, i.range_key) if k}
        self.shape = _TableShape(self.key_names, [*self.key_names, *sorted(index_keys)],
                                 list(definition.get("AttributeDefinitions", [])))

    # --- keys ------------------------------------------------------------------
    def key_of(self, key: Mapping[str, Any], operation: str = "") -> tuple[tuple[Any, ...], DynamoType,
                                                                             DynamoType | None]:
        """The storage key of a Key parameter (exactly the key schema, right types)."""
        if set(key) != set(self.key_names):
            raise _validation("The provided key element does not match the schema")
        typed = {}
        for name in self.key_names:
            value = _typed(key[name])
            expected = self.attr_types.get(name)
            if value.type != expected:
                raise _validation("The provided key element does not match the schema")
            if value.type in ("S", "B") and not value.value:
                raise _validation("One or more parameter values are not valid. The AttributeValue for a key "
                                  f"attribute cannot contain an empty string value. Key: {name}")
            typed[name] = value
        h = typed[self.hash_key]
        r = typed[self.range_key] if self.range_key else None
        return ((_sortable(h),) if r is None else (_sortable(h), _sortable(r))), h, r

    def key_from_item(self, attrs: Mapping[str, Any]) -> tuple[tuple[Any, ...], DynamoType,
                                                                DynamoType | None]:
        for name in self.key_names:
            if name not in attrs:
                raise _validation("One or more parameter values were invalid: Missing the key "
                                  f"{name} in the item")
            value = _typed(attrs[name])
            if value.type != self.attr_types.get(name):
                raise _validation(f"One or more parameter values were invalid: Type mismatch for key {name} "
                                  f"expected: {self.attr_types.get(name)} actual: {value.type}")
        return self.key_of({n: attrs[n] for n in self.key_names})

    def key_label(self, key: tuple[Any, ...]) -> str:
        return f"{self.name}:{'/'.join(str(k) for k in key)}"

    def wire_key(self, item: Item) -> dict[str, Any]:
        return {n: _wire(item.attrs[n]) for n in self.key_names}

    # --- writes ----------------------------------------------------------------
    def check_new_image(self, item: Item, *, update: bool, previous: _Stored | None = None,
                        touched: set[str] | None = None) -> _Stored:
        """Index key types and the item size limit; the record to store. ``touched``: the
        top-level attributes an update may have changed (the others are ``previous``'s)."""
        for index in self.gsis.values():
            for name in (index.hash_key, index.range_key):
                if name is None or name not in item.attrs:
                    continue
                value = item.attrs[name]
                expected = self.attr_types.get(name)
                if value.type != expected:
                    raise _validation("One or more parameter values were invalid: Type mismatch for Index "
                                      f"Key {name} Expected: {expected} Actual: {value.type} "
                                      f"IndexName: {index.name}")
                if value.type in ("S", "B") and not value.value:
                    raise _validation("One or more parameter values are not valid. A value specified for a "
                                      "secondary index key is not supported. The AttributeValue for a key "
                                      f"attribute cannot contain an empty string value. IndexName: "
                                      f"{index.name}, IndexKey: {name}")
        stored = _Stored(item, _attr_sizes(item.attrs, previous, touched))
        if stored.size > MAX_ITEM_BYTES:
            raise _validation("Item size to update has exceeded the maximum allowed size" if update
                              else "Item size has exceeded the maximum allowed size")
        if previous is not None and touched is not None:
            stored.attr_py = {k: v for k, v in previous.attr_py.items() if k not in touched}
        return stored

    def write_loads(self, key: tuple[Any, ...], new: _Stored | None, touched: set[str] | None,
                    units: float) -> list[tuple[tuple[str, str, Any], float]]:
        """The partitions a write of ``key`` (``new`` None: a delete) would take units on,
        and how many: the table's (``units``), and each index entry it removes, adds or
        rewrites (``throughput.PartitionThroughput``); nothing is changed."""
        old = self.items.get(key)
        item = new.item if new is not None else None
        loads: list[tuple[tuple[str, str, Any], float]] = [((self.name, "", key[0]), units)]
        for index in self.gsis.values():
            before = index.entries.get(key)
            after = index.position(item) if item is not None else None
            if before != after:
                if before is not None:
                    loads.append(((self.name, index.name, before[0]), _index_units(index, old)))
                if after is not None:
                    loads.append(((self.name, index.name, after[0]), _index_units(index, new)))
            elif after is not None and old is not None and item is not None \
                    and _projected_changed(index, self, old.item, item, touched):
                loads.append(((self.name, index.name, after[0]), _index_units(index, new)))
        return loads

    def store(self, key: tuple[Any, ...], new: _Stored | None, touched: set[str] | None = None) -> float:
        """Write (or delete, ``new`` None); returns the GSI write units it costs."""
        old = self.items.get(key)
        item = new.item if new is not None else None
        if new is None:
            self.items.pop(key, None)
        else:
            self.items[key] = new
        self.primary.put(key, item)
        units = 0.0
        for index in self.gsis.values():
            before = index.entries.get(key)
            index.put(key, item)
            after = index.entries.get(key)
            if before is None and after is None:
                continue
            if before != after:
                units += (before is not None) + (after is not None)
            elif old is not None and item is not None and \
                    _projected_changed(index, self, old.item, item, touched):
                units += 1
        return units


def _index_units(index: _Index, stored: _Stored | None) -> float:
    """Write units of one index entry: an ALL projection copies the item (1 per KB); a
    KEYS_ONLY or INCLUDE entry is counted as one unit."""
    if index.projection == "ALL" and stored is not None:
        return _write_units(stored.size)
    return 1.0


def _projected_changed(index: _Index, table: _Table, old: Item, new: Item, touched: set[str] | None) -> bool:
    if index.projection == "KEYS_ONLY":
        return False
    if index.projection == "ALL":
        names: Iterable[str] = touched if touched is not None else set(old.attrs) | set(new.attrs)
    else:
        names = index.include | {index.hash_key, index.range_key, *table.key_names} - {None}
        if touched is not None:
            names = set(names) & touched
    return any(_differ(old.attrs.get(n), new.attrs.get(n)) for n in names)


def _differ(a: DynamoType | None, b: DynamoType | None) -> bool:
    if a is None or b is None:
        return a is not b
    return bool(a != b)


def _project(index: _Index, table: _Table, item: Item) -> Item:
    if index.projection == "ALL" or not index.name:
        return item
    keep = {*table.key_names, index.hash_key, *([index.range_key] if index.range_key else [])}
    if index.projection == "INCLUDE":
        keep |= index.include
    return _new_item(item.hash_key, item.range_key, {k: v for k, v in item.attrs.items() if k in keep})
