"""Scheduler tick cost: DynamoDB items read, ECS calls by operation, in-process time.

Runs offline against moto + SimulatedEcs (GPU accounting). One tick with
1,000 GPU nodes and 10,000 queued jobs, then the same with 1,000 queued jobs: the
reads must follow what can be placed now, not the queue's length. A third case fills
the cluster first (no free GPU): the tick must stop after the first page.

    PYTHONPATH=lambdas:. .venv/bin/python -m bench.scheduler_bench [nodes] [jobs...]
"""

from __future__ import annotations

import json
import logging
import sys
import time
import warnings
from collections import Counter
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery import runtime
from gpu_recovery.adapters import aws
from gpu_recovery.queue.scheduler import SchedulerConfig, build_scheduler
from gpu_recovery.repository import to_ddb


class CallCounter:
    """botocore after-call hook: API calls by service/operation and DynamoDB items read."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.items_read = 0

    def __call__(self, http_response: Any = None, parsed: Any = None, model: Any = None, **_: Any) -> None:
        service = model.service_model.service_id.hyphenize()
        self.calls[f"{service}:{model.name}"] += 1
        if service != "dynamodb" or not isinstance(parsed, dict):
            return
        if model.name in ("Query", "Scan"):
            self.items_read += int(parsed.get("Count", 0))
        elif model.name == "GetItem":
            self.items_read += 1 if parsed.get("Item") else 0
        elif model.name == "BatchGetItem":
            self.items_read += sum(len(v) for v in (parsed.get("Responses") or {}).values())

    def reset(self) -> None:
        self.calls.clear()
        self.items_read = 0

    def by_service(self, service: str) -> dict[str, int]:
        return {k.split(":", 1)[1]: v for k, v in sorted(self.calls.items()) if k.startswith(f"{service}:")}


def _seed_jobs(local: Any, td: str, count: int, start: float) -> None:
    ddb = local.client("dynamodb")
    from boto3.dynamodb.types import TypeSerializer

    ser = TypeSerializer()
    batch: list[dict[str, Any]] = []
    for i in range(count):
        job_id = f"bench-{i:05d}"
        nnodes, gpus = (1, 8) if i % 3 else (2, 8)
        priority = (0, 20, 50)[i % 3]
        at = start + i * 0.001
        spec = {"name": job_id, "task_definition": td, "overrides": {"command": ["train"]},
                "nnodes": nnodes, "gpus_per_node": gpus, "priority": priority}
        item = to_ddb({
            C.JOB_PK: C.job_item_key(job_id), "item_type": "JOB", "job_id": job_id,
            "job_state": "QUEUED", "source": "queue", "name": job_id, "user": "bench",
            "priority": priority, "submitted_at": at, "spec_json": json.dumps(spec),
            "world_size": nnodes, "gpus_per_node": gpus, "attempt": 0, "recoveries_used": 0,
            "max_recovery_attempts": 1, C.QUEUE_PK: C.QUEUE_BUCKET,
            C.QUEUE_SK: C.queue_order(priority, at, job_id), C.LIST_PK: C.LIST_BUCKET,
            "not_before": 0, "attempts": [], "history": [],
        })
        batch.append({"PutRequest": {"Item": {k: ser.serialize(v) for k, v in item.items()}}})
        if len(batch) == 25:
            ddb.batch_write_item(RequestItems={local.job_table: batch})
            batch = []
    if batch:
        ddb.batch_write_item(RequestItems={local.job_table: batch})


def _one_case(nodes: int, jobs: int, *, fill_first: bool = False) -> dict[str, Any]:
    from local_mode.world import build_world

    # The scheduler alone: no recovery Lambdas on the bus.
    with build_world(handlers=False) as world:
        local, sim = world.aws, world.ecs
        counter = CallCounter()
        # LocalAws has reset the adapters; count on the session before any client exists.
        aws.session().events.register("after-call", counter)
        t0 = time.perf_counter()
        for i in range(nodes):
            sim.add_node(f"n{i:04d}", gpus=8)
        register_s = time.perf_counter() - t0
        td = sim.register_training_task_definition("bench", gpus=8)
        t0 = time.perf_counter()
        _seed_jobs(local, td, jobs, sim.now())
        seed_s = time.perf_counter() - t0
        svc = runtime.recovery_service()
        config = SchedulerConfig(max_admissions=10**6 if fill_first else 20, time_budget_seconds=10**6)
        scheduler = build_scheduler(
            repo=svc.repo, ecs_adapter=svc.ecs, recovery=svc, ecs_client=aws.client("ecs"),
            ec2_client=aws.client("ec2"), ssm_client=aws.client("ssm"), cluster=svc.settings.cluster,
            config=config)
        if fill_first:
            scheduler.tick()  # admits until no GPU is left
            scheduler = build_scheduler(
                repo=svc.repo, ecs_adapter=svc.ecs, recovery=svc, ecs_client=aws.client("ecs"),
                ec2_client=aws.client("ec2"), ssm_client=aws.client("ssm"),
                cluster=svc.settings.cluster, config=SchedulerConfig())
        counter.reset()
        t0 = time.perf_counter()
        result = scheduler.tick()
        tick_s = time.perf_counter() - t0
        return {
            "nodes": nodes,
            "queued_jobs": jobs,
            "cluster_prefilled": fill_first,
            "admitted": len(result.admitted),
            "queue_items_read": result.queue_items_read,
            "stop_reason": result.stop_reason,
            "dynamodb_items_read": counter.items_read,
            "dynamodb_calls": counter.by_service("dynamodb"),
            "ecs_calls": counter.by_service("ecs"),
            "ec2_calls": counter.by_service("ec2"),
            "tick_seconds_in_process": round(tick_s, 3),
            "setup_seconds": {"register_nodes": round(register_s, 2), "seed_jobs": round(seed_s, 2)},
        }


def run(nodes: int = 1000, job_counts: tuple[int, ...] = (10_000, 1_000)) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    logging.getLogger().setLevel(logging.ERROR)
    cases = [_one_case(nodes, n) for n in job_counts]
    cases.append(_one_case(nodes // 10 or 1, job_counts[-1], fill_first=True))
    report = {"cases": cases}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    run(args[0] if args else 1000, tuple(args[1:]) or (10_000, 1_000))
