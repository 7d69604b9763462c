"""``MemoryDynamo``: an in-memory DynamoDB behind the boto3 *resource* API, fast enough for
recoveries of thousands of ranks (the scale simulator, ``local_mode/sim/engine.py``).

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
* **client request tokens**: a TransactWriteItems that committed with a ``ClientRequestToken``
  is remembered for 10 simulated minutes: the same token and items again succeed with no
  effect, other items under it are ``IdempotentParameterMismatchException``.
* **latency**: ``on_call(operation)`` is called after each call (the simulator advances
  the caller's simulated clock there).
* **partition throughput** (``partition_throughput=PartitionThroughput()``, off by default;
  ``throughput.py``): about 1,000 write and 3,000 read units a second per partition key value
  of the table and of each GSI, a GSI partition's limit refusing the base table's write (GSI
  back-pressure): ``ProvisionedThroughputExceededException`` with its ``ThrottlingReasons``
  (``ThrottlingError`` in a cancelled transaction). GetItem, Query, PutItem, UpdateItem,
  DeleteItem and TransactWriteItems are admitted per partition; BatchGetItem (whose
  throttled answer is a partial one, ``UnprocessedKeys``), BatchWriteItem (the stack never
  calls it) and Scan are not.

The same store also answers real botocore clients (``LocalAws(dynamodb="memory")``, see
``local_mode.sim.dynamo.botocore_backend``): :meth:`MemoryDynamo.respond` takes a call's parameters in
DynamoDB JSON, as a client holds them after boto3's mapping, and answers what botocore would
have parsed (an error as a response, not raised); CreateTable, DescribeTable, DeleteTable,
ListTables and the TTL settings are the control plane the emulator uses.

Not modelled: table- and account-level throughput (on-demand tables), TTL expiry, streams, LSIs, PartiQL,
legacy parameters (``Expected``, ``AttributeUpdates``, ``KeyConditions``), eventual
consistency (every read sees the last write; GSI reads too).
"""

from __future__ import annotations

from .clients import MemoryDynamoClient, MemoryTable
from .storage import Meter, Usage
from .store import MemoryDynamo
from .throughput import PartitionThroughput
from .values import DEFAULT_TX_CONFLICT_WINDOW, MAX_ITEM_BYTES, item_size

__all__ = [
           "DEFAULT_TX_CONFLICT_WINDOW",
           "MAX_ITEM_BYTES",
           "MemoryDynamo",
           "MemoryDynamoClient",
           "MemoryTable",
           "Meter",
           "PartitionThroughput",
           "Usage",
           "item_size",
]
