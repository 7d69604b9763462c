"""`make demo`: watch GPU faults being recovered, on a laptop, in simulated time.

The same Lambda handlers that the stack deploys run against an embedded AWS
emulator (moto) and a simulated ECS data plane. Events are shaped as AWS documents
them, delivered at least once (every event twice) and routed by the deployed
EventBridge patterns. Scenarios:

1. a 2-node job whose rank 1 hits an ECC fault: health check, reboot, gang restart,
   then the job completes;
2. a job whose node is still bad after its recovery budget: FAILED, node quarantined,
   operators notified;
3. a job whose health check says healthy: the failure was an application bug.

The run ends with one JSON line summarising what happened.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_recovery import constants as C

JOB_ITEM = C.JOB_ITEM_SUFFIX


@dataclass
class Scenario:
    job_id: str
    title: str
    nodes: list[str]
    setup: Callable[[Any, list[str]], None]
    expected_state: str


def _scenarios() -> list[Scenario]:
    def ecc_fault_recovered(sim: Any, tasks: list[str]) -> None:
        # Rank 1's GPU reports an uncorrectable ECC error 20 minutes in; the other rank
        # dies of NCCL errors a few seconds later (as real jobs do).
        sim.inject_gpu_fault("node-b", after=20 * 60, health="reboot_fixable", nccl_cascade=True)

    def node_still_bad(sim: Any, tasks: list[str]) -> None:
        # The reboot does not fix this GPU: it faults again after the restart, and the
        # job's single recovery attempt is spent.
        sim.inject_gpu_fault("node-d", after=15 * 60, health="persistent_reboot")
        sim.inject_gpu_fault("node-d", after=45 * 60, health="persistent_reboot")

    def application_bug(sim: Any, tasks: list[str]) -> None:
        # Rank 0 exits 1 on a perfectly healthy node: DCGM says healthy.
        sim.inject_task_exit(tasks[0], exit_code=1, after=10 * 60)

    return [
        Scenario("llama-ft", "2-node job, ECC fault on rank 1 -> recovered",
                 ["node-a", "node-b"], ecc_fault_recovered, "COMPLETE"),
        Scenario("bert-pretrain", "node still bad after the recovery budget -> FAILED",
                 ["node-c", "node-d"], node_still_bad, "FAILED"),
        Scenario("resnet-sweep", "health check healthy -> application error",
                 ["node-e", "node-f"], application_bug, "FAILED"),
    ]


def _job_history(local: Any, job_id: str) -> dict[str, Any]:
    table = local.client("dynamodb")
    item = table.get_item(
        TableName=C.DEFAULT_JOB_TABLE_NAME,
        Key={C.JOB_PK: {"S": C.job_item_key(job_id)}},
        ConsistentRead=True,
    ).get("Item")
    if not item:
        return {}
    from boto3.dynamodb.types import TypeDeserializer

    from gpu_recovery.repository import from_ddb

    deserializer = TypeDeserializer()
    return from_ddb({k: deserializer.deserialize(v) for k, v in item.items()})


def run(*, duplicate_delivery: bool = True, quiet: bool = False) -> dict[str, int]:
    warnings.filterwarnings("ignore")
    from local_mode.ecs_sim import SimulatedEcs
    from local_mode.emulator import LocalAws
    from local_mode.event_bus import LocalEventBus, wire_recovery_handlers

    out = (lambda *_a, **_k: None) if quiet else print
    started = time.perf_counter()
    scenarios = _scenarios()
    with LocalAws(max_recovery_attempts=1, metrics_disabled=True, reboot_timeout_minutes=15) as local:
        _silence_handler_logs()
        bus = LocalEventBus(duplicate_delivery=duplicate_delivery)
        sim = SimulatedEcs(local, bus, train_seconds=None)
        wire_recovery_handlers(bus, local.cluster_arn, sweep_every_seconds=60)
        td = sim.register_training_task_definition("train", gpus=8)
        # Every training rank runs for an hour, then exits 0 (restarted ranks too).
        sim.plan_family("train", run_seconds=60 * 60, exit_code=0)
        for scenario in scenarios:
            for node in scenario.nodes:
                sim.add_node(node, gpus=8, kind="anywhere" if node == "node-d" else "ec2")
            tasks = sim.start_job(scenario.job_id, td, scenario.nodes)
            scenario.setup(sim, tasks)
        sim.run_for(4 * 60 * 60)

        jobs = {s.job_id: _job_history(local, s.job_id) for s in scenarios}
        notifications = local.notifications()
        summary_sim = sim.summary()

        out("GPU training recovery — local mode (moto + simulated ECS, simulated time)")
        out("=" * 78)
        out(f"every event delivered {'twice (at-least-once)' if duplicate_delivery else 'once'}; "
            "handlers routed by the deployed EventBridge patterns\n")
        lines = _merged_timeline(sim, jobs)
        out("\n".join(lines))
        out("\nOutcome per job")
        out("-" * 78)
        for scenario in scenarios:
            job = jobs[scenario.job_id]
            state = job.get("job_state", "?")
            mark = "ok " if state == scenario.expected_state else "!! "
            out(f"{mark}{scenario.job_id:<15} {state:<10} attempt {job.get('attempt', 0)} "
                f"recoveries {job.get('recoveries_used', 0)}  — {scenario.title}")
            if job.get("last_error") and state != "COMPLETE":
                out(f"    last error: {job['last_error']}")
        out("\nNotifications (SNS)")
        out("-" * 78)
        for note in notifications:
            out(f"[{note['attributes'].get(C.NOTIFICATION_KIND_ATTRIBUTE, '?')}] {note['subject']}")
        if bus.dead_letters:
            out(f"\n!! {len(bus.dead_letters)} event(s) would have gone to a DLQ")
        states = [j.get("job_state") for j in jobs.values()]
        summary = {
            "jobs": len(jobs),
            "completed": states.count("COMPLETE"),
            "recovered": sum(
                1 for n in notifications
                if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == C.NotificationKind.RECOVERED.value
            ),
            "failed": states.count("FAILED"),
            "reboots": int(summary_sim.get("reboots", 0)),
            "health_checks": int(summary_sim.get("health_checks_started", 0)),
            "notifications": len(notifications),
        }
        out(f"\n(simulated {4 * 60} minutes in {time.perf_counter() - started:.1f} s wall)")
    return summary


def _merged_timeline(sim: Any, jobs: dict[str, dict[str, Any]]) -> list[str]:
    """Infrastructure events from the simulator, interleaved with job state changes."""
    entries: list[tuple[float, int, str]] = []
    for seq, (at, kind, text) in enumerate(sim.timeline):
        if kind in ("schedule",):
            continue
        entries.append((at, seq, f"{sim.clock.hms(at)}  {text}"))
    for job_id, job in jobs.items():
        for entry in job.get("history", []):
            at = float(entry.get("at", 0))
            line = f"{sim.clock.hms(at)}  {'':<9} job {job_id} -> {entry.get('to')}: {entry.get('reason')}"
            entries.append((at, 10**9, line))
    entries.sort(key=lambda e: (e[0], e[1]))
    return [text for _, _, text in entries]


def _silence_handler_logs() -> None:
    import logging

    logging.getLogger().setLevel(logging.CRITICAL)
    for name in ("ecs-task-handler", "dcgm-task-monitor", "ecs-instance-monitor", "recovery-sweep"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--once", action="store_true", help="deliver every event once (default: twice)")
    parser.add_argument("--quiet", action="store_true", help="print only the JSON summary")
    args = parser.parse_args(argv)
    summary = run(duplicate_delivery=not args.once, quiet=args.quiet)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
