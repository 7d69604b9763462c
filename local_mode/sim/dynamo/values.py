"""DynamoDB's limits, its botocore model and errors, item sizes by DynamoDB's rules, and the
conversions between DynamoDB JSON, moto's DynamoType and Python values."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from decimal import Decimal
from functools import cache
from typing import Any, cast

import botocore.session
from boto3.dynamodb.transform import ParameterTransformer
from boto3.dynamodb.types import DYNAMODB_CONTEXT, Binary, TypeSerializer
from botocore.exceptions import ClientError
from moto.dynamodb.exceptions import DynamodbException
from moto.dynamodb.models.dynamo_type import DynamoType, Item

from ...events import REGION

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
    return session.create_client("dynamodb", region_name=REGION, aws_access_key_id="memory",
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
    # moto's BaseModel.__new__ (which tracks the instance, as Item() would) is typed as
    # returning BaseModel.
    item = cast(Item, Item.__new__(Item))
    item.hash_key = hash_key
    item.range_key = range_key
    item.attrs = attrs  # type: ignore[assignment]  # a plain dict on purpose (above)
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


def _updated_new(original: Any, changed: Any) -> Any:
    """UPDATED_NEW: what changed, down to the changed parts of maps (moto's rule)."""
    if type(changed) is not type(original):
        return changed
    if isinstance(changed, dict):
        return {key: _updated_new(original.get(key), value) for key, value in changed.items()
                if key not in original or value != original[key]}
    return changed
