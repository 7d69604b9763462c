"""Queue launches the scheduler tests set up on the simulated GPU cluster, and the recovery's
metrics as a test reads them."""

from __future__ import annotations

from typing import Any

from gpu_recovery import constants as C
from tests.queue_scheduler._cluster_moves import steal_gpus


def set_fields(qc: Any, job: str, **fields: Any) -> None:
    """Fields of a job's item written as they are (no transition)."""
    item = qc.item(job)
    names = {f"#f{i}": name for i, name in enumerate(fields)}
    qc.table().update_item(
        Key={C.JOB_PK: item[C.JOB_PK]},
        UpdateExpression="SET " + ", ".join(f"#f{i} = :v{i}" for i in range(len(fields))),
        ExpressionAttributeNames=names,
        ExpressionAttributeValues={f":v{i}": value for i, value in enumerate(fields.values())})


def launch_that_fails_on_node_1(qc: Any) -> tuple[str, Any, list[str]]:
    """A 2-node job on a 2-node cluster whose node-1 another tenant takes between the tick's
    snapshot and its StartTask (once): rank 0 starts, rank 1 is not placed. The job, the
    scheduler whose next tick launches it, and the other tenant's task (once taken)."""
    job = qc.submit(nnodes=2, gpus=8)
    scheduler = qc.scheduler()
    real_snapshot = scheduler.snapshot
    thieves: list[str] = []

    def racing_snapshot() -> Any:
        nodes = real_snapshot()
        if not thieves:
            thieves.append(steal_gpus(qc, "node-1"))
        return nodes

    scheduler.snapshot = racing_snapshot  # type: ignore[method-assign]
    return job, scheduler, thieves


def requeued_launch_failed_on_node_1(qc: Any) -> tuple[str, list[str]]:
    """:func:`launch_that_fails_on_node_1` launched by a tick, which requeues the job (rank 1 not
    placed, rank 0 left to the aborted launch's stop). The job and the other tenant's task."""
    job, scheduler, thieves = launch_that_fails_on_node_1(qc)
    [launch] = scheduler.tick().launches
    assert launch["action"] == "requeued"
    return job, thieves


class Recorded:
    """The recovery's metrics, as emitted: ``names`` every count, ``flushed_now`` those flushed at
    once (``add_metric_now``)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.flushed_now: list[str] = []

    def add_metric(self, name: str, unit: str, value: float) -> None:
        self.names.extend([name] * int(value))

    def add_metric_now(self, name: str, unit: str, value: float) -> None:
        self.add_metric(name, unit, value)
        self.flushed_now.extend([name] * int(value))
