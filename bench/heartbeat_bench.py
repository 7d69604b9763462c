"""Heartbeat benchmark (offline, moto): writes per report, sweep reads, handling time, import time.

    python -m bench.heartbeat_bench            # prints a JSON dict; run() returns it

* writes per report: DynamoDB write calls (UpdateItem / PutItem / items of
  TransactWriteItems / BatchWriteItem) made while one node with 8 RUNNING ranks
  reports its 8 tasks, counted with botocore ``after-call`` hooks registered on
  ``gpu_recovery.adapters.aws.session().events`` before any client exists.
* sweep reads: items returned to the sweep (Query Count + GetItem + BatchGetItem
  items) with N watched RUNNING ranks of which 10 are stale. The table is seeded with
  BatchWriteItem straight into moto; N = 100,000 if seeding + sweep fit in
  ``BENCH_SWEEP_BUDGET_S`` (default 60 s), else the measured N is reported.
* median in-process handling time of one report through ``handlers.node_api`` (moto).
* cold import time of ``handlers.node_api`` in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NODE = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
WRITE_OPS = {"UpdateItem", "PutItem", "DeleteItem"}


class DdbCounter:
    def __init__(self) -> None:
        self.writes = 0
        self.items_read = 0
        self.calls: dict[str, int] = {}

    def reset(self) -> None:
        self.writes = self.items_read = 0
        self.calls.clear()

    def after_call(self, http_response: Any = None, parsed: Any = None, model: Any = None, **_: Any) -> None:
        op = model.name
        self.calls[op] = self.calls.get(op, 0) + 1
        parsed = parsed or {}
        if op in WRITE_OPS:
            self.writes += 1
        elif op == "TransactWriteItems":
            self.writes += int((parsed.get("ResponseMetadata") or {}).get("_items", 0)) or 0
        elif op == "Query" or op == "Scan":
            self.items_read += int(parsed.get("Count", len(parsed.get("Items", []))))
        elif op == "GetItem":
            self.items_read += 1 if parsed.get("Item") else 0
        elif op == "BatchGetItem":
            self.items_read += sum(len(v) for v in (parsed.get("Responses") or {}).values())

    def before_transact(self, params: Any = None, context: Any = None, **_: Any) -> None:
        self.writes += len((params or {}).get("TransactItems", []))


def _setup_local() -> tuple[Any, DdbCounter]:
    from gpu_recovery import runtime
    from gpu_recovery.adapters import aws
    from local_mode.emulator import LocalAws
    from local_mode.server import create_node_token_table

    local = LocalAws(metrics_disabled=True)
    local.__enter__()
    create_node_token_table(local)
    runtime.reset()
    aws.reset()  # a fresh session: hooks are registered before any client exists
    counter = DdbCounter()
    events = aws.session().events
    events.register("after-call.dynamodb", counter.after_call)
    events.register("provide-client-params.dynamodb.TransactWriteItems", counter.before_transact)
    return local, counter


def _seed_job(job_id: str, ranks: int, node: str, hb: float | None) -> list[str]:
    from gpu_recovery import runtime
    from gpu_recovery.constants import JobState, RankState
    from gpu_recovery.domain.models import Instance, Job, Rank

    repo = runtime.repository()
    arn = f"arn:aws:ecs:us-east-1:123456789012:container-instance/gpu-cluster/{node}"
    repo.instances.put_instance_if_absent(Instance(node, container_instance_arn=arn))
    repo.registrations.create_job_if_absent(Job(job_id, JobState.RUNNING, ranks))
    arns = []
    for r in range(ranks):
        arn = f"arn:aws:ecs:us-east-1:123456789012:task/gpu-cluster/{job_id}-{r}"
        repo.registrations.put_rank_registration(Rank(job_id, r, RankState.RUNNING, 1, arn, "td", node))
        arns.append(arn)
    return arns


def _event(body: dict[str, Any]) -> dict[str, Any]:
    event = json.loads((REPO / "tests" / "events" / "apigw_report_tasks.json").read_text())
    event["body"] = json.dumps(body)
    event["requestContext"]["authorizer"] = {"principalId": NODE, "node_id": NODE}
    return event


def measure_writes_and_latency(samples: int = 100) -> dict[str, Any]:
    from gpu_recovery import runtime
    from gpu_recovery.domain.heartbeat_policy import ReportedTask
    from handlers import node_api
    from local_mode.server import API_TIMEOUT_SECONDS
    from local_mode.sim.lambda_context import LambdaContext

    local, counter = _setup_local()
    try:
        arns = _seed_job("bench-8", 8, NODE, None)
        svc = runtime.heartbeat_service()
        now = time.time()
        svc.report_tasks(NODE, now, [ReportedTask(a) for a in arns])  # warm up: clients, first hb
        counter.reset()
        svc.report_tasks(NODE, now + 1, [ReportedTask(a) for a in arns])
        writes, calls = counter.writes, dict(counter.calls)
        timings = []
        for i in range(samples):
            body = {"node_id": NODE, "timestamp": time.time() + 2 + i * 1e-3,
                    "tasks": [{"task_arn": a, "step": i} for a in arns]}
            event = _event(body)
            context = LambdaContext("node-api", timeout_seconds=API_TIMEOUT_SECONDS)
            start = time.perf_counter()
            response = node_api.lambda_handler(event, context)
            timings.append(time.perf_counter() - start)
            assert response["statusCode"] == 200, response
        return {"writes_per_report_8_tasks": writes, "ddb_calls_per_report": calls,
                "report_handling_median_ms": round(statistics.median(timings) * 1000, 2),
                "report_handling_p90_ms": round(sorted(timings)[int(len(timings) * 0.9)] * 1000, 2)}
    finally:
        local.__exit__(None, None, None)


def measure_sweep(ranks: int, stale: int = 10) -> dict[str, Any]:
    from gpu_recovery import clock, runtime
    from gpu_recovery.constants import JOB_BY_INSTANCE_PK, JOB_PK, JobState
    from gpu_recovery.domain.heartbeat_policy import heartbeat_slot_seconds
    from gpu_recovery.repository.heartbeat import heartbeat_index_fields

    local, counter = _setup_local()
    try:
        ddb = local.client("dynamodb")
        now = time.time()
        table = local.job_table
        start = time.perf_counter()
        per_job = 8
        slot = heartbeat_slot_seconds(180)
        batch: list[dict[str, Any]] = []

        # Seeding is setup, not the measured path: write straight into the emulator's table
        # (through the API, 100,000 ranks take minutes in moto).
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.dynamodb.models import dynamodb_backends

        moto_table = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].get_table(table)
        del ddb

        def flush() -> None:
            for request in batch:
                moto_table.put_item(request["PutRequest"]["Item"])
            batch.clear()

        for j in range(ranks // per_job):
            job_id = f"job{j:06d}"
            batch.append({"PutRequest": {"Item": {
                JOB_PK: {"S": f"{job_id}#JOB"}, "job_id": {"S": job_id},
                "job_state": {"S": JobState.RUNNING.value}, "world_size": {"N": str(per_job)},
                "attempt": {"N": "1"}}}})
            for r in range(per_job):
                index = j * per_job + r
                hb = now - 600 if index < stale else now - 5
                batch.append({"PutRequest": {"Item": {
                    JOB_PK: {"S": f"{job_id}#{r}"}, "job_id": {"S": job_id}, "rank": {"N": str(r)},
                    "rank_state": {"S": "RUNNING"}, "attempt": {"N": "1"},
                    "task_arn": {"S": f"arn:aws:ecs:us-east-1:123456789012:task/gpu-cluster/{job_id}-{r}"},
                    "container_inst_id": {"S": f"node{j:06d}"}, JOB_BY_INSTANCE_PK: {"S": f"node{j:06d}"},
                    **{k: ({"N": repr(v)} if isinstance(v, int | float) else {"S": v}) for k, v in
                       heartbeat_index_fields(job_id, r, hb, slot).items()}}}})
                if len(batch) >= 25:
                    flush()
        if batch:
            flush()
        seed_s = time.perf_counter() - start
        clock.set_clock(lambda: now)
        svc = runtime.heartbeat_service()
        counter.reset()
        t0 = time.perf_counter()
        result = svc.sweep()
        sweep_s = time.perf_counter() - t0
        return {"ranks": ranks, "stale": stale, "sweep_items_returned_by_index": result.read,
                "sweep_items_read_total": counter.items_read, "sweep_ddb_calls": dict(counter.calls),
                "marked_lost": len(result.marked_lost), "seed_seconds": round(seed_s, 1),
                "sweep_seconds_in_moto": round(sweep_s, 2)}
    finally:
        clock.reset_clock()
        local.__exit__(None, None, None)


def measure_cold_import(repeat: int = 3) -> float:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'lambdas'}:{REPO}", "POWERTOOLS_TRACE_DISABLED": "true",
           "AWS_DEFAULT_REGION": "us-east-1"}
    code = ("import time; t = time.perf_counter(); import handlers.node_api; "
            "print(time.perf_counter() - t)")
    runs = [float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                 check=True).stdout.strip()) for _ in range(repeat)]
    return round(min(runs) * 1000, 1)


def run() -> dict[str, Any]:
    budget = float(os.environ.get("BENCH_SWEEP_BUDGET_S", "300"))
    result: dict[str, Any] = {}
    result.update(measure_writes_and_latency())
    small = measure_sweep(10_000)
    result["sweep_10k"] = small
    estimate = (small["seed_seconds"] + small["sweep_seconds_in_moto"]) * 10
    if estimate <= budget:
        result["sweep_100k"] = measure_sweep(100_000)
    else:
        result["sweep_100k"] = f"skipped: estimated {estimate:.0f} s in moto > budget {budget:.0f} s"
        print(f"100,000-rank sweep skipped: estimated {estimate:.0f} s > BENCH_SWEEP_BUDGET_S={budget:.0f}")
    result["cold_import_node_api_ms"] = measure_cold_import()
    print(json.dumps(result, indent=2, default=str))
    return result


if __name__ == "__main__":
    run()
