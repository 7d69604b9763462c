"""Recovery-loop figures: AWS calls per event, DynamoDB items read vs table size, timings.

Measured against the embedded emulator with the real handlers and the simulated
ECS data plane; every AWS call is counted by a botocore ``after-call`` hook on the
handlers' session, attributed to the handler that made it.
"""

from __future__ import annotations

import contextvars
import json
import logging
import statistics
import subprocess
import sys
import time
import warnings
from collections import Counter, defaultdict
from typing import Any

from gpu_recovery import constants as C

HANDLERS = ("ecs_task_handler", "dcgm_task_monitor", "ecs_instance_monitor", "recovery_sweep",
            "tag_lookup_worker", "gang_worker")
_current: contextvars.ContextVar[str] = contextvars.ContextVar("handler", default="(setup)")


class CallMeter:
    """Counts AWS operations and DynamoDB items read, per handler."""

    def __init__(self) -> None:
        self.calls: dict[str, Counter[str]] = defaultdict(Counter)
        self.items_read: Counter[str] = Counter()
        self.events: Counter[str] = Counter()
        self.seconds: dict[str, list[float]] = defaultdict(list)

    def after_call(self, http_response: Any = None, parsed: Any = None, model: Any = None,
                   event_name: str = "", **_: Any) -> None:
        handler = _current.get()
        if handler == "(setup)":
            return
        service = event_name.split(".")[1] if event_name.count(".") >= 2 else "?"
        operation = model.name if model is not None else event_name.rsplit(".", 1)[-1]
        self.calls[handler][f"{service}:{operation}"] += 1
        if service == "dynamodb" and isinstance(parsed, dict):
            self.items_read[handler] += _items_in(operation, parsed)

    def wrap(self, name: str, target: Any) -> Any:
        def measured(event: dict[str, Any], context: Any) -> Any:
            token = _current.set(name)
            started = time.perf_counter()
            try:
                return target(event, context)
            finally:
                self.seconds[name].append(time.perf_counter() - started)
                self.events[name] += 1
                _current.reset(token)

        return measured


def _items_in(operation: str, parsed: dict[str, Any]) -> int:
    if operation == "GetItem":
        return 1 if parsed.get("Item") else 0
    if operation in ("Query", "Scan"):
        return int(parsed.get("Count", len(parsed.get("Items", []))))
    if operation == "BatchGetItem":
        return sum(len(v) for v in parsed.get("Responses", {}).values())
    return 0


def _seed_history(local: Any, jobs: int) -> None:
    """Fill the job table with finished jobs (job item + one rank each): history
    that an event path must never read."""
    client = local.client("dynamodb")
    items = []
    for n in range(jobs):
        job_id = f"old-{n:06d}"
        items.append({C.JOB_PK: {"S": C.job_item_key(job_id)}, "job_id": {"S": job_id},
                      "item_type": {"S": "JOB"}, "job_state": {"S": "COMPLETE"},
                      "world_size": {"N": "1"}, "attempt": {"N": "1"}})
        items.append({C.JOB_PK: {"S": C.rank_item_key(job_id, 0)}, "job_id": {"S": job_id},
                      "item_type": {"S": "RANK"}, "rank": {"N": "0"}, "rank_state": {"S": "DONE"},
                      "attempt": {"N": "1"}, C.JOB_BY_TASK_PK: {"S": f"arn:aws:ecs:task/old/{n}"},
                      "container_inst_id": {"S": "ci-old"}})
    # Written straight into the emulator's table: seeding is setup, not the measured path.
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.dynamodb.models import dynamodb_backends

    table = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].get_table(C.DEFAULT_JOB_TABLE_NAME)
    for item in items:
        table.put_item(item)
    del client


def run_scenario(ranks: int, history_jobs: int = 0, minutes: int = 90) -> CallMeter:
    """One job of ``ranks`` ranks (one per node) hits a GPU fault and is recovered.

    With ``minutes`` >= 70 the restarted job also runs to completion.
    """
    from gpu_recovery import runtime
    from gpu_recovery.adapters import aws
    from local_mode.world import build_world

    meter = CallMeter()
    with build_world() as world:
        local, bus, sim = world.aws, world.bus, world.ecs
        # Setting up the world calls no API: the meter sees the scenario's calls only.
        aws.session().events.register("after-call", meter.after_call)
        if history_jobs:
            _seed_history(local, history_jobs)
        for rule in bus.rules:
            rule.target = meter.wrap(rule.target_name, rule.target)
        for schedule in bus.schedules:
            schedule.target = meter.wrap(schedule.target_name, schedule.target)
        for queue in bus.queues.values():  # the workers: tag lookups (the tagged job's ranks), gangs
            queue.target = meter.wrap(queue.target_name, queue.target)
        nodes = [f"node-{i}" for i in range(ranks)]
        for node in nodes:
            sim.add_node(node)
        td = sim.register_training_task_definition("train", gpus=8)
        sim.plan_family("train", run_seconds=3600)
        sim.start_job("bench", td, nodes)
        sim.inject_gpu_fault(nodes[-1], after=300, health="reboot_fixable", nccl_cascade=True)
        sim.run_for(minutes * 60)
        job = runtime.recovery_service().repo.jobs.get_job("bench")
        if job is None:
            raise RuntimeError("bench scenario lost its job")
        if job.attempt != 2 or (minutes >= 70 and job.state is not C.JobState.COMPLETE):
            raise RuntimeError(f"bench scenario did not recover: {job.state} attempt {job.attempt}")
    return meter


def cold_import_seconds(module: str, repeats: int = 3) -> float:
    code = (f"import time; t=time.perf_counter(); import {module}; "
            "print(time.perf_counter()-t)")
    samples = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        samples.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(samples)


def quiet_logs() -> None:
    """Powertools loggers are named after their service and ignore the root level."""
    import os

    os.environ["POWERTOOLS_LOG_LEVEL"] = "CRITICAL"
    warnings.filterwarnings("ignore")
    logging.getLogger().setLevel(logging.CRITICAL)
    for name in (*(h.replace("_", "-") for h in HANDLERS), "ecs-task-handler",
                 "node-api", "node-authorizer", "heartbeat-sweep", "jobs-api", "queue-scheduler"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def run(print_report: bool = True) -> dict[str, Any]:
    quiet_logs()
    results: dict[str, Any] = {"calls_per_event": {}, "scans": 0}
    report: list[str] = []
    for ranks in (1, 8):
        meter = run_scenario(ranks)
        table: dict[str, Any] = {}
        for handler in HANDLERS:
            events = meter.events[handler]
            if not events:
                continue
            per_op = {op: round(n / events, 2) for op, n in sorted(meter.calls[handler].items())}
            table[handler] = {"events": events, "calls_per_event": per_op,
                              "median_ms": round(1000 * statistics.median(meter.seconds[handler]), 2)}
            results["scans"] += sum(n for op, n in meter.calls[handler].items() if op.endswith(":Scan"))
        results["calls_per_event"][f"{ranks}_rank"] = table
        report.append(f"\nAWS API calls per event, {ranks}-rank job (fault -> health check -> reboot "
                      "-> gang restart -> complete)")
        for handler, row in table.items():
            ops = ", ".join(f"{op} {n}" for op, n in row["calls_per_event"].items())
            report.append(f"  {handler:<22} {row['events']:>3} events  median {row['median_ms']:>7} ms"
                          f"  per event: {ops}")

    reads = {}
    for jobs in (100, 100_000):
        # 15 simulated minutes: fault, health check, reboot and gang restart. (moto
        # answers a GSI Query by scanning its whole table, so the emulator's time grows
        # with the table; the items DynamoDB would read do not.)
        meter = run_scenario(2, history_jobs=jobs, minutes=15)
        events = sum(meter.events.values())
        reads[jobs] = sum(meter.items_read.values()) / max(1, events)
    ratio = reads[100_000] / reads[100] if reads[100] else float("nan")
    results["items_read_per_event"] = {"100_jobs": round(reads[100], 3),
                                       "100000_jobs": round(reads[100_000], 3),
                                       "ratio": round(ratio, 3)}
    report.append("\nDynamoDB items read per event (2-rank recovery), by finished jobs in the table")
    report.append(f"  100 jobs: {reads[100]:.3f}   100,000 jobs: {reads[100_000]:.3f}   "
                  f"ratio {ratio:.3f} (target 1.0)")

    imports = {h: round(1000 * cold_import_seconds(f"handlers.{h}"), 1) for h in HANDLERS}
    results["cold_import_ms"] = imports
    report.append("\nCold import time per handler module (median of 3 fresh interpreters)")
    for handler, ms in imports.items():
        report.append(f"  {handler:<22} {ms:>7} ms")
    report.append(f"\nScan operations in any event path: {results['scans']}")
    if print_report:
        print("\n".join(report))
    return results


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
