"""Time sharing: suspend latency (emulator) and a simulated day of mixed-priority load (policy).

(a) **Suspend latency**, through the emulator path of ``make demo``'s time-sharing scenario
    (``local_mode/time_sharing_scenario.py``, trimmed: it stops once the victim is
    SUSPENDED): the preemption decision (bob's submit triggers the scheduler) is placed at
    several phases of rank 0's 2 s poll; rank 0 runs the real ``gpu_recovery_client``
    over HTTP. Measured in simulated seconds: decision -> rank 0 informed, -> StopTask,
    -> GPUs free (every rank STOPPED), for a rank 0 that calls ``go_suspend()`` and for
    one that never does (stopped by force once its grace is over, by the recovery sweep
    that runs every minute). The simulated containers exit 10 s after SIGTERM (the
    simulator's ``stop_delay_seconds``, the StopTask -> STOPPED share).

(b) **A simulated day** on 64 nodes of 8 GPUs: a pure discrete-event simulation in which
    every scheduling decision is made by the scheduler's own policy code: ``TickPlanner``
    (``queue/planner.py``: quota, gang admission, victims via ``choose_victims``),
    ``QuotaBook`` and ``demotion_due``, one tick per simulated minute with the scan limits
    of ``SchedulerConfig``. No DynamoDB: the emulator tests cover the persistence (quota
    charges in the launch transaction, releases, crash consistency). Workload (seeded):
    several users with per-level node quotas, Poisson arrivals per priority, 1..16 nodes,
    minutes to hours of work; a preempted job is told within a poll and either saves a
    checkpoint and calls ``go_suspend()`` (most) or is stopped by force at the end of its
    grace (its work since its last periodic checkpoint is lost); it goes back to the queue
    at its original position and resumes its remaining work. At every tick the simulation
    asserts that no user holds more nodes at a level than their quota, and that no node
    holds more GPUs than it has.

    PYTHONPATH=lambdas:. .venv/bin/python -m bench.time_sharing_bench [latency|day]

Modules: ``bench/time_sharing_latency.py`` (a), ``bench/time_sharing_day.py`` (b).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from bench import time_sharing_day, time_sharing_latency


def run(parts: Sequence[str] = ("latency", "day")) -> dict[str, Any]:
    results: dict[str, Any] = {}
    if "latency" in parts:
        results["suspend_latency"] = time_sharing_latency.suspend_latency()
        time_sharing_latency.print_latency(results["suspend_latency"])
    if "day" in parts:
        config = time_sharing_day.DayConfig()
        results["day"] = time_sharing_day.day_summary(time_sharing_day.simulate_day(config))
        time_sharing_day.print_day(results["day"], config)
    return results


if __name__ == "__main__":
    from bench.recovery_bench import quiet_logs

    quiet_logs()
    run(tuple(sys.argv[1:]) or ("latency", "day"))
