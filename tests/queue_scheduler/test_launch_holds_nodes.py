"""A queue launch in progress holds the nodes its plan gave its ranks: a relocation looking for
a free node (``recovery.restart_nodes``) never takes one of them, started or not yet."""

from __future__ import annotations

from typing import Any

from gpu_recovery.constants import JobState
from gpu_recovery.domain.models import Job
from tests.fixtures.queue_cluster import make_queue_cluster
from tests.queue_scheduler._cluster_moves import launch_dies_starting


def test_a_relocation_does_not_take_a_node_a_launch_in_progress_planned(monkeypatch: Any) -> None:
    """Given a 2-node launch claimed on a 2-node cluster whose start fan-out died before its
    first StartTask (both nodes still free for ECS, the launch's intent left to the sweep)
    When a relocation of another job looks for a free node
    Then both planned nodes are held by the launch, and the relocation finds none; the placement
    holds do not reserve them."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        job = qc.submit(nnodes=2, gpus=8)
        launch_dies_starting(qc, monkeypatch, 1)
        qc.scheduler().tick()
        item = qc.item(job)
        assert item["job_state"] == JobState.STARTING.value and "launched_at" not in item
        assert qc.live_tasks(job) == []
        nodes = qc.recovery.restarts.nodes
        planned = {qc.sim.node(n).container_instance_id for n in ("node-0", "node-1")}

        held = nodes.held(launches=True)
        assert {n: held.nodes.get(n) for n in planned} == {n: job for n in planned}
        # Not reserved by the placement holds (a recovery's): the launch places its ranks itself.
        assert not planned & set(nodes.held().nodes)
        other = Job("relocating", JobState.PENDING_RESTART, world_size=1, attempt=1)
        assert nodes.free_for(other, ["gone-node"]).targets is None
    finally:
        gen.close()
