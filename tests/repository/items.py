"""Stored items read and written as they are, for the repository's tests: what a test sets up
beside the intent under test, and what it checks the intent wrote."""

from __future__ import annotations

from typing import Any

import boto3

from gpu_recovery import constants as C
from gpu_recovery.repository.base import from_ddb, to_ddb
from tests.recovery.fakes import REGION


def _table(name: str) -> Any:
    return boto3.resource("dynamodb", region_name=REGION).Table(name)


def job_item(job_id: str, *, rank: int | None = None) -> dict[str, Any]:
    """The job's item (or, ``rank``, that rank's), as stored."""
    key = C.job_item_key(job_id) if rank is None else C.rank_item_key(job_id, rank)
    item = _table("jobs").get_item(Key={C.JOB_PK: key}).get("Item")
    assert item is not None, key
    return from_ddb(item)


def instance_item(node: str) -> dict[str, Any]:
    item = _table("instances").get_item(Key={C.INSTANCE_PK: node}).get("Item")
    assert item is not None, node
    return from_ddb(item)


def set_job_fields(job_id: str, **fields: Any) -> None:
    """Fields the stage before the one under test would have written on the job's item."""
    _set("jobs", {C.JOB_PK: C.job_item_key(job_id)}, fields)


def set_instance_fields(node: str, **fields: Any) -> None:
    _set("instances", {C.INSTANCE_PK: node}, fields)


def _set(table: str, key: dict[str, Any], fields: dict[str, Any]) -> None:
    names = {f"#f{i}": name for i, name in enumerate(fields)}
    values = {f":v{i}": to_ddb(value) for i, value in enumerate(fields.values())}
    _table(table).update_item(
        Key=key, UpdateExpression="SET " + ", ".join(f"#f{i} = :v{i}" for i in range(len(fields))),
        ExpressionAttributeNames=names, ExpressionAttributeValues=values)


def set_rank_fields(job_id: str, rank: int, **fields: Any) -> None:
    _set("jobs", {C.JOB_PK: C.rank_item_key(job_id, rank)}, fields)
