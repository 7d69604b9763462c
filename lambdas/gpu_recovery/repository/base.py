"""Shared DynamoDB plumbing of the repositories: value mapping, conditional updates,
transactions and batched reads.

Only modules of this package import it; services speak to repositories in intents.
Every state change is a conditional write (or a transaction of them): duplicated,
reordered and concurrent events race on the condition and exactly one wins. Reads use
keys or indexes only: never a Scan.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, TypeVar

from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

from gpu_recovery import clock
from gpu_recovery.constants import (
    DEADLINE_BUCKET,
    DEADLINE_PK,
    DEADLINE_SHARDS_MAX,
    DEADLINE_SK,
    deadline_bucket,
)
from gpu_recovery.domain import goodput
from gpu_recovery.domain.shards import stable_shard

logger = logging.getLogger(__name__)

# A job's history (state changes) keeps its newest MAX_HISTORY entries: a job suspended and
# resumed, or lost and found, a thousand times never outgrows DynamoDB's 400 KB item. A
# full history drops its oldest HISTORY_TRIM entries at once (one write per 50 changes).
MAX_HISTORY = 200
HISTORY_TRIM = 50
_BATCH_GET_LIMIT = 100
# Contention on a hot item (many ranks of one job writing at once) is a race, not an
# error: a write refused for it (nothing written) is tried again after a jittered, growing
# pause. botocore retries the throughput errors of a single-item write itself, never a
# cancelled transaction, whatever its reasons.
CONTENTION_RETRIES = 8
CONTENTION_BASE_SECONDS = 0.025
CONTENTION_CAP_SECONDS = 1.0
# The per-item reasons of a cancelled transaction (TransactWriteItems API reference,
# TransactionCanceledException): None, ConditionalCheckFailed, ItemCollectionSizeLimitExceeded,
# TransactionConflict, ProvisionedThroughputExceeded, ThrottlingError, ValidationError. These
# say contention (a conflicting transaction, a table or index over its throughput or
# scaling): nothing was written and the same transaction may succeed later.
CANCELLATION_CONTENTION_REASONS = ("TransactionConflict", "ProvisionedThroughputExceeded", "ThrottlingError")
# The errors a single-item write gets for the same causes.
_CONTENTION_ERRORS = ("TransactionConflictException", "ProvisionedThroughputExceededException",
                      "ThrottlingException", "RequestLimitExceeded")
# A transaction whose outcome is unknown (its answer lost after botocore's own retries, these
# errors) is asked again with the same ClientRequestToken at most this many times.
OUTCOME_RETRIES = 2
_OUTCOME_UNKNOWN_ERRORS = ("InternalServerError", "TransactionInProgressException")
# BatchGetItem answers a partial batch (UnprocessedKeys) under throttling and asks for
# exponential back-off before the unprocessed keys are asked again (BatchGetItem API
# reference): full jitter, growing from BATCH_GET_BASE_SECONDS up to BATCH_GET_CAP_SECONDS a
# pause, for at most BATCH_GET_PATIENCE_SECONDS and BATCH_GET_ROUNDS calls per chunk, and never
# past the invocation's deadline (less BATCH_GET_MARGIN_SECONDS for what follows the read).
BATCH_GET_BASE_SECONDS = 0.05
BATCH_GET_CAP_SECONDS = 2.0
BATCH_GET_PATIENCE_SECONDS = 10.0
BATCH_GET_ROUNDS = 12
BATCH_GET_MARGIN_SECONDS = 5.0
T = TypeVar("T")

# An item leaves the deadline index by losing both.
DEADLINE_ATTRIBUTES = (DEADLINE_PK, DEADLINE_SK)


# ----------------------------------------------------------------------------- values
def to_ddb(value: Any) -> Any:
    """Python -> DynamoDB resource types (floats become Decimal)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, Mapping):
        return {k: to_ddb(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_ddb(v) for v in value]
    return value


def from_ddb(value: Any) -> Any:
    # Strings and dicts, most of an item, answered before the ABC test (isinstance on
    # Mapping was a third of this function's time): the same result for every value.
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return {k: from_ddb(v) for k, v in value.items()}
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, Mapping):
        return {k: from_ddb(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_ddb(v) for v in value]
    if isinstance(value, set):
        return {from_ddb(v) for v in value}
    return value


def projection(attributes: Sequence[str]) -> dict[str, Any]:
    """A read's parameters for just ``attributes`` (each through an expression attribute name),
    none for the whole item."""
    if not attributes:
        return {}
    names = {f"#p{i}": name for i, name in enumerate(attributes)}
    return {"ProjectionExpression": ", ".join(names), "ExpressionAttributeNames": names}


def cancellation_codes(error: ClientError) -> list[str]:
    """Per-item reasons of a cancelled transaction ("None" for items that were fine)."""
    return [str(r.get("Code") or "None") for r in error.response.get("CancellationReasons") or []]


def is_contention(error: ClientError) -> bool:
    """Nothing was written because of contention (a conflicting transaction, a throttled
    table, index or partition), not because a condition did not hold or the request was
    wrong: trying again is safe. A cancelled transaction is contention when every item's
    reason is ``None`` or a contention reason and one is."""
    code = error.response.get("Error", {}).get("Code", "")
    if code == "TransactionCanceledException":
        codes = cancellation_codes(error)
        if not codes:  # no reasons (an SDK that drops them): the message lists them
            message = error.response.get("Error", {}).get("Message", "")
            listed = message.rpartition("[")[2].rstrip("]") if "[" in message else ""
            codes = [c.strip() for c in listed.split(",") if c.strip()]
        return any(c in CANCELLATION_CONTENTION_REASONS for c in codes) and all(
            c in ("None", *CANCELLATION_CONTENTION_REASONS) for c in codes)
    return code in _CONTENTION_ERRORS


def with_contention_retries(call: Callable[[], T], what: str) -> T:
    """Run ``call``; on contention wait (full jitter, growing) and run it again."""
    for attempt in range(CONTENTION_RETRIES + 1):
        try:
            return call()
        except ClientError as error:
            if not is_contention(error) or attempt == CONTENTION_RETRIES:
                raise
            pause = random.uniform(0, min(CONTENTION_CAP_SECONDS, CONTENTION_BASE_SECONDS * 2 ** attempt))
            logger.info("write contended; trying again", extra={"operation": what, "attempt": attempt + 1,
                                                                 "pause_seconds": round(pause, 3)})
            clock.sleep(pause)
    raise AssertionError("unreachable")


def is_condition_failure(error: ClientError) -> bool:
    code = error.response.get("Error", {}).get("Code", "")
    if code == "ConditionalCheckFailedException":
        return True
    if code == "TransactionCanceledException":
        reasons = error.response.get("CancellationReasons") or []
        message = error.response.get("Error", {}).get("Message", "")
        return any(r.get("Code") == "ConditionalCheckFailed" for r in reasons) or (
            "ConditionalCheckFailed" in message
        )
    return False


# ------------------------------------------------------------------------- updates
@dataclass
class Update:
    """A conditional UpdateItem, usable alone or inside a transaction."""

    table: str
    key: dict[str, Any]
    set_fields: dict[str, Any] = field(default_factory=dict)
    add_to_sets: dict[str, set[Any]] = field(default_factory=dict)
    delete_from_sets: dict[str, set[Any]] = field(default_factory=dict)
    remove_fields: list[str] = field(default_factory=list)
    increments: Mapping[str, float] = field(default_factory=dict)  # an atomic ADD (counts, a TAT)
    set_if_absent: dict[str, Any] = field(default_factory=dict)  # SET a = if_not_exists(a, v)
    history_entry: dict[str, Any] | None = None
    condition: str | None = None
    condition_values: dict[str, Any] = field(default_factory=dict)
    condition_names: dict[str, str] = field(default_factory=dict)
    check_only: bool = False  # in a transaction: a ConditionCheck (nothing written)

    def transact_item(self) -> dict[str, Any]:
        if not self.check_only:
            return {"Update": self.expression()}
        check: dict[str, Any] = {"TableName": self.table, "Key": self.key,
                                 "ConditionExpression": self.condition or "attribute_exists(#ck)"}
        names = dict(self.condition_names) or {"#ck": next(iter(self.key))}
        check["ExpressionAttributeNames"] = names
        if self.condition_values:
            check["ExpressionAttributeValues"] = {k: to_ddb(v) for k, v in self.condition_values.items()}
        return {"ConditionCheck": check}

    def expression(self) -> dict[str, Any]:
        names: dict[str, str] = dict(self.condition_names)
        values: dict[str, Any] = {k: to_ddb(v) for k, v in self.condition_values.items()}
        sets, adds, deletes, removes = [], [], [], []

        def name(attr: str) -> str:
            # Nested map paths ("suspects.i-1") become "#n0.#n1".
            parts = []
            for part in attr.split("."):
                placeholder = f"#f{len(names)}"
                names[placeholder] = part
                parts.append(placeholder)
            return ".".join(parts)

        for i, (attr, value) in enumerate(self.set_fields.items()):
            values[f":s{i}"] = to_ddb(value)
            sets.append(f"{name(attr)} = :s{i}")
        for i, (attr, amount) in enumerate(self.increments.items()):
            values[f":inc{i}"] = to_ddb(amount)
            values[":zero"] = 0
            n = name(attr)
            sets.append(f"{n} = if_not_exists({n}, :zero) + :inc{i}")
        for i, (attr, value) in enumerate(self.set_if_absent.items()):
            values[f":ine{i}"] = to_ddb(value)
            n = name(attr)
            sets.append(f"{n} = if_not_exists({n}, :ine{i})")
        history_guard = None
        if self.history_entry is not None:
            values[":hist"] = [to_ddb(self.history_entry)]
            values[":empty"] = []
            values[":hmax"] = MAX_HISTORY
            n = name("history")
            sets.append(f"{n} = list_append(if_not_exists({n}, :empty), :hist)")
            # A full history is trimmed first (DynamoDbGateway._trim_history), never outgrown.
            history_guard = f"(attribute_not_exists({n}) OR size({n}) < :hmax)"
        for i, (attr, members) in enumerate(self.add_to_sets.items()):
            if members:
                values[f":a{i}"] = set(members)
                adds.append(f"{name(attr)} :a{i}")
        for i, (attr, members) in enumerate(self.delete_from_sets.items()):
            if members:
                values[f":d{i}"] = set(members)
                deletes.append(f"{name(attr)} :d{i}")
        removes = [name(attr) for attr in self.remove_fields]
        clauses = []
        if sets:
            clauses.append("SET " + ", ".join(sets))
        if adds:
            clauses.append("ADD " + ", ".join(adds))
        if deletes:
            clauses.append("DELETE " + ", ".join(deletes))
        if removes:
            clauses.append("REMOVE " + ", ".join(removes))
        params: dict[str, Any] = {
            "TableName": self.table,
            "Key": self.key,
            "UpdateExpression": " ".join(clauses),
            "ExpressionAttributeNames": names,
        }
        if values:
            params["ExpressionAttributeValues"] = values
        condition = self.condition
        if history_guard is not None:
            condition = f"({condition}) AND {history_guard}" if condition else history_guard
        if condition:
            params["ConditionExpression"] = condition
        return params


def state_condition(
    attr: str, allowed: Iterable[str], prefix: str, extra: str | None = None
) -> tuple[str, dict[str, Any], dict[str, str]]:
    """``#attr IN (:p0, :p1)`` plus its values, for an Update's condition."""
    allowed = list(allowed)
    placeholders = [f":{prefix}{i}" for i in range(len(allowed))]
    names = {f"#{prefix}": attr}
    condition = f"#{prefix} IN ({', '.join(placeholders)})"
    if extra:
        condition = f"({condition}) AND ({extra})"
    return condition, dict(zip(placeholders, allowed, strict=True)), names


class DynamoGateway:
    """The few DynamoDB operations the repositories build on (boto3 *resource* in).

    ``deadline_shards``: the by-deadline index's partition key is split over this many
    values (constants.DEADLINE_SHARDS_MAX at most): an update that puts its item in the index
    (``DEADLINE_BUCKET``) puts it in the shard of its key, so a burst of deadlines (a
    cascade's suspects and ranks) spreads over the shards' partitions; readers Query each of
    :meth:`deadline_buckets`. Any shard count reads what fewer shards wrote (shard 0 is the
    unsharded bucket)."""

    def __init__(self, dynamodb: Any, *, deadline_shards: int = 1) -> None:
        if not 1 <= deadline_shards <= DEADLINE_SHARDS_MAX:
            raise ValueError(f"deadline_shards is 1..{DEADLINE_SHARDS_MAX}, not {deadline_shards}")
        self._ddb = dynamodb
        self._client = dynamodb.meta.client  # type-transforming client (transactions)
        self._tables: dict[str, Any] = {}
        self.deadline_shards = deadline_shards

    def deadline_buckets(self, rotate: int = 0) -> list[str]:
        """Every by-deadline partition key value a reader Queries, starting at shard
        ``rotate`` (modulo the count: a reader short of time that stops part-way starts
        elsewhere next time, so no shard waits behind the others)."""
        n = self.deadline_shards
        return [deadline_bucket((rotate + i) % n) for i in range(n)]

    def _in_its_shard(self, update: Update) -> Update:
        """``update`` with the item's own shard's bucket where it sets ``DEADLINE_BUCKET``."""
        if self.deadline_shards == 1:
            return update
        key = "#".join(str(v) for v in update.key.values())
        changed: dict[str, Any] = {}
        for attr in ("set_fields", "set_if_absent"):
            fields = getattr(update, attr)
            sharded = self._fields_in_shard(key, fields)
            if sharded is not fields:
                changed[attr] = sharded
        return replace(update, **changed) if changed else update

    def _fields_in_shard(self, key: str, fields: dict[str, Any]) -> dict[str, Any]:
        """``fields`` (an update's, or a whole item put) with ``key``'s shard's bucket where
        they set ``DEADLINE_BUCKET``; ``fields`` itself when there is nothing to change."""
        if self.deadline_shards == 1 or fields.get(DEADLINE_PK) != DEADLINE_BUCKET:
            return fields
        return {**fields, DEADLINE_PK: deadline_bucket(stable_shard(key, self.deadline_shards))}

    def table(self, name: str) -> Any:
        # A boto3 Table resource costs milliseconds to build: one per table and gateway.
        handle = self._tables.get(name)
        if handle is None:
            handle = self._tables[name] = self._ddb.Table(name)
        return handle

    def get(self, table: str, key: dict[str, Any], attributes: Sequence[str] = ()) -> dict[str, Any] | None:
        """The item (only ``attributes`` of it, when given), read consistently."""
        item = self.table(table).get_item(Key=key, ConsistentRead=True, **projection(attributes)).get("Item")
        return dict(item) if item else None

    def query_all(self, table: str, **kwargs: Any) -> list[dict[str, Any]]:
        """Every page of a Query (the caller bounds it by its key condition)."""
        items: list[dict[str, Any]] = []
        handle = self.table(table)
        while True:
            response = handle.query(**kwargs)
            items.extend(response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                return items
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    def query_page(self, table: str, **kwargs: Any) -> dict[str, Any]:
        return dict(self.table(table).query(**kwargs))

    def put_if_absent(self, table: str, item: dict[str, Any], key_attr: str) -> bool:
        item = self._fields_in_shard(str(item[key_attr]), item)
        try:
            with_contention_retries(lambda: self.table(table).put_item(
                Item=item,
                ConditionExpression="attribute_not_exists(#k)",
                ExpressionAttributeNames={"#k": key_attr},
            ), "PutItem")
            return True
        except ClientError as error:
            if is_condition_failure(error):
                return False
            raise

    def put_conditional(self, table: str, item: dict[str, Any], condition: str,
                        names: dict[str, str], values: dict[str, Any]) -> bool:
        try:
            with_contention_retries(lambda: self.table(table).put_item(
                Item=item, ConditionExpression=condition, ExpressionAttributeNames=names,
                ExpressionAttributeValues=values), "PutItem")
            return True
        except ClientError as error:
            if is_condition_failure(error):
                return False
            raise

    def apply(self, update: Update) -> bool:
        """Run one conditional update; False when its condition did not hold."""
        return self.apply_returning(update, returning="NONE") is not None

    def apply_returning(self, update: Update, returning: str = "ALL_NEW") -> dict[str, Any] | None:
        """Like :meth:`apply`, returning the item as written (``returning``: DynamoDB's
        ReturnValues; None when the condition failed)."""
        update = self._in_its_shard(update)
        for _ in range(2):
            try:
                response = with_contention_retries(
                    lambda: self._client.update_item(**update.expression(), ReturnValues=returning),
                    "UpdateItem")
                return from_ddb(dict(response.get("Attributes", {})))
            except ClientError as error:
                if not is_condition_failure(error):
                    raise
                if not self._trim_history([update]):
                    return None
        return None

    def transact(self, updates: Sequence[Update]) -> bool:
        """All or nothing: no state is ever half-written across items."""
        if len(updates) == 1:
            return self.apply(updates[0])
        updates = [self._in_its_shard(u) for u in updates]
        for _ in range(2):
            try:
                with_contention_retries(lambda: self._transact_once([u.transact_item() for u in updates]),
                                        "TransactWriteItems")
                return True
            except ClientError as error:
                if not is_condition_failure(error):
                    raise
                codes = cancellation_codes(error)
                failed = [u for u, c in zip(updates, codes, strict=False) if c == "ConditionalCheckFailed"]
                if not self._trim_history(failed or list(updates)):
                    return False
        return False

    def _transact_once(self, items: list[dict[str, Any]]) -> None:
        """One transaction, asked again with its token while its outcome is unknown (its answer
        lost, an internal error, still in progress): DynamoDB answers a repeat of a committed
        transaction (same token and items, within 10 minutes) with success and no effect
        (TransactWriteItems API reference, ClientRequestToken), so the caller learns the
        outcome now instead of from the event's redelivery a minute later. The token is fresh
        per transaction: two deliveries of one event writing the same items still race on
        their conditions."""
        token = str(uuid.uuid4())
        for attempt in range(OUTCOME_RETRIES + 1):
            try:
                self._client.transact_write_items(TransactItems=items, ClientRequestToken=token)
                return
            except (ReadTimeoutError, ConnectionClosedError) as lost:
                unknown: Exception = lost
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") not in _OUTCOME_UNKNOWN_ERRORS:
                    raise
                unknown = error
            if attempt == OUTCOME_RETRIES:
                raise unknown
            logger.info("transaction's outcome unknown; asking again with its token",
                        extra={"error": type(unknown).__name__, "attempt": attempt + 1})
            clock.sleep(random.uniform(0, CONTENTION_CAP_SECONDS))

    def _trim_history(self, updates: Sequence[Update]) -> bool:
        """A job's history full (its own condition failed the write): drop its oldest entries
        and say so (the caller writes again). False: nothing to trim, the write's own
        condition did not hold. The entries dropped are folded into the job's goodput ledger
        (``domain.goodput``) in the same write, conditioned on the entries read: the ledger
        stays exact and bounded however many times the job changed state."""
        trimmed = False
        for update in updates:
            if update.history_entry is None:
                continue
            item = from_ddb(self._client.get_item(
                TableName=update.table, Key=update.key, ConsistentRead=True,
                ProjectionExpression="#h, #g, #c, #s",
                ExpressionAttributeNames={"#h": "history", "#g": goodput.LEDGER_KEY, "#c": "created_at",
                                          "#s": "job_state"}).get("Item") or {})
            history = item.get("history") or []
            if len(history) < MAX_HISTORY:
                continue
            removes = ", ".join(f"#h[{i}]" for i in range(HISTORY_TRIM))
            folded = goodput.fold_oldest(item, HISTORY_TRIM)
            try:
                self._client.update_item(
                    TableName=update.table, Key=update.key,
                    UpdateExpression=f"SET #g = :g REMOVE {removes}",
                    ConditionExpression="size(#h) >= :hmax AND #h[0].#at = :first AND "
                                        f"#h[{HISTORY_TRIM - 1}].#at = :last",
                    ExpressionAttributeNames={"#h": "history", "#g": goodput.LEDGER_KEY, "#at": "at"},
                    ExpressionAttributeValues={":hmax": MAX_HISTORY, ":g": to_ddb(folded),
                                               ":first": to_ddb(history[0].get("at")),
                                               ":last": to_ddb(history[HISTORY_TRIM - 1].get("at"))})
            except ClientError as error:
                if not is_condition_failure(error):
                    raise
            trimmed = True
        return trimmed

    def batch_get(self, table: str, keys: Sequence[dict[str, Any]],
                  attributes: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Every item of ``keys`` that exists (only ``attributes`` of it, when given; 100 keys a
        call); the keys a call leaves unprocessed are asked again after a back-off (see BATCH_GET_*,
        the projection with them: DynamoDB hands back the whole request of those keys). Raises
        :class:`UnprocessedKeysLeft` when they are still unprocessed once the patience or the
        invocation's time is spent: nothing is guessed about the items not read."""
        items: list[dict[str, Any]] = []
        for start in range(0, len(keys), _BATCH_GET_LIMIT):
            pending: dict[str, Any] = {
                table: {"Keys": list(keys[start : start + _BATCH_GET_LIMIT]), "ConsistentRead": True,
                        **projection(attributes)}
            }
            give_up_at = clock.now() + BATCH_GET_PATIENCE_SECONDS
            for round_ in range(BATCH_GET_ROUNDS):
                response = self._client.batch_get_item(RequestItems=pending)
                items.extend(response.get("Responses", {}).get(table, []))
                pending = response.get("UnprocessedKeys") or {}
                if not pending:
                    break
                pause = random.uniform(0, min(BATCH_GET_CAP_SECONDS, BATCH_GET_BASE_SECONDS * 2 ** round_))
                ends = clock.deadline()
                until = clock.now() + pause
                if until > give_up_at or (ends is not None and until > ends - BATCH_GET_MARGIN_SECONDS):
                    break
                logger.info("BatchGetItem left keys unprocessed; asking again", extra={
                    "table": table, "keys": len(pending.get(table, {}).get("Keys", [])), "round": round_ + 1,
                    "pause_seconds": round(pause, 3)})
                clock.sleep(pause)
            if pending:
                raise UnprocessedKeysLeft(f"BatchGetItem left {len(pending.get(table, {}).get('Keys', []))} "
                                          f"key(s) unprocessed on {table} after its back-off")
        return items


class UnprocessedKeysLeft(RuntimeError):
    """BatchGetItem still left keys unprocessed once its back-off was spent (the table
    throttled for longer): the caller's invocation fails and is tried again."""
