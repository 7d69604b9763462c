"""Steps the remediation scenario tests share: a queued job as the jobs API writes it, a
2-node queue job running on three nodes, the relocation waits a job's history records, a
2-node job whose rank 1 exits on a healthy GPU."""

from __future__ import annotations

import json
from typing import Any

from gpu_recovery import constants as C


def submit_queued_job(w: Any, job_id: str, *, nnodes: int, priority: int, at: float) -> None:
    """A queued job item as the jobs API writes it (tests/queue_scheduler does the same)."""
    from gpu_recovery.adapters import aws
    from gpu_recovery.repository import to_ddb

    spec = {"name": job_id, "task_definition": w.training_task_definition, "nnodes": nnodes,
            "gpus_per_node": 8, "priority": priority, "overrides": {"command": ["python", "train.py"]},
            "labels": {}}
    item = {
        C.JOB_PK: C.job_item_key(job_id), "item_type": "JOB", "job_id": job_id, "job_state": "QUEUED",
        "source": "queue", "name": job_id, "user": "alice", "priority": priority, "submitted_at": at,
        "spec_json": json.dumps(spec), "world_size": nnodes, "gpus_per_node": 8, "attempt": 0,
        "recoveries_used": 0, "max_recovery_attempts": 3, "app_restarts_used": 0, "max_app_restarts": 0,
        C.QUEUE_PK: C.QUEUE_BUCKET, C.QUEUE_SK: C.queue_order(priority, at, job_id),
        C.LIST_PK: C.LIST_BUCKET, "not_before": 0, "attempts": [], "last_error": "", "history": [],
        "suspects": {}, "verdicts": {}, "created_at": at, "updated_at": at,
    }
    aws.resource("dynamodb").Table(w.aws.job_table).put_item(Item=to_ddb(item))


def queue_job_running_on_three_nodes(w: Any, job_id: str = "q-job", *, priority: int = 10) -> None:
    """node-0..node-2 and the queue scheduler every minute; a 2-node queue job submitted and,
    two minutes later, started by the scheduler."""
    for node in ("node-0", "node-1", "node-2"):
        w.ecs.add_node(node)
    w.schedule_queue_scheduler()
    submit_queued_job(w, job_id, nnodes=2, priority=priority, at=w.ecs.now())
    w.ecs.run_for(120)


def relocation_wait_entries(job: dict[str, Any]) -> list[str]:
    """The reasons of the job's history entries that say it waits for a node."""
    reasons = [str(h.get("reason", "")) for h in job.get("history", [])]
    return [r for r in reasons if r.startswith("waiting")]


def application_error_on_node_b(w: Any, job_id: str) -> int:
    """node-a and node-b, a job with a rank on each allowed one application-error restart, and,
    a minute on, rank 1's exit on node-b whose diag will pass (an application error). Returns
    how many tasks were placed before the fault."""
    for node in ("node-a", "node-b"):
        w.ecs.add_node(node)
    w.ecs.start_job(job_id, w.training_task_definition, ["node-a", "node-b"],
                    extra_tags={C.TAG_MAX_APP_RESTARTS: "1"})
    w.ecs.run_for(60)
    placed = len(w.ecs.placements)
    w.ecs.inject_gpu_fault("node-b", after=10, health="healthy", nccl_cascade=True)
    return placed
