"""Remediation MTTR: fault -> every rank of the job running again, per remediation path,
in simulated time (moto + the simulated ECS data plane, the deployed handlers).

For each path the time is split into

* the **floor**: what the hardware and DCGM take whatever the stack does (the DCGM
  level-2 diag, 120 s here; the node's reboot, 180 s here);
* **ECS task start/stop**: the data plane's own delays (a task placed -> RUNNING in 5 s,
  StopTask -> STOPPED in 10 s), measured as the MTTR of the same path with the sweep
  running every second minus the floor;
* the **stack's own share**: what the stack adds on top — waiting for the next minute's
  sweep where an event alone does not move the recovery on — measured as the MTTR with the
  deployed one-minute sweep minus the MTTR with a one-second sweep;
* **Lambda handling**: the handlers' own wall time during the recovery, measured here on
  the emulator (in simulated time it is instantaneous; on AWS, add each invocation's
  duration and EventBridge's delivery latency, typically well under a second per event).

Paths: DCGM diag + reboot (exit 1, no definitive evidence), DCGM diag + GPU reset (a row
remap pending: the check exits 4, the reset task resets the node's GPUs, 30 s here, instead
of a reboot), fast-path reboot (XID 79: no diag), relocation to a spare node after the diag
(DCGM says replace), and relocation on a definitive XID (64, row-remap failure: no diag).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gpu_recovery import constants as C

MIN = 60
DCGM_SECONDS = 120
REBOOT_SECONDS = 180
RESET_SECONDS = 30  # the reset task: nvidia-smi -r and dcgmi diag -r 1


@dataclass(frozen=True)
class Path:
    name: str
    title: str
    floor: float  # diag + reboot seconds the path cannot avoid
    spare: bool  # a third node the job may move to


PATHS = (
    Path("diag_reboot", "DCGM diag + reboot", DCGM_SECONDS + REBOOT_SECONDS, False),
    Path("diag_reset", "DCGM diag + GPU reset (remap pending)", DCGM_SECONDS + RESET_SECONDS, False),
    Path("fast_path_reboot", "fast-path reboot (XID 79)", REBOOT_SECONDS, False),
    Path("relocation_after_diag", "relocation to a spare (DCGM replace)", DCGM_SECONDS, True),
    Path("relocation_fast_path", "relocation to a spare (XID 64)", 0, True),
)


def _measure(path: Path, sweep_every: float) -> tuple[float, float]:
    """(simulated seconds from the fault to every rank running again, handler wall seconds)."""
    from local_mode.remediation_scenarios import world

    with world(duplicate_delivery=False, dcgm_seconds=DCGM_SECONDS, reboot_seconds=REBOOT_SECONDS,
               reset_seconds=RESET_SECONDS) as w:
        wall = [0.0]
        for rule in w.bus.rules:
            rule.target = _timed(rule.target, wall)
        for schedule in w.bus.schedules:
            schedule.target = _timed(schedule.target, wall)
        if sweep_every != 60:
            (sweep,) = [s for s in w.bus.schedules if s.name == "recovery-sweep"]
            sweep.every_seconds = sweep_every
            sweep.next_due = w.ecs.now() + sweep_every
        nodes = ["node-a", "node-b", "node-c"] if path.spare else ["node-a", "node-b"]
        for node in nodes:
            w.ecs.add_node(node)
        tags = {C.TAG_RELOCATABLE: "true"} if path.spare else None
        w.ecs.start_job("mttr", w.training_task_definition, ["node-a", "node-b"], extra_tags=tags)
        w.ecs.run_for(MIN)
        fault_at = w.ecs.now() + MIN
        if path.name == "diag_reboot":
            w.ecs.inject_gpu_fault("node-b", at=fault_at, health="reboot_fixable", nccl_cascade=True)
        elif path.name == "diag_reset":
            w.ecs.inject_gpu_fault("node-b", at=fault_at, health="reset_fixable", nccl_cascade=True)
        elif path.name == "fast_path_reboot":
            w.ecs.inject_xid("node-b", 79, at=fault_at, nccl_cascade=True, crash_delay_seconds=0,
                             report_delay_seconds=0)
        elif path.name == "relocation_after_diag":
            w.ecs.inject_gpu_fault("node-b", at=fault_at, health="replace", nccl_cascade=True)
        else:
            w.ecs.inject_xid("node-b", 64, at=fault_at, health="replace", nccl_cascade=True,
                             crash_delay_seconds=0, report_delay_seconds=0)
        w.ecs.run_until(fault_at)
        wall[0] = 0.0

        def back() -> bool:
            ranks = [t for t in w.ecs.tasks.values() if not t.health_check
                     and t.tags.get(C.TAG_ATTEMPT) == "2" and t.last_status == "RUNNING"]
            return len(ranks) == 2

        if not w.ecs.run_until_true(back, max_seconds=30 * MIN):
            raise RuntimeError(f"{path.name}: the job did not run again within 30 minutes")
        started = max(t.started_at or 0.0 for t in w.ecs.tasks.values()
                      if t.tags.get(C.TAG_ATTEMPT) == "2" and not t.health_check)
        return started - fault_at, wall[0]


def _timed(target: Any, wall: list[float]) -> Any:
    def measured(event: dict[str, Any], context: Any) -> Any:
        started = time.perf_counter()
        try:
            return target(event, context)
        finally:
            wall[0] += time.perf_counter() - started

    return measured


def run(print_report: bool = True) -> dict[str, Any]:
    from bench.recovery_bench import quiet_logs

    quiet_logs()
    results: dict[str, Any] = {}
    for path in PATHS:
        deployed, handlers = _measure(path, 60)
        ideal, _ = _measure(path, 1)
        results[path.name] = {
            "mttr_seconds": round(deployed, 1),
            "floor_seconds": path.floor,
            "ecs_task_start_stop_seconds": round(ideal - path.floor, 1),
            "stack_share_seconds": round(deployed - ideal, 1),
            "lambda_handling_wall_seconds_emulator": round(handlers, 2),
        }
    if print_report:
        print("\nSimulated MTTR (fault -> every rank running again), 2-node job, one event delivery each")
        print(f"  floor: DCGM level-2 diag {DCGM_SECONDS} s, reboot {REBOOT_SECONDS} s, GPU reset task "
              f"{RESET_SECONDS} s (simulated); the "
              "stack's share is the sweep waits (deployed 1-minute sweep vs an ideal 1-second one)")
        print(f"  {'path':<38} {'MTTR':>7} {'floor':>7} {'ECS start/stop':>15} {'stack':>7} "
              f"{'Lambda wall*':>13}")
        for path in PATHS:
            r = results[path.name]
            print(f"  {path.title:<38} {r['mttr_seconds']:>6.0f}s {r['floor_seconds']:>6.0f}s "
                  f"{r['ecs_task_start_stop_seconds']:>14.0f}s {r['stack_share_seconds']:>6.0f}s "
                  f"{r['lambda_handling_wall_seconds_emulator']:>12.2f}s")
        print("  * handler wall time during the recovery on the emulator (moto), not AWS latency")
    return results


if __name__ == "__main__":
    run()
