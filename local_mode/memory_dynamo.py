"""``MemoryDynamo``: an in-memory DynamoDB behind the boto3 *resource* API, fast enough for
recoveries of thousands of ranks (the scale simulator, ``local_mode/scale_sim.py``).

What the repositories call (``dynamodb.Table(name).get_item/put_item/update_item/
delete_item/query/scan`` and ``dynamodb.meta.client.update_item/transact_write_items/
batch_get_item/...``) is answered from Python dictionaries with hash indexes: a GetItem is
a dict lookup, a GSI Query touches only the partition it names (bisect on its sort key),
so a query costs O(results), never O(table) as moto's does.

What is real (not re-implemented):

* **boto3's type mapping**: parameters go through boto3's own ``TransformationInjector``
  (condition builders, ``TypeSerializer``: Decimal numbers, sets, a float is refused) with
  botocore's DynamoDB model, and are checked by botocore's ``ParamValidator``; results come
  back as ``TypeDeserializer`` would give them (Decimal, set, Binary).
* **expression semantics**: ConditionExpression / FilterExpression, UpdateExpression and
  KeyConditionExpression are parsed, validated and executed by moto's parsers, validators
  and executors (``moto.dynamodb.parsing`` / ``comparisons``), on this module's storage.
  Parsed expressions are cached by text (and names), values bound per call.
* **errors**: ``botocore.exceptions.ClientError`` subclasses of the DynamoDB model
  (``client.exceptions.ConditionalCheckFailedException`` ...) with DynamoDB's codes and
  messages: ConditionalCheckFailedException, ValidationException (the 400 KB item limit
  computed with DynamoDB's item-size rules, key schema, GSI key types, consistent reads
  on a GSI, unused expression names / values, 100 actions per transaction, one action per
  item), TransactionCanceledException with per-item ``CancellationReasons``
  (``ConditionalCheckFailed`` / ``TransactionConflict`` / ``ValidationError`` / ``None``),
  TransactionConflictException, ResourceNotFoundException.
* **result shapes**: ``ReturnValues`` (ALL_OLD, ALL_NEW, UPDATED_OLD, UPDATED_NEW),
  ``ReturnValuesOnConditionCheckFailure=ALL_OLD`` (the old item in the error, in DynamoDB
  JSON as boto3 leaves it), sparse GSIs with KEYS_ONLY / INCLUDE / ALL projections, key
  conditions ``= < <= > >= BETWEEN begins_with``, ``ScanIndexForward``, ``Limit``,
  ``ExclusiveStartKey`` / ``LastEvaluatedKey`` (given whenever a page stops at ``Limit`` or
  at 1 MB, as DynamoDB does), ``Select=COUNT``, BatchGetItem's 100 keys and 16 MB.

Modelled (configurable):

* **metering** (:class:`Meter`): per operation and per label (the simulator labels calls
  with the Lambda function that makes them): items read (GetItem / BatchGetItem: one per
  key requested, found or not; Query / Scan: items evaluated) and read units (strongly
  consistent: 1 per 4 KB per item, a Query's page rounded once; eventually consistent:
  half), items written and write units (1 per KB of the larger of the old and new image,
  at least 1; twice that in a transaction; a failed condition still costs its units), GSI
  write units, the largest item written (bytes, by DynamoDB's size rules).
* **transaction conflicts**: a TransactWriteItems touching an item that a committed
  transaction of *another* invocation touched less than ``tx_conflict_window`` simulated
  seconds earlier is cancelled (``TransactionConflict`` for that item, ``None`` for the
  others; nothing written); a PutItem / UpdateItem / DeleteItem of such an item fails with
  TransactionConflictException. Which invocation is calling and what time it is come from
  the ``context`` and ``now`` callables the simulator passes.
* **latency**: ``on_call(operation)`` is called after each call (the simulator advances
  the caller's simulated clock there).

The same store also answers real botocore clients (``LocalAws(dynamodb="memory")``, see
``local_mode.memory_backend``): :meth:`MemoryDynamo.respond` takes a call's parameters in
DynamoDB JSON, as a client holds them after boto3's mapping, and answers what botocore would
have parsed (an error as a response, not raised); CreateTable, DescribeTable, DeleteTable,
ListTables and the TTL settings are the control plane the emulator uses.

Not modelled: throughput throttling (on-demand tables), TTL expiry, streams, LSIs, PartiQL,
legacy parameters (``Expected``, ``AttributeUpdates``, ``KeyConditions``), eventual
consistency (every read sees the last write; GSI reads too).
"""

from __future__ import annotations

import base64
import itertools
import math
import re
import threading
import time as _time
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from functools import cache
from typing import Any

import botocore.session
from boto3.dynamodb.transform import ParameterTransformer, TransformationInjector
from boto3.dynamodb.types import DYNAMODB_CONTEXT, Binary, TypeSerializer
from botocore.exceptions import ClientError
from botocore.validate import ParamValidator
from moto.dynamodb.comparisons import AttributeValue, ConditionExpressionParser
from moto.dynamodb.exceptions import DynamodbException
from moto.dynamodb.models.dynamo_type import DynamoType, Item
from moto.dynamodb.parsing.ast_nodes import ExpressionAttribute, ExpressionAttributeName, Node
from moto.dynamodb.parsing.executors import UpdateExpressionExecutor
from moto.dynamodb.parsing.expressions import UpdateExpressionParser
from moto.dynamodb.parsing.key_condition_expression import parse_expression as parse_key_condition
from moto.dynamodb.parsing.validators import (
    ActionCountValidator,
    OverlappingPathsValidator,
    UpdateExpressionValidator,
    UpdateHashRangeKeyValidator,
)

from gpu_recovery import constants as C

MAX_ITEM_BYTES = 400 * 1024
MAX_PAGE_BYTES = 1024 * 1024  # a Query / Scan page
MAX_BATCH_GET_BYTES = 16 * 1024 * 1024
MAX_BATCH_GET_KEYS = 100
MAX_BATCH_WRITE_ITEMS = 25
MAX_TRANSACT_ITEMS = 100
READ_UNIT_BYTES = 4096
WRITE_UNIT_BYTES = 1024
DEFAULT_TX_CONFLICT_WINDOW = 0.03
_TOKEN = re.compile(r"[#:][A-Za-z0-9_]+")


# ================================================================== botocore model
@cache
def _botocore_client() -> Any:
    """A DynamoDB client that is never called: its model validates parameters and its
    ``exceptions`` are the modeled error classes boto3 raises."""
    session = botocore.session.get_session()
    return session.create_client("dynamodb", region_name="us-east-1", aws_access_key_id="memory",
                                 aws_secret_access_key="memory")  # noqa: S106 - never sent anywhere


@cache
def _operation_model(operation: str) -> Any:
    return _botocore_client().meta.service_model.operation_model(operation)


def _error(operation: str, code: str, message: str, **extra: Any) -> ClientError:
    """The ClientError subclass boto3 raises for ``code`` (DynamoDB answers 400)."""
    response: dict[str, Any] = {"Error": {"Code": code, "Message": message},
                                "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {},
                                                     "RetryAttempts": 0}}
    response.update(extra)
    cls = _botocore_client().exceptions.from_code(code)
    return cls(response, operation)  # type: ignore[no-any-return]


_serializer = TypeSerializer()


def _as_wire(operation: str, result: dict[str, Any]) -> dict[str, Any]:
    """A response in Python types (as the resource's client gets it) in DynamoDB JSON (as a
    low-level client gets it): boto3's serializer over the output shape's AttributeValues.
    BatchGetItem's UnprocessedKeys are the request's own keys, already DynamoDB JSON."""
    unprocessed = result.pop("UnprocessedKeys", None)
    ParameterTransformer().transform(result, _operation_model(operation).output_shape,
                                     _serializer.serialize, "AttributeValue")
    if unprocessed is not None:
        result["UnprocessedKeys"] = unprocessed
    return result


class _Failure(Exception):
    """An error of one operation (code, message), raised as a ClientError at the boundary."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.extra = extra


def _validation(message: str) -> _Failure:
    return _Failure("ValidationException", message)


def _from_moto(error: DynamodbException) -> _Failure:
    code = error.relative_error_type or "ValidationException"
    return _Failure(code, str(error.message))


# ================================================================== sizes and values
def _number_size(text: str) -> int:
    """DynamoDB: 1 byte per two significant digits, plus 1."""
    digits = Decimal(text).normalize().as_tuple().digits
    significant = len(digits) if digits != (0,) else 1
    return (significant + 1) // 2 + 1


def value_size(value: DynamoType) -> int:
    """Bytes of one attribute value by DynamoDB's rules (names counted by the caller)."""
    kind, raw = value.type, value.value
    if kind == "S":
        return len(raw.encode())
    if kind == "N":
        return _number_size(raw)
    if kind == "B":
        return len(_raw_bytes(raw))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode()) for s in raw)
    if kind == "NS":
        return sum(_number_size(n) for n in raw)
    if kind == "BS":
        return sum(len(_raw_bytes(b)) for b in raw)
    if kind == "L":  # 3 bytes for the list, 1 per element
        return 3 + sum(1 + value_size(_typed(v)) for v in raw)
    if kind == "M":
        return 3 + sum(len(k.encode()) + 1 + value_size(_typed(v)) for k, v in raw.items())
    raise _validation(f"unknown attribute type {kind}")


def item_size(attrs: Mapping[str, DynamoType]) -> int:
    """Bytes of an item: attribute names plus values (DynamoDB's item-size rules)."""
    return sum(len(name.encode()) + value_size(_typed(v)) for name, v in attrs.items())


def _typed(value: Any) -> DynamoType:
    return value if isinstance(value, DynamoType) else DynamoType(value)


def _raw_bytes(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, Binary):
        return bytes(value.value)
    return base64.b64decode(value)


def _python(value: Any) -> Any:
    """A stored value as boto3's TypeDeserializer returns it."""
    value = _typed(value)
    kind, raw = value.type, value.value
    if kind == "S" or kind == "BOOL":
        return raw
    if kind == "N":
        return DYNAMODB_CONTEXT.create_decimal(raw)
    if kind == "M":
        return {k: _python(v) for k, v in raw.items()}
    if kind == "L":
        return [_python(v) for v in raw]
    if kind == "NULL":
        return None
    if kind == "SS":
        return set(raw)
    if kind == "NS":
        return {DYNAMODB_CONTEXT.create_decimal(n) for n in raw}
    if kind == "B":
        return Binary(_raw_bytes(raw))
    if kind == "BS":
        return {Binary(_raw_bytes(b)) for b in raw}
    raise _validation(f"unknown attribute type {kind}")


def _wire(value: Any) -> dict[str, Any]:
    """A stored value in DynamoDB JSON (what DynamoDB returns before boto3 maps it)."""
    value = _typed(value)
    kind, raw = value.type, value.value
    if kind == "M":
        return {"M": {k: _wire(v) for k, v in raw.items()}}
    if kind == "L":
        return {"L": [_wire(v) for v in raw]}
    if kind in ("SS", "NS", "BS"):
        return {kind: list(raw)}
    return {kind: raw}


_ATOMIC = frozenset({str, Decimal, bool, int, float, type(None), Binary, bytes})


def _copy(value: Any) -> Any:
    """Copy of the containers of a mapped (python) value: callers may change what they get
    (and boto3's transformation changes the parameters it is given)."""
    kind = type(value)
    if kind is dict:
        return {k: v if type(v) in _ATOMIC else _copy(v) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _ATOMIC else _copy(v) for v in value]
    if kind is set:
        return set(value)
    if isinstance(value, dict):  # OrderedDict and the like
        return {k: _copy(v) for k, v in value.items()}
    return value


def _sortable(value: DynamoType) -> Any:
    """Order of key values: numbers numerically, strings and binary by bytes (for str,
    code-point order equals UTF-8 byte order)."""
    if value.type == "N":
        return Decimal(value.value)
    if value.type == "B":
        return _raw_bytes(value.value)
    return value.value


def _new_item(hash_key: DynamoType, range_key: DynamoType | None, attrs: dict[str, DynamoType]) -> Item:
    """A moto Item over a plain dict: moto's LimitedSizeDict re-measures the whole item on
    every attribute set (O(n^2)) and enforces an approximate limit; ours is exact."""
    item = Item.__new__(Item)
    item.hash_key = hash_key
    item.range_key = range_key
    item.attrs = attrs
    return item


def _clone_value(value: Any) -> DynamoType:
    """A deep copy of a stored value (moto's executors change values in place)."""
    value = _typed(value)
    clone = DynamoType.__new__(DynamoType)
    clone.type = value.type
    raw = value.value
    if value.type == "M":
        clone.value = {k: _clone_value(v) for k, v in raw.items()}
    elif value.type == "L":
        clone.value = [_clone_value(v) for v in raw]
    elif value.type in ("SS", "NS", "BS"):
        clone.value = list(raw)
    else:
        clone.value = raw
    return clone


# ================================================================== expression caches
class _ConditionParser(ConditionExpressionParser):
    """moto's condition parser, split so the parsed tree is cached per expression and names,
    and attribute values are bound per call (moto looks them up while lexing)."""

    def _lookup_expression_attribute_value(self, name: str) -> dict[str, str]:
        return {"S": name}  # placeholder: bound in _make_operand from the node's text

    def tree(self) -> Any:
        nodes = self._lex_condition_expression()
        nodes = self._parse_paths(nodes)
        nodes = self._apply_functions(nodes)
        nodes = self._apply_comparator(nodes)
        nodes = self._apply_in(nodes)
        nodes = self._apply_between(nodes)
        nodes = self._apply_parens_and_booleans(nodes)
        node = nodes[0]
        self._assert_no_redundant_parentheses(node)
        return node

    def bind(self, node: Any) -> Any:
        return self._make_op_condition(node)

    def _make_operand(self, node: Any) -> Any:
        if node.kind == self.Kind.EXPRESSION_ATTRIBUTE_VALUE:
            values = self.expression_attribute_values or {}
            if node.text not in values:
                raise _validation("Invalid ConditionExpression: An expression attribute value used in "
                                  f"expression is not defined; attribute value: {node.text}")
            return AttributeValue(values[node.text])
        return super()._make_operand(node)


_cache_lock = threading.Lock()
_condition_trees: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
_update_trees: dict[str, Any] = {}


def _condition(expression: str | None, names: Mapping[str, str] | None,
               values: Mapping[str, Any] | None, what: str = "ConditionExpression") -> Any:
    """The evaluable condition (``.expr(item) -> bool``), or None for no condition."""
    if not expression:
        return None
    key = (expression, tuple(sorted((names or {}).items())))
    with _cache_lock:
        tree = _condition_trees.get(key)
    if tree is None:
        parser = _ConditionParser(expression, dict(names or {}), {})
        try:
            tree = parser.tree()
        except KeyError as error:
            raise _validation(f"Invalid {what}: An expression attribute name used in the document path "
                              f"is not defined; attribute name: {error.args[0]}") from None
        except DynamodbException as error:
            raise _from_moto(error) from None
        except ValueError as error:
            raise _validation(f"Invalid {what}: {error}") from None
        with _cache_lock:
            _condition_trees[key] = tree
    parser = _ConditionParser(expression, dict(names or {}), dict(values or {}))
    try:
        return parser.bind(tree)
    except DynamodbException as error:
        raise _from_moto(error) from None


def _update_tree(expression: str) -> Any:
    with _cache_lock:
        tree = _update_trees.get(expression)
    if tree is None:
        try:
            tree = UpdateExpressionParser.make(expression)
        except DynamodbException as error:
            raise _from_moto(error) from None
        with _cache_lock:
            _update_trees[expression] = tree
    return _clone_tree(tree)


def _attribute_names(tree: Any, names: Mapping[str, str]) -> set[str]:
    """Every attribute name an update expression mentions (a superset of the top-level
    attributes it reads or writes: those are copied before it runs, the others shared)."""
    found: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ExpressionAttribute):
            found.add(node.get_attribute_name())
        elif isinstance(node, ExpressionAttributeName):
            placeholder = node.get_attribute_name_placeholder()
            found.add(names.get(placeholder, placeholder))
        elif isinstance(node, Node) and isinstance(node.children, list):
            stack.extend(node.children)
    return found


def _clone_tree(node: Any, parent: Any = None) -> Any:
    """A copy of a parsed update expression (moto's validator rewrites the tree in place;
    ``copy.deepcopy`` costs as much as parsing again)."""
    clone = object.__new__(type(node))
    clone.__dict__.update(node.__dict__)
    clone.parent = parent
    if isinstance(node.children, list):
        clone.children = [_clone_tree(c, clone) if isinstance(c, Node) else c for c in node.children]
    return clone


#: moto's update validators that read only the expression, its names and the table's key
#: attributes (never the values or the item), and change nothing: an expression they passed
#: once passes again, so they run once per (expression, names, key attributes)
_STRUCTURE_CHECKS = (ActionCountValidator, OverlappingPathsValidator, UpdateHashRangeKeyValidator)
_structure_passed: set[tuple[Any, ...]] = set()


class _Validator(UpdateExpressionValidator):
    """moto's update validator without its defensive deepcopy (we pass a fresh clone), its
    structure checks run once per expression (``_STRUCTURE_CHECKS``), and its traversal with
    the node-type tests cached (:func:`_traverse`). Same processors, same order, same tree."""

    def __init__(self, tree: Any, names: dict[str, str], values: dict[str, Any], item: Item,
                 table: Any, expression: str = "") -> None:
        self.expression_attribute_names = names
        self.expression_attribute_values = values
        self.item = item
        self.table = table
        self.processors = self.get_ast_processors()
        self.node_to_validate = tree
        self._structure_key = (expression, tuple(sorted(names.items())), tuple(table.table_key_attrs)) \
            if expression else None

    def validate(self) -> Any:
        node = self.node_to_validate
        key = self._structure_key
        passed = key is not None and key in _structure_passed
        structural = [p for p in self.processors if isinstance(p, _STRUCTURE_CHECKS)]
        for processor in self.processors:
            if passed and isinstance(processor, _STRUCTURE_CHECKS):
                continue
            node = _traverse(processor, processor._processing_map(), node)
            if key is not None and not passed and processor is structural[-1]:
                with _cache_lock:
                    _structure_passed.add(key)
        return node


_node_types: dict[type, bool] = {}
_handled_by: dict[tuple[type, type], type | None] = {}


def _traverse(processor: Any, processing: dict[type, Any], node: Any, child_id: int = -1) -> Any:
    """``DepthFirstTraverser.traverse_node_recursively`` with its ``isinstance`` tests (on
    ABCs, the validation's main cost) cached per node type; the same visits in the same order."""
    kind = type(node)
    is_node = _node_types.get(kind)
    if is_node is None:
        is_node = _node_types[kind] = isinstance(node, Node)
    if not is_node:
        return node
    parent = node.parent
    if node.children is not None:
        for i, child in enumerate(node.children):
            processor.pre_processing_of_child(node, i)
            _traverse(processor, processing, child, i)
    handler_key = (type(processor), kind)
    if handler_key in _handled_by:
        handled = _handled_by[handler_key]
    else:  # the first class of the processing map the node is an instance of (moto's process())
        handled = _handled_by[handler_key] = next((c for c in processing if issubclass(kind, c)), None)
    if handled is not None:
        node = processing[handled](node)
        node.parent = parent
        if parent:
            parent.children[child_id] = node
    return node


def _tokens(*expressions: str | None) -> set[str]:
    found: set[str] = set()
    for expression in expressions:
        if expression:
            found.update(_TOKEN.findall(expression))
    return found


def _check_tokens_used(params: Mapping[str, Any], *expressions: str | None) -> None:
    """DynamoDB refuses expression names / values that no expression uses."""
    used = _tokens(*expressions)
    for what, key in (("Names", "ExpressionAttributeNames"), ("Values", "ExpressionAttributeValues")):
        provided = params.get(key)
        if provided is None:
            continue
        if not provided:
            raise _validation(f"ExpressionAttribute{what} must not be empty")
        for name in provided:
            if name not in used:
                raise _validation(f"Value provided in ExpressionAttribute{what} unused in expressions: "
                                  f"keys: {{{name}}}")


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
    largest_item_bytes: int = 0
    largest_item: str = ""  # table and key of the largest item written
    errors: Counter[str] = field(default_factory=Counter)

    def add(self, other: Usage) -> None:
        self.calls.update(other.calls)
        self.errors.update(other.errors)
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
                "conflicts": self.conflicts, "largest_item_bytes": self.largest_item_bytes,
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


# ================================================================== the service
Context = Callable[[], tuple[str, str]]  # -> (label, invocation id)


class MemoryDynamo:
    """An in-memory DynamoDB with the boto3 resource interface (see the module docstring).

    ``tables`` maps a table name to its kind in ``gpu_recovery.constants.table_definitions()``
    ("job", "instance", "node_token", "quota"); ``create_table`` adds others.
    """

    def __init__(self, tables: Mapping[str, str] | None = None, *,
                 context: Context | None = None, now: Callable[[], float] | None = None,
                 on_call: Callable[[str], None] | None = None,
                 tx_conflict_window: float = DEFAULT_TX_CONFLICT_WINDOW,
                 validate: bool = True, arn_prefix: str = "arn:aws:dynamodb:us-east-1:123456789012") -> None:
        self._tables: dict[str, _Table] = {}
        self.arn_prefix = arn_prefix
        self.meter = Meter()
        self.context: Context = context or (lambda: ("-", "-"))
        self.now: Callable[[], float] = now or _time.time
        self.on_call = on_call
        self.tx_conflict_window = tx_conflict_window
        self.validate = validate
        self._injector = TransformationInjector()
        self._validator = ParamValidator()
        self._lock = threading.RLock()
        self._request_ids = itertools.count(1)
        # (table, key) -> [(time, invocation)] of committed transactions, for the conflict model
        self._recent_tx: dict[tuple[str, tuple[Any, ...]], list[tuple[float, str]]] = {}
        definitions = C.table_definitions()
        for name, kind in (tables or {}).items():
            self.create_table(TableName=name, **definitions[kind])
        self.meta = _Meta(MemoryDynamoClient(self))

    # --- resource API --------------------------------------------------------------
    def Table(self, name: str) -> MemoryTable:
        return MemoryTable(self, name)

    def create_table(self, *, TableName: str, KeySchema: list[dict[str, str]],
                     AttributeDefinitions: list[dict[str, str]], **rest: Any) -> MemoryTable:
        with self._lock:
            if TableName in self._tables:
                raise _error("CreateTable", "ResourceInUseException", f"Table already exists: {TableName}")
            self._tables[TableName] = _Table(TableName, {"KeySchema": KeySchema,
                                                         "AttributeDefinitions": AttributeDefinitions,
                                                         **rest})
        return MemoryTable(self, TableName)

    # --- inspection (not metered, no latency) -----------------------------------------
    def peek(self, table: str, key: Mapping[str, Any]) -> dict[str, Any] | None:
        """An item as GetItem would return it, without metering (tests, the harness)."""
        from boto3.dynamodb.types import TypeSerializer

        serializer = TypeSerializer()
        with self._lock:
            t = self._table(table)
            k, _, _ = t.key_of({n: serializer.serialize(v) for n, v in key.items()})
            stored = t.items.get(k)
            return _copy(stored.python()) if stored else None

    def peek_attributes(self, table: str, key: Mapping[str, Any],
                        names: Iterable[str]) -> dict[str, Any] | None:
        """Some attributes of an item (None: no item), without metering or copying the rest."""
        from boto3.dynamodb.types import TypeSerializer

        serializer = TypeSerializer()
        with self._lock:
            t = self._table(table)
            k, _, _ = t.key_of({n: serializer.serialize(v) for n, v in key.items()})
            stored = t.items.get(k)
            if stored is None:
                return None
            return {n: _python(stored.item.attrs[n]) for n in names if n in stored.item.attrs}

    def scan_all(self, table: str) -> Iterator[dict[str, Any]]:
        """Every item of a table (tests and reports; not metered)."""
        with self._lock:
            found = [_copy(s.python()) for s in self._table(table).items.values()]
        yield from found

    def item_bytes(self, table: str) -> dict[str, int]:
        with self._lock:
            t = self._table(table)
            return {t.key_label(k): s.size for k, s in t.items.items()}

    # --- dispatch ------------------------------------------------------------------------
    def call(self, operation: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """One API call with boto3-resource parameters (Python types), as the client does."""
        model = _operation_model(operation)
        wire: dict[str, Any] = _copy(dict(params))
        # boto3's own mapping (a float or an unsupported type raises TypeError, as in boto3).
        self._injector.inject_condition_expressions(wire, model)
        self._injector.inject_attribute_value_input(wire, model)
        if self.validate:
            report = self._validator.validate(wire, model.input_shape)
            if report.has_errors():
                from botocore.exceptions import ParamValidationError

                raise ParamValidationError(report=report.generate_report())
        status, response = self.respond(operation, wire)
        if status >= 300:
            error = response["Error"]
            extra = {k: v for k, v in response.items() if k not in ("Error", "ResponseMetadata")}
            raise _error(operation, error["Code"], error["Message"], **extra) from None
        return response

    def respond(self, operation: str, wire: Mapping[str, Any], *,
                python: bool = True) -> tuple[int, dict[str, Any]]:
        """One API call whose parameters are already in DynamoDB JSON and validated (what a
        botocore client holds after boto3's mapping): ``(HTTP status, response)``, the
        response as botocore parses it. An error is answered, not raised: ``{"Error": {"Code",
        "Message"}, "ResponseMetadata", **its modeled fields}`` with status 400.

        ``python``: attribute values in the response as boto3's TypeDeserializer gives them
        (the resource's client); False: in DynamoDB JSON (a low-level client's)."""
        label, invocation = self.context()
        if not python:
            wire = _copy(dict(wire))  # stored values must not share the caller's containers
        try:
            with self._lock:
                try:
                    result = self._execute(operation, dict(wire), label, invocation)
                    status = 200
                except _Failure as failure:
                    for usage in self.meter.usage(label):
                        usage.errors[failure.code] += 1
                    result = {"Error": {"Code": failure.code, "Message": failure.message}, **failure.extra}
                    status = 400
                result["ResponseMetadata"] = {"RequestId": f"memory-{next(self._request_ids)}",
                                              "HTTPStatusCode": status, "HTTPHeaders": {},
                                              "RetryAttempts": 0}
            if status == 200 and not python:
                result = _as_wire(operation, result)
            return status, result
        finally:
            if self.on_call is not None:
                self.on_call(operation)

    def _table(self, name: str) -> _Table:
        table = self._tables.get(name)
        if table is None:
            raise _Failure("ResourceNotFoundException", "Requested resource not found")
        return table

    def _execute(self, operation: str, p: dict[str, Any], label: str, invocation: str) -> dict[str, Any]:
        handler = getattr(self, f"_op_{operation}", None)
        if handler is None:
            raise NotImplementedError(f"MemoryDynamo does not implement {operation}")
        total, per = self.meter.usage(label)
        total.calls[operation] += 1
        per.calls[operation] += 1
        return handler(p, (total, per), invocation)  # type: ignore[no-any-return]

    # --- tables (the control plane the emulator and its tests use) ------------------------------
    def _description(self, table: _Table) -> dict[str, Any]:
        d = table.definition
        arn = f"{self.arn_prefix}:table/{table.name}"
        out: dict[str, Any] = {
            "TableName": table.name, "TableArn": arn, "TableStatus": "ACTIVE",
            "KeySchema": d["KeySchema"], "AttributeDefinitions": d.get("AttributeDefinitions", []),
            "ItemCount": len(table.items), "TableSizeBytes": sum(s.size for s in table.items.values()),
            "CreationDateTime": datetime.fromtimestamp(table.created, tz=UTC),
            "BillingModeSummary": {"BillingMode": d.get("BillingMode", "PROVISIONED")},
        }
        if d.get("GlobalSecondaryIndexes"):
            out["GlobalSecondaryIndexes"] = [
                {**gsi, "IndexStatus": "ACTIVE", "IndexArn": f"{arn}/index/{gsi['IndexName']}",
                 "ItemCount": len(table.gsis[gsi["IndexName"]].entries)}
                for gsi in d["GlobalSecondaryIndexes"]]
        return out

    def _op_CreateTable(self, p: dict[str, Any], _usages: _Usages, _: str) -> dict[str, Any]:
        name = p["TableName"]
        if name in self._tables:
            raise _Failure("ResourceInUseException", f"Table already exists: {name}")
        self._tables[name] = _Table(name, {k: v for k, v in p.items() if k != "TableName"})
        return {"TableDescription": self._description(self._tables[name])}

    def _op_DescribeTable(self, p: dict[str, Any], _usages: _Usages, _: str) -> dict[str, Any]:
        return {"Table": self._description(self._table(p["TableName"]))}

    def _op_DeleteTable(self, p: dict[str, Any], _usages: _Usages, _: str) -> dict[str, Any]:
        description = self._description(self._table(p["TableName"]))
        del self._tables[p["TableName"]]
        return {"TableDescription": {**description, "TableStatus": "DELETING"}}

    def _op_ListTables(self, p: dict[str, Any], _usages: _Usages, _: str) -> dict[str, Any]:
        return {"TableNames": sorted(self._tables)}

    def _op_UpdateTimeToLive(self, p: dict[str, Any], _usages: _Usages, _: str) -> dict[str, Any]:
        """Recorded, not enforced (neither is it in moto): items never expire here."""
        table = self._table(p["TableName"])
        spec = p["TimeToLiveSpecification"]
        table.ttl = {"TimeToLiveStatus": "ENABLED" if spec["Enabled"] else "DISABLED",
                     **({"AttributeName": spec["AttributeName"]} if spec["Enabled"] else {})}
        return {"TimeToLiveSpecification": dict(spec)}

    def _op_DescribeTimeToLive(self, p: dict[str, Any], _usages: _Usages, _: str) -> dict[str, Any]:
        return {"TimeToLiveDescription": dict(self._table(p["TableName"]).ttl)}

    # --- metering helpers ---------------------------------------------------------------
    @staticmethod
    def _count_read(usages: _Usages, items: int, size: int, units: float) -> None:
        for u in usages:
            u.items_read += items
            u.bytes_read += size
            u.read_units += units

    @staticmethod
    def _count_write(usages: _Usages, table: _Table, key: tuple[Any, ...], new_size: int,
                     old_size: int, units_factor: float, index_units: float, committed: bool) -> None:
        units = _write_units(max(new_size, old_size)) * units_factor
        for u in usages:
            u.write_units += units
            if committed:
                u.items_written += 1
                u.index_write_units += index_units
                if new_size > u.largest_item_bytes:
                    u.largest_item_bytes, u.largest_item = new_size, table.key_label(key)
            else:
                u.failed_writes += 1

    def _conflicting(self, table: _Table, key: tuple[Any, ...], invocation: str, now: float) -> bool:
        window = self.tx_conflict_window
        if window <= 0:
            return False
        recent = self._recent_tx.get((table.name, key))
        if not recent:
            return False
        recent[:] = [(t, inv) for t, inv in recent if now - t < window]
        return any(inv != invocation for _, inv in recent)

    def _remember_tx(self, table: _Table, key: tuple[Any, ...], invocation: str, now: float) -> None:
        if self.tx_conflict_window > 0:
            self._recent_tx.setdefault((table.name, key), []).append((now, invocation))

    # --- single-item operations ------------------------------------------------------------
    def _op_GetItem(self, p: dict[str, Any], usages: _Usages, _: str) -> dict[str, Any]:
        table = self._table(p["TableName"])
        key, _, _ = table.key_of(p["Key"])
        stored = table.items.get(key)
        size = stored.size if stored else 0
        consistent = bool(p.get("ConsistentRead"))
        self._count_read(usages, 1, size, _read_units(size, consistent))
        if stored is None:
            return {}
        item = stored.item
        if p.get("ProjectionExpression"):
            _check_tokens_used(p, p["ProjectionExpression"])
            return {"Item": {k: _python(v) for k, v in self._projection(item, p).attrs.items()}}
        if p.get("ExpressionAttributeNames"):
            raise _validation("ExpressionAttributeNames can only be specified when using expressions")
        return {"Item": _copy(stored.python())}

    def _op_PutItem(self, p: dict[str, Any], usages: _Usages, invocation: str) -> dict[str, Any]:
        table = self._table(p["TableName"])
        condition = p.get("ConditionExpression")
        _check_tokens_used(p, condition)
        self._return_values(p, ("NONE", "ALL_OLD"))
        key, h, r = table.key_from_item(p["Item"])
        new = _new_item(h, r, {k: DynamoType(v) for k, v in p["Item"].items()})
        old = table.items.get(key)
        try:
            if self._conflicting(table, key, invocation, self.now()):
                raise _Failure("TransactionConflictException", "Transaction is ongoing for the item")
            self._check_condition(condition, p, old, "PutItem")
            stored = table.check_new_image(new, update=False)
        except _Failure as failure:
            self._count_failed(usages, failure, table, key, old)
            raise
        index_units = table.store(key, stored)
        self._count_write(usages, table, key, stored.size, old.size if old else 0, 1, index_units, True)
        if p.get("ReturnValues") == "ALL_OLD" and old is not None:
            return {"Attributes": _copy(old.python())}
        return {}

    def _op_DeleteItem(self, p: dict[str, Any], usages: _Usages, invocation: str) -> dict[str, Any]:
        table = self._table(p["TableName"])
        condition = p.get("ConditionExpression")
        _check_tokens_used(p, condition)
        self._return_values(p, ("NONE", "ALL_OLD"))
        key, _, _ = table.key_of(p["Key"])
        old = table.items.get(key)
        try:
            if self._conflicting(table, key, invocation, self.now()):
                raise _Failure("TransactionConflictException", "Transaction is ongoing for the item")
            self._check_condition(condition, p, old, "DeleteItem")
        except _Failure as failure:
            self._count_failed(usages, failure, table, key, old)
            raise
        index_units = table.store(key, None) if old is not None else 0.0
        self._count_write(usages, table, key, 0, old.size if old else 0, 1, index_units, True)
        if p.get("ReturnValues") == "ALL_OLD" and old is not None:
            return {"Attributes": _copy(old.python())}
        return {}

    def _op_UpdateItem(self, p: dict[str, Any], usages: _Usages, invocation: str) -> dict[str, Any]:
        table = self._table(p["TableName"])
        expression = p.get("UpdateExpression")
        condition = p.get("ConditionExpression")
        _check_tokens_used(p, expression, condition)
        returns = self._return_values(p, ("NONE", "ALL_OLD", "ALL_NEW", "UPDATED_OLD", "UPDATED_NEW"))
        key, h, r = table.key_of(p["Key"])
        old = table.items.get(key)
        try:
            if self._conflicting(table, key, invocation, self.now()):
                raise _Failure("TransactionConflictException", "Transaction is ongoing for the item")
            self._check_condition(condition, p, old, "UpdateItem")
            new, touched = self._updated(table, old, h, r, p)
            stored = table.check_new_image(new, update=True, previous=old, touched=touched)
        except _Failure as failure:
            self._count_failed(usages, failure, table, key, old)
            raise
        index_units = table.store(key, stored, touched)
        self._count_write(usages, table, key, stored.size, old.size if old else 0, 1, index_units, True)
        return self._update_result(returns, old, table.items[key])

    def _updated(self, table: _Table, old: _Stored | None, h: DynamoType, r: DynamoType | None,
                 p: Mapping[str, Any]) -> tuple[Item, set[str] | None]:
        """The item after ``p``'s UpdateExpression (moto's validator and executor), and the
        top-level attributes it may have changed (None: all). Only those are copied first:
        the old item stays intact (a cancelled transaction keeps it) at O(what changed)."""
        expression = p.get("UpdateExpression")
        names = dict(p.get("ExpressionAttributeNames") or {})
        tree = _update_tree(expression) if expression else None
        touched = _attribute_names(tree, names) if tree is not None else set()
        if old is not None:
            attrs = dict(old.item.attrs)
            for name in touched:
                if name in attrs:
                    attrs[name] = _clone_value(attrs[name])
            item = _new_item(old.item.hash_key, old.item.range_key, attrs)
        else:
            attrs = {table.hash_key: h}
            if r is not None and table.range_key:
                attrs[table.range_key] = r
            item = _new_item(h, r, attrs)
            touched = None
        if tree is None:
            return item, touched
        values = dict(p.get("ExpressionAttributeValues") or {})
        try:
            tree = _Validator(tree, names, values, item, table.shape, str(expression)).validate()
            tree.normalize()
            UpdateExpressionExecutor(tree, item, names).execute()
        except DynamodbException as error:
            raise _from_moto(error) from None
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise _validation(f"Invalid UpdateExpression: {error}") from None
        return item, touched

    @staticmethod
    def _update_result(returns: str, old: _Stored | None, new: _Stored) -> dict[str, Any]:
        if returns == "NONE":
            return {}
        if returns == "ALL_NEW":
            return {"Attributes": _copy(new.python())}
        old_wire = {k: _wire(v) for k, v in old.item.attrs.items()} if old else {}
        if returns == "ALL_OLD":
            return {"Attributes": _copy(old.python())} if old else {}
        new_wire = {k: _wire(v) for k, v in new.item.attrs.items()}
        if returns == "UPDATED_NEW":
            changed = _updated_new(old_wire, new_wire)
            return {"Attributes": {k: _python(v) for k, v in changed.items()}} if changed else {}
        updated = {k: v for k, v in old_wire.items() if new_wire.get(k) != v}
        return {"Attributes": {k: _python(v) for k, v in updated.items()}} if updated else {}

    @staticmethod
    def _return_values(p: Mapping[str, Any], allowed: tuple[str, ...]) -> str:
        returns = p.get("ReturnValues") or "NONE"
        if returns not in allowed:
            raise _validation("Return values set to invalid value")
        on_failure = p.get("ReturnValuesOnConditionCheckFailure") or "NONE"
        if on_failure not in ("NONE", "ALL_OLD"):
            raise _validation("ReturnValuesOnConditionCheckFailure set to invalid value")
        return str(returns)

    @staticmethod
    def _check_condition(condition: str | None, p: Mapping[str, Any], old: _Stored | None,
                         operation: str) -> None:
        op = _condition(condition, p.get("ExpressionAttributeNames"), p.get("ExpressionAttributeValues"))
        if op is None:
            return
        try:
            held = op.expr(old.item if old else None)
        except DynamodbException as error:
            raise _from_moto(error) from None
        except (TypeError, ValueError) as error:
            raise _validation(f"Invalid ConditionExpression: {error}") from None
        if not held:
            extra: dict[str, Any] = {}
            if p.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD" and old is not None:
                extra["Item"] = {k: _wire(v) for k, v in old.item.attrs.items()}
            raise _Failure("ConditionalCheckFailedException", "The conditional request failed", **extra)

    def _count_failed(self, usages: _Usages, failure: _Failure, table: _Table,
                      key: tuple[Any, ...], old: _Stored | None) -> None:
        if failure.code == "TransactionConflictException":
            for u in usages:
                u.conflicts += 1
        if failure.code in ("ConditionalCheckFailedException", "TransactionConflictException"):
            self._count_write(usages, table, key, 0, old.size if old else 0, 1, 0.0, False)

    # --- reads ------------------------------------------------------------------------------
    def _projection(self, item: Item, p: Mapping[str, Any]) -> Item:
        names = p.get("ExpressionAttributeNames") or {}
        paths = []
        for part in str(p["ProjectionExpression"]).split(","):
            path = []
            for element in part.strip().split("."):
                path.append(names.get(element, element))
            paths.append(path)
        result: dict[str, DynamoType] = {}
        for path in paths:
            top = item.attrs.get(path[0])
            if top is None:
                continue
            if len(path) == 1:
                result[path[0]] = top
                continue
            value: DynamoType | None = top
            for element in path[1:]:
                value = value.child_attr(element) if value is not None else None
            if value is None:
                continue
            nested = result.setdefault(path[0], DynamoType({"M": {}}))
            target = nested
            for element in path[1:-1]:
                target = target.value.setdefault(element, DynamoType({"M": {}}))
            target.value[path[-1]] = value
        return _new_item(item.hash_key, item.range_key, result)

    def _op_BatchGetItem(self, p: dict[str, Any], usages: _Usages, _: str) -> dict[str, Any]:
        requests = p["RequestItems"]
        total_keys = sum(len(r.get("Keys") or []) for r in requests.values())
        if total_keys > MAX_BATCH_GET_KEYS:
            raise _validation("Too many items requested for the BatchGetItem call")
        responses: dict[str, list[dict[str, Any]]] = {}
        unprocessed: dict[str, Any] = {}
        returned = 0
        for name, request in requests.items():
            table = self._table(name)
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
                    item = stored.item if not request.get("ProjectionExpression") else \
                        self._projection(stored.item, request)
                    found.append(_copy(stored.python()) if item is stored.item
                                 else {k: _python(v) for k, v in item.attrs.items()})
            responses[name] = found
        return {"Responses": responses, "UnprocessedKeys": unprocessed}

    def _op_Query(self, p: dict[str, Any], usages: _Usages, _: str) -> dict[str, Any]:
        table = self._table(p["TableName"])
        index_name = p.get("IndexName")
        index = table.primary if not index_name else table.gsis.get(index_name)
        if index is None:
            raise _validation(f"The table does not have the specified index: {index_name}")
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
        partition = index.partitions.get(_sortable(DynamoType(hash_value)), [])
        entries = _range_slice(partition, range_conditions)
        forward = p.get("ScanIndexForward", True) is not False
        if not forward:
            entries = list(reversed(entries))
        start = p.get("ExclusiveStartKey")
        if start is not None:
            entries = _after(entries, table, index, start, forward)
        return self._page(p, usages, table, index, entries, consistent)

    def _page(self, p: Mapping[str, Any], usages: _Usages, table: _Table, index: _Index,
              entries: Iterable[tuple[Any, tuple[Any, ...]]], consistent: bool) -> dict[str, Any]:
        limit = p.get("Limit")
        if limit is not None and limit < 1:
            raise _validation("Limit must be greater than or equal to 1")
        filter_op = _condition(p.get("FilterExpression"), p.get("ExpressionAttributeNames"),
                               p.get("ExpressionAttributeValues"), "FilterExpression")
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
                    if p.get("ProjectionExpression"):
                        items.append({k: _python(v) for k, v in self._projection(item, p).attrs.items()})
                    elif item is stored.item:
                        items.append(_copy(stored.python()))
                    else:
                        items.append({k: _python(v) for k, v in item.attrs.items()})
            if limit is not None and evaluated >= limit:
                more = True
                break
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

    def _op_Scan(self, p: dict[str, Any], usages: _Usages, _: str) -> dict[str, Any]:
        table = self._table(p["TableName"])
        index_name = p.get("IndexName")
        index = table.primary if not index_name else table.gsis.get(index_name)
        if index is None:
            raise _validation(f"The table does not have the specified index: {index_name}")
        _check_tokens_used(p, p.get("FilterExpression"), p.get("ProjectionExpression"))
        keys = sorted(index.entries) if index_name else sorted(table.items)
        entries = [((), k) for k in keys]
        start = p.get("ExclusiveStartKey")
        if start is not None:
            key, _, _ = table.key_of({n: start[n] for n in table.key_names})
            entries = [e for e in entries if e[1] > key]
        return self._page(p, usages, table, index, entries, bool(p.get("ConsistentRead")))

    # --- batch write and transactions ------------------------------------------------------
    def _op_BatchWriteItem(self, p: dict[str, Any], usages: _Usages, invocation: str) -> dict[str, Any]:
        requests = p["RequestItems"]
        if sum(len(v) for v in requests.values()) > MAX_BATCH_WRITE_ITEMS:
            raise _validation("Too many items requested for the BatchWriteItem call")
        seen: set[tuple[str, tuple[Any, ...]]] = set()
        plan: list[tuple[_Table, tuple[Any, ...], _Stored | None]] = []
        for name, writes in requests.items():
            table = self._table(name)
            for write in writes:
                if "PutRequest" in write:
                    attrs = write["PutRequest"]["Item"]
                    key, h, r = table.key_from_item(attrs)
                    item = _new_item(h, r, {k: DynamoType(v) for k, v in attrs.items()})
                    plan.append((table, key, table.check_new_image(item, update=False)))
                else:
                    key, _, _ = table.key_of(write["DeleteRequest"]["Key"])
                    plan.append((table, key, None))
                if (name, key) in seen:
                    raise _validation("Provided list of item keys contains duplicates")
                seen.add((name, key))
        for table, key, stored in plan:
            old = table.items.get(key)
            units = table.store(key, stored) if (stored is not None or old is not None) else 0.0
            size = stored.size if stored is not None else 0
            self._count_write(usages, table, key, size, old.size if old else 0, 1, units, True)
        return {"UnprocessedItems": {}}

    def _op_TransactWriteItems(self, p: dict[str, Any], usages: _Usages, invocation: str) -> dict[str, Any]:
        actions = p["TransactItems"]
        if len(actions) > MAX_TRANSACT_ITEMS:
            raise _validation("1 validation error detected: Value at 'transactItems' failed to satisfy "
                              "constraint: Member must have length less than or equal to "
                              f"{MAX_TRANSACT_ITEMS}")
        now = self.now()
        planned: list[tuple[_Table, tuple[Any, ...], _Stored | None, _Stored | None, set[str] | None,
                            bool]] = []
        reasons: list[dict[str, Any]] = []
        seen: set[tuple[str, tuple[Any, ...]]] = set()
        failed = False
        # Validate every action first: a malformed one fails the whole call (ValidationException).
        parsed = []
        for action in actions:
            if len(action) != 1:
                raise _validation("TransactItems can only contain one of Check, Put, Update or Delete")
            (kind, op), = action.items()
            table = self._table(op["TableName"])
            expression = op.get("UpdateExpression") if kind == "Update" else None
            _check_tokens_used(op, expression, op.get("ConditionExpression"))
            if kind == "Put":
                key, h, r = table.key_from_item(op["Item"])
            else:
                key, h, r = table.key_of(op["Key"])
            if (table.name, key) in seen:
                raise _validation("Transaction request cannot include multiple operations on one item")
            seen.add((table.name, key))
            if kind == "ConditionCheck" and not op.get("ConditionExpression"):
                raise _validation("The ConditionCheck action requires a ConditionExpression")
            parsed.append((kind, op, table, key, h, r))
        # Conflicts and conditions of every action first (cheap): a transaction that will be
        # cancelled anyway does not evaluate its update expressions (the costly part, and a
        # hot item's losers are most transactions). Its reasons say None for the others.
        checked: list[_Failure | None] = []
        for _kind, op, table, key, _h, _r in parsed:
            try:
                if self._conflicting(table, key, invocation, now):
                    raise _Failure("TransactionConflict", "Transaction is ongoing for the item")
                self._check_condition(op.get("ConditionExpression"), op, table.items.get(key),
                                      "TransactWriteItems")
                checked.append(None)
            except _Failure as failure:
                checked.append(failure)
        doomed = any(f is not None for f in checked)
        for (kind, op, table, key, h, r), precheck in zip(parsed, checked, strict=True):
            old = table.items.get(key)
            try:
                if precheck is not None:
                    raise precheck
                if doomed:
                    reasons.append({"Code": "None"})
                    continue
                new: _Stored | None = None
                touched: set[str] | None = None
                if kind == "Put":
                    item = _new_item(h, r, {k: DynamoType(v) for k, v in op["Item"].items()})
                    new = table.check_new_image(item, update=False)
                elif kind == "Update":
                    item, touched = self._updated(table, old, h, r, op)
                    new = table.check_new_image(item, update=True, previous=old, touched=touched)
                planned.append((table, key, old, new, touched, kind != "ConditionCheck"))
                reasons.append({"Code": "None"})
            except _Failure as failure:
                failed = True
                code = {"ConditionalCheckFailedException": "ConditionalCheckFailed",
                        "ValidationException": "ValidationError"}.get(failure.code, failure.code)
                reason: dict[str, Any] = {"Code": code, "Message": failure.message}
                if "Item" in failure.extra:
                    reason["Item"] = failure.extra["Item"]
                reasons.append(reason)
                if code == "TransactionConflict":
                    for u in usages:
                        u.conflicts += 1
        if failed:
            for _kind, _op, table, key, _h, _r in parsed:
                old = table.items.get(key)
                self._count_write(usages, table, key, 0, old.size if old else 0, 2, 0.0, False)
            codes = ", ".join(r["Code"] for r in reasons)
            raise _Failure("TransactionCanceledException",
                           f"Transaction cancelled, please refer cancellation reasons for specific reasons "
                           f"[{codes}]", CancellationReasons=reasons)
        for table, key, old, new, touched, writes in planned:
            if writes:
                index_units = table.store(key, new, touched)
                size = new.size if new is not None else 0
                self._count_write(usages, table, key, size, old.size if old else 0, 2, index_units, True)
            else:
                for u in usages:
                    u.read_units += 2 * _read_units(old.size if old else 0, True)
            self._remember_tx(table, key, invocation, now)
        return {}


def _updated_new(original: Any, changed: Any) -> Any:
    """UPDATED_NEW: what changed, down to the changed parts of maps (moto's rule)."""
    if type(changed) is not type(original):
        return changed
    if isinstance(changed, dict):
        return {key: _updated_new(original.get(key), value) for key, value in changed.items()
                if key not in original or value != original[key]}
    return changed


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


class _Meta:
    def __init__(self, client: MemoryDynamoClient) -> None:
        self.client = client


class MemoryTable:
    """``dynamodb.Table(name)``: the table operations with ``TableName`` filled in."""

    def __init__(self, service: MemoryDynamo, name: str) -> None:
        self._service = service
        self.name = name
        self.table_name = name

    def _call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        return self._service.call(operation, {"TableName": self.name, **params})

    def get_item(self, **params: Any) -> dict[str, Any]:
        return self._call("GetItem", params)

    def put_item(self, **params: Any) -> dict[str, Any]:
        return self._call("PutItem", params)

    def update_item(self, **params: Any) -> dict[str, Any]:
        return self._call("UpdateItem", params)

    def delete_item(self, **params: Any) -> dict[str, Any]:
        return self._call("DeleteItem", params)

    def query(self, **params: Any) -> dict[str, Any]:
        return self._call("Query", params)

    def scan(self, **params: Any) -> dict[str, Any]:
        return self._call("Scan", params)


class MemoryDynamoClient:
    """``dynamodb.meta.client``: the resource's type-mapping client."""

    def __init__(self, service: MemoryDynamo) -> None:
        self._service = service
        self.exceptions = _botocore_client().exceptions

    def get_item(self, **params: Any) -> dict[str, Any]:
        return self._service.call("GetItem", params)

    def put_item(self, **params: Any) -> dict[str, Any]:
        return self._service.call("PutItem", params)

    def update_item(self, **params: Any) -> dict[str, Any]:
        return self._service.call("UpdateItem", params)

    def delete_item(self, **params: Any) -> dict[str, Any]:
        return self._service.call("DeleteItem", params)

    def query(self, **params: Any) -> dict[str, Any]:
        return self._service.call("Query", params)

    def scan(self, **params: Any) -> dict[str, Any]:
        return self._service.call("Scan", params)

    def batch_get_item(self, **params: Any) -> dict[str, Any]:
        return self._service.call("BatchGetItem", params)

    def batch_write_item(self, **params: Any) -> dict[str, Any]:
        return self._service.call("BatchWriteItem", params)

    def transact_write_items(self, **params: Any) -> dict[str, Any]:
        return self._service.call("TransactWriteItems", params)
