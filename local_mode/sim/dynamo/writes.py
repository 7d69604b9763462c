"""BatchWriteItem and TransactWriteItems, with the transaction conflict model."""

from __future__ import annotations

from typing import Any

from moto.dynamodb.models.dynamo_type import DynamoType

from .core import DynamoCore
from .expressions import _check_tokens_used
from .storage import _read_units, _Stored, _Table, _Usages, _write_units
from .values import MAX_BATCH_WRITE_ITEMS, MAX_TRANSACT_ITEMS, _Failure, _new_item, _validation

#: how long DynamoDB remembers a transaction's ClientRequestToken after it completes
TOKEN_WINDOW_SECONDS = 600.0


class BatchWrites(DynamoCore):
    """The multi-item writes of :class:`~local_mode.sim.dynamo.MemoryDynamo`."""

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
        token = p.get("ClientRequestToken")
        if token and self._repeated(token, actions, now):
            return {}
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
                        u.conflicts_by_item[table.key_label(key)] += 1
        if not failed and self.partition_throughput is not None:
            refused = self._throttled_transaction(planned)
            if refused is not None:
                failed = True
                throttled = {"Code": "ThrottlingError",
                             "Message": "Throughput exceeds the current capacity of your table or index."}
                reasons = [dict(throttled) if hit else {"Code": "None"} for hit in refused]
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
        if token:
            # a reference, not a copy: the request's items are the serializer's own, never
            # changed after the call, and compared only when their token comes again
            self._tx_tokens[token] = (now, actions)
            self._tx_token_order.append((now, token))
        return {}

    def _repeated(self, token: str, actions: list[dict[str, Any]], now: float) -> bool:
        """A committed transaction's token asked again within the window: True when its items
        are the same (success, nothing written again), IdempotentParameterMismatchException
        when they differ; False for a new token (the expired ones are forgotten here)."""
        order = self._tx_token_order
        while order and now - order[0][0] >= TOKEN_WINDOW_SECONDS:  # forgotten oldest first: O(1) a call
            _, old_token = order.popleft()
            self._tx_tokens.pop(old_token, None)
        seen = self._tx_tokens.get(token)
        if seen is None or now - seen[0] >= TOKEN_WINDOW_SECONDS:
            return False
        if seen[1] != actions:
            raise _Failure("IdempotentParameterMismatchException",
                           "DynamoDB rejected the request because you retried a request with a different "
                           "payload but with an idempotent token that was already used.")
        return True

    def _throttled_transaction(self, planned: list[tuple[_Table, tuple[Any, ...], _Stored | None,
                                                         _Stored | None, set[str] | None, bool]]
                               ) -> list[bool] | None:
        """None when every partition the transaction writes has room this second (the units
        are taken: twice a write's, as DynamoDB charges a transactional write); else, per
        action, whether it writes the partition over its limit (nothing is taken)."""
        assert self.partition_throughput is not None
        per_action = [table.write_loads(key, new, touched, 2 * _write_units(max(
                          new.size if new is not None else 0, old.size if old is not None else 0)))
                      if writes else [] for table, key, old, new, touched, writes in planned]
        every = [load for loads in per_action for load in loads]
        refused = self.partition_throughput.admit(self.now(), every, write=True)
        if refused is None:
            return None
        return [any(partition == refused for partition, _ in loads) for loads in per_action]
