"""``MemoryDynamo``: the in-memory DynamoDB, whole (see the package docstring)."""

from __future__ import annotations

from .reads import Reads
from .writes import BatchWrites


class MemoryDynamo(Reads, BatchWrites):
    """An in-memory DynamoDB with the boto3 resource interface (see ``local_mode.sim.dynamo``).

    ``tables`` maps a table name to its kind in ``gpu_recovery.constants.table_definitions()``
    ("job", "instance", "node_token", "quota"); ``create_table`` adds others.
    """
