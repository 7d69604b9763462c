"""Queue launches the scheduler tests set up on the simulated GPU cluster, and the recovery's
metrics as a test reads them."""

from __future__ import annotations

from typing import Any

from tests.queue_scheduler._cluster_moves import steal_gpus


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


class Recorded:
    """The recovery's metrics, as emitted."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def add_metric(self, name: str, unit: str, value: float) -> None:
        self.names.extend([name] * int(value))
