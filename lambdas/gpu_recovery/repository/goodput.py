"""Reads for the cluster's goodput view (``gpu-recovery-admin goodput``): the jobs submitted
in a period, newest first, from the job-list index (a Query bounded by the period, never a
Scan), and a node's own fault history for the lemon list."""

from __future__ import annotations

from typing import Any

from gpu_recovery.constants import JOB_LIST_INDEX, LIST_BUCKET, LIST_PK, SUBMITTED_SK
from gpu_recovery.repository.base import DynamoGateway, from_ddb

MAX_JOBS = 20_000  # a period that many jobs long is refused (ask for a shorter one)


class TooManyJobs(RuntimeError):
    pass


def jobs_submitted_since(db: DynamoGateway, job_table: str, since: float) -> list[dict[str, Any]]:
    """Every job item submitted at or after ``since`` (the list index projects every attribute)."""
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {
        "IndexName": JOB_LIST_INDEX, "KeyConditionExpression": "#pk = :pk AND #sk >= :since",
        "ExpressionAttributeNames": {"#pk": LIST_PK, "#sk": SUBMITTED_SK},
        "ExpressionAttributeValues": {":pk": LIST_BUCKET, ":since": _number(since)},
        "ScanIndexForward": False}
    while True:
        page = db.query_page(job_table, **kwargs)
        items += [from_ddb(dict(i)) for i in page.get("Items", [])]
        if len(items) > MAX_JOBS:
            raise TooManyJobs(f"more than {MAX_JOBS} jobs in the period: ask for a shorter one")
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _number(value: float) -> Any:
    from decimal import Decimal

    return Decimal(str(round(value, 3)))
