"""A job's control secret, read for the job-control authorizer: one GetItem of the job item,
in a module of its own so that the authorizer loads no other repository."""

from __future__ import annotations

from gpu_recovery.constants import JOB_PK, job_item_key
from gpu_recovery.repository.base import DynamoGateway


class ControlSecrets:
    def __init__(self, db: DynamoGateway, job_table: str) -> None:
        self._db = db
        self._job_table = job_table

    def of(self, job_id: str) -> str:
        """The job's ``control_secret``; "" for no such job (or an item that is not a job's),
        or a job without one."""
        item = self._db.get(self._job_table, {JOB_PK: job_item_key(job_id)})
        if item is None or item.get("item_type", "JOB") != "JOB":
            return ""
        return str(item.get("control_secret") or "")
