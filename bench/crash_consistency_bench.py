"""Crash-consistency figures: one GPU-fault recovery broken at its AWS calls, in turn.

Prints how many AWS calls the flow makes, how many were broken (each once, as a
throttle that does not execute and as a lost response), how many runs there were and
how many recovered exactly right (see ``local_mode.campaigns.recovery.check``). By default
the first call of every distinct call site is broken; ``GPU_RECOVERY_FAULTS=all``
breaks every call. Runs use one process per core.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from local_mode.campaigns import recovery as campaign
from local_mode.campaigns.base import sample_positions
from local_mode.faults import FAULT_MODES


def _run(case: tuple[int, str]) -> tuple[tuple[int, str], str, list[str]]:
    from bench.recovery_bench import quiet_logs

    quiet_logs()
    result = campaign.run_recovery(case)
    fired = f"{result.fired.service}:{result.fired.operation}" if result.fired else "never fired"
    # A run whose fault never fired proves nothing: it does not count as recovered.
    return case, fired, campaign.check(result) + ([] if result.fired else ["the fault never fired"])


def run(print_report: bool = True) -> dict[str, Any]:
    started = time.perf_counter()
    baseline = campaign.run_recovery()
    every = os.environ.get("GPU_RECOVERY_FAULTS") == "all"
    positions = [c.index for c in baseline.calls] if every else sample_positions(baseline.calls)
    cases = [(index, mode) for index in positions for mode in FAULT_MODES]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        outcomes = list(pool.map(_run, cases))
    failures = [(case, fired, wrong) for case, fired, wrong in outcomes if wrong]
    results = {
        "flow_calls": len(baseline.calls),
        "calls_broken": len(positions),
        "positions": "every call" if every else "first call of each call site",
        "runs": len(cases),
        "runs_recovered": len(cases) - len(failures),
        "failures": [{"call": c[0], "mode": c[1], "operation": f, "problems": w} for c, f, w in failures],
        "seconds": round(time.perf_counter() - started, 1),
    }
    if print_report:
        print(f"\nFault injection: one 2-node GPU-fault recovery makes {len(baseline.calls)} AWS calls")
        print(f"  AWS calls injected: {len(positions)} ({results['positions']}) x {len(FAULT_MODES)} "
              f"models (throttle, lost response) / runs: {len(cases)} / runs recovered: "
              f"{results['runs_recovered']}")
        for failure in results["failures"]:
            print(f"  WRONG: {failure}")
    return results


if __name__ == "__main__":
    run()
