"""Time sharing: suspend latency (emulator) and a simulated day of mixed-priority load (policy).

(a) **Suspend latency** (``bench/time_sharing_latency.py``): the preemption decision placed at
    several phases of rank 0's poll, through the emulator path of ``make demo``'s
    time-sharing scenario; decision -> rank 0 informed, -> StopTask, -> GPUs free, for a rank 0
    that calls ``go_suspend()`` and one stopped by force at the end of its grace.
(b) **A simulated day** (``bench/time_sharing_day.py``) on 64 nodes of 8 GPUs, every scheduling
    decision made by the scheduler's own policy code; quotas and GPU capacity asserted at
    every tick.

Each module's docstring says how it measures.

    PYTHONPATH=lambdas:. .venv/bin/python -m bench.time_sharing_bench [latency|day]
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
