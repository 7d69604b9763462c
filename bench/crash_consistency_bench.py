"""Crash-consistency figures: one GPU-fault recovery broken at its AWS calls, in turn.

Prints how many AWS calls the flow makes, how many were broken (each once, as a
throttle that does not execute and as a lost response), how many runs there were and
how many recovered exactly right (see ``local_mode.campaigns.recovery.check``). By default
the first call of every distinct call site is broken; ``GPU_RECOVERY_FAULTS=all``
breaks every call. The campaign runner's (``local_mode.campaigns.runner.campaign``): each
run forked from the unbroken run at the call it breaks.
"""

from __future__ import annotations

import os
import time
from typing import Any

from local_mode.campaigns import recovery
from local_mode.campaigns.runner import campaign
from local_mode.sim.broken_calls import FAULT_MODES


def run(print_report: bool = True) -> dict[str, Any]:
    started = time.perf_counter()
    every = os.environ.get("GPU_RECOVERY_FAULTS") == "all"
    # A run whose fault never fired proves nothing: the runner does not count it as recovered.
    summary = campaign("gpu_fault", recovery.run_recovery, every_call=every)
    failures = [{"call": fault[0], "mode": fault[1],
                 "operation": f"{call.service}:{call.operation}" if call else "no result",
                 "problems": problems} for fault, call, problems in summary.failures]
    results = {
        "flow_calls": summary.calls,
        "calls_broken": summary.positions,
        "positions": "every call" if every else "first call of each call site",
        "runs": summary.runs,
        "runs_recovered": summary.ended_right,
        "false_repairs": summary.false_repairs + summary.false_repairs_broken,
        "failures": failures,
        "seconds": round(time.perf_counter() - started, 1),
    }
    if print_report:
        print(f"\nFault injection: one 2-node GPU-fault recovery makes {summary.calls} AWS calls")
        print(f"  AWS calls injected: {summary.positions} ({results['positions']}) x {len(FAULT_MODES)} "
              f"models (throttle, lost response), and the failure shape of each call whose operation "
              f"documents one / runs: {summary.runs} / runs recovered: "
              f"{results['runs_recovered']}")
        print(f"  false repairs (healthy nodes rebooted, reset, replaced, quarantined or held): "
              f"{results['false_repairs']} in all runs")
        for failure in failures:
            print(f"  WRONG: {failure}")
    return results


if __name__ == "__main__":
    run()
