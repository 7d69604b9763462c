"""The core of the in-memory DynamoDB: tables, dispatch of one call, metering, conflicts and
the single-item operations (GetItem, PutItem, UpdateItem, DeleteItem)."""

from __future__ import annotations

import collections
import itertools
import threading
import time as _time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from boto3.dynamodb.transform import TransformationInjector
from botocore.validate import ParamValidator
from moto.dynamodb.exceptions import DynamodbException
from moto.dynamodb.models.dynamo_type import DynamoType, Item
from moto.dynamodb.parsing.executors import UpdateExpressionExecutor

from gpu_recovery import constants as C

from ...events import ACCOUNT_ID, REGION
from .clients import MemoryDynamoClient, MemoryTable, _Meta
from .expressions import (
    _attribute_names,
    _check_structure,
    _check_tokens_used,
    _condition,
    _parsed_update,
    _update_tree,
    _Validator,
)
from .plain_updates import plain_update
from .projections import project, read_projection
from .storage import Meter, _read_units, _Stored, _Table, _Usages, _write_units
from .throughput import PartitionThroughput, throttling_reason
from .values import (
    DEFAULT_TX_CONFLICT_WINDOW,
    _as_wire,
    _clone_value,
    _copy,
    _error,
    _Failure,
    _from_moto,
    _new_item,
    _operation_model,
    _python,
    _updated_new,
    _validation,
    _wire,
)

# ================================================================== the service
Context = Callable[[], tuple[str, str]]  # -> (label, invocation id)


class DynamoCore:
    """The store's state, its dispatch, the control plane and the single-item writes;
    ``MemoryDynamo`` adds the reads and the batch and transaction writes."""

    def __init__(self, tables: Mapping[str, str] | None = None, *,
                 context: Context | None = None, now: Callable[[], float] | None = None,
                 on_call: Callable[[str], None] | None = None,
                 tx_conflict_window: float = DEFAULT_TX_CONFLICT_WINDOW,
                 validate: bool = True, arn_prefix: str = f"arn:aws:dynamodb:{REGION}:{ACCOUNT_ID}",
                 partition_throughput: PartitionThroughput | None = None) -> None:
        self._tables: dict[str, _Table] = {}
        #: per-partition limits (``throughput``); None: not modelled
        self.partition_throughput = partition_throughput
        self.arn_prefix = arn_prefix
        self.meter = Meter()
        self.context: Context = context or (lambda: ("-", "-"))
        self.now: Callable[[], float] = now or _time.time
        self.on_call = on_call
        #: called with (operation, params) before every call made through ``call`` (the
        #: scale world's clients; the grants guard): raising refuses the call
        self.before_call: Callable[[str, Mapping[str, Any]], None] | None = None
        self.tx_conflict_window = tx_conflict_window
        self.validate = validate
        #: ``(operation model, DynamoDB-JSON parameters)`` of each resource-API call, before it
        #: runs (the scale world's request guard: local_mode/sim/contract/requests.py)
        self.check_request: Callable[[Any, dict[str, Any]], Any] | None = None
        self._injector = TransformationInjector()
        self._validator = ParamValidator()
        self._lock = threading.RLock()
        self._request_ids = itertools.count(1)
        # (table, key) -> [(time, invocation)] of committed transactions, for the conflict model
        self._recent_tx: dict[tuple[str, tuple[Any, ...]], list[tuple[float, str]]] = {}
        # ClientRequestToken -> (when its transaction committed, its items): a repeat within
        # the idempotency window succeeds with no effect (TransactWriteItems API reference)
        self._tx_tokens: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        self._tx_token_order: collections.deque[tuple[float, str]] = collections.deque()  # oldest first
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
        if self.before_call is not None:
            self.before_call(operation, params)
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
        if self.check_request is not None:
            self.check_request(model, wire)
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

    def _op_CreateTable(self, p: dict[str, Any], _usages: _Usages, _invocation: str) -> dict[str, Any]:
        name = p["TableName"]
        if name in self._tables:
            raise _Failure("ResourceInUseException", f"Table already exists: {name}")
        self._tables[name] = _Table(name, {k: v for k, v in p.items() if k != "TableName"})
        return {"TableDescription": self._description(self._tables[name])}

    def _op_DescribeTable(self, p: dict[str, Any], _usages: _Usages, _invocation: str) -> dict[str, Any]:
        return {"Table": self._description(self._table(p["TableName"]))}

    def _op_DeleteTable(self, p: dict[str, Any], _usages: _Usages, _invocation: str) -> dict[str, Any]:
        description = self._description(self._table(p["TableName"]))
        del self._tables[p["TableName"]]
        return {"TableDescription": {**description, "TableStatus": "DELETING"}}

    def _op_ListTables(self, p: dict[str, Any], _usages: _Usages, _invocation: str) -> dict[str, Any]:
        return {"TableNames": sorted(self._tables)}

    def _op_UpdateTimeToLive(self, p: dict[str, Any], _usages: _Usages, _invocation: str) -> dict[str, Any]:
        """Recorded, not enforced (neither is it in moto): items never expire here."""
        table = self._table(p["TableName"])
        spec = p["TimeToLiveSpecification"]
        table.ttl = {"TimeToLiveStatus": "ENABLED" if spec["Enabled"] else "DISABLED",
                     **({"AttributeName": spec["AttributeName"]} if spec["Enabled"] else {})}
        return {"TimeToLiveSpecification": dict(spec)}

    def _op_DescribeTimeToLive(self, p: dict[str, Any], _usages: _Usages, _invocation: str) -> dict[str, Any]:
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

    def _throttled(self, loads: list[tuple[tuple[str, str, Any], float]], *, write: bool) -> _Failure | None:
        """The throttling error if a partition cannot take ``loads`` this second (None:
        admitted and taken, or throughput not modelled)."""
        if self.partition_throughput is None:
            return None
        refused = self.partition_throughput.admit(self.now(), loads, write=write)
        if refused is None:
            return None
        return _Failure(
            "ProvisionedThroughputExceededException",
            "Throughput exceeds the current capacity of your table or index. DynamoDB is automatically "
            "scaling your table or index so please try again shortly. If exceptions persist, check if "
            "you have a hot key: https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/"
            "bp-partition-key-design.html",
            ThrottlingReasons=[throttling_reason(refused, write=write, arn_prefix=self.arn_prefix)])

    def _admit_write(self, table: _Table, key: tuple[Any, ...], new: _Stored | None,
                     touched: set[str] | None, old: _Stored | None) -> None:
        units = _write_units(max(new.size if new is not None else 0, old.size if old is not None else 0))
        failure = self._throttled(table.write_loads(key, new, touched, units), write=True)
        if failure is not None:
            raise failure

    # --- single-item operations ------------------------------------------------------------
    def _op_GetItem(self, p: dict[str, Any], usages: _Usages, _invocation: str) -> dict[str, Any]:
        table = self._table(p["TableName"])
        key, _, _ = table.key_of(p["Key"])
        paths = read_projection(p)  # refused before the read, the item there or not
        stored = table.items.get(key)
        size = stored.size if stored else 0
        consistent = bool(p.get("ConsistentRead"))
        throttled = self._throttled([((table.name, "", key[0]), _read_units(size, consistent))], write=False)
        if throttled is not None:
            raise throttled
        self._count_read(usages, 1, size, _read_units(size, consistent))
        if stored is None:
            return {}
        if paths is not None:
            return {"Item": {k: _python(v) for k, v in project(stored.item, paths).attrs.items()}}
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
            self._admit_write(table, key, stored, None, old)
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
            if old is not None:
                self._admit_write(table, key, None, None, old)
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
            self._admit_write(table, key, stored, touched, old)
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
        parsed = _parsed_update(expression) if expression else None
        changed = _attribute_names(parsed, names, str(expression)) if parsed is not None else set()
        # A plain expression (top-level paths, :value operands) runs without moto's passes
        # but its structure checks (plain_updates).
        plan = plain_update(str(expression), names, parsed) if parsed is not None else None
        touched = changed if old is not None else None  # a new item: all of it
        if old is not None:
            attrs = dict(old.item.attrs)
            if plan is None:  # moto's executors change values in place (a plan copies what it changes)
                for name in changed:
                    if name in attrs:
                        attrs[name] = _clone_value(attrs[name])
            item = _new_item(old.item.hash_key, old.item.range_key, attrs)
        else:
            attrs = {table.hash_key: h}
            if r is not None and table.range_key:
                attrs[table.range_key] = r
            item = _new_item(h, r, attrs)
        if parsed is None:
            return item, touched
        values = dict(p.get("ExpressionAttributeValues") or {})
        try:
            if plan is not None:
                _check_structure(parsed, names, table.shape, str(expression))
                plan.apply(item, values, table.shape, names)
                return item, touched
            tree = _Validator(_update_tree(str(expression)), names, values, item, table.shape,
                              str(expression)).validate()
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
                u.conflicts_by_item[table.key_label(key)] += 1
        if failure.code in ("ConditionalCheckFailedException", "TransactionConflictException"):
            self._count_write(usages, table, key, 0, old.size if old else 0, 1, 0.0, False)
