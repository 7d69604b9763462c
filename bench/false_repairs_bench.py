"""False repairs (issue 49): repairs and holds of nodes whose simulated hardware was healthy.

Every crash-campaign flow (``local_mode.campaigns.catalog.RUNS``) is run unbroken and with
1 % of its AWS calls failing at random (a throttle or a lost response) for two seeds. The
simulation knows each node's true state (``local_mode.sim.repair_ledger``): a reboot, GPU
reset, replacement, quarantine, or a cordon longer than a check, of a node whose hardware was
healthy at the time is a false repair. Printed per flow: the repairs done, the false ones, and
whether the flow's own expectations held.
"""

from __future__ import annotations

import contextlib
import io
import time
from typing import Any

from local_mode.campaigns.catalog import RUNS
from local_mode.campaigns.runner import calls_failing

RATE = 0.01
SEEDS = (1, 2)


def _one(flow: str, seed: int | None) -> dict[str, Any]:
    with contextlib.redirect_stdout(io.StringIO()):
        if seed is None:
            result = RUNS[flow](None)
        else:
            with calls_failing(RATE, seed):
                result = RUNS[flow](None)
    problems = result.problems()
    return {"repairs": len(result.repairs), "false_repairs": list(result.false_repairs),
            "broken_calls": len(result.broken), "calls": len(result.calls),
            "ended_right": not problems, "problems": [p[:300] for p in problems]}


def run(print_report: bool = True, flows: list[str] | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    results: dict[str, Any] = {}
    if print_report:
        print(f"\nFalse repairs per flow: unbroken, and with {RATE:.0%} of AWS calls failing "
              f"(seeds {', '.join(map(str, SEEDS))})")
        print(f"  {'flow':<18} {'repairs':>7} {'false':>5} {'false @1%':>10} {'calls broken @1%':>17}"
              "  ended right")
    for flow in flows or sorted(RUNS):
        unbroken = _one(flow, None)
        failing = {seed: _one(flow, seed) for seed in SEEDS}
        results[flow] = {"unbroken": unbroken, "calls_failing": {str(s): r for s, r in failing.items()}}
        if print_report:
            false_failing = sum(len(r["false_repairs"]) for r in failing.values())
            broken = "/".join(str(r["broken_calls"]) for r in failing.values())
            right = "yes" if unbroken["ended_right"] and all(r["ended_right"] for r in failing.values()) \
                else "NO"
            print(f"  {flow:<18} {unbroken['repairs']:>7} {len(unbroken['false_repairs']):>5} "
                  f"{false_failing:>10} {broken:>17}  {right}")
            for label, r in [("unbroken", unbroken), *((f"seed {s}", r) for s, r in failing.items())]:
                for false in r["false_repairs"]:
                    print(f"    FALSE REPAIR ({label}): {false}")
                for problem in r["problems"] if not r["false_repairs"] else ():
                    print(f"    WRONG ({label}): {problem}")
    results["false_repairs_total"] = sum(
        len(v["unbroken"]["false_repairs"])
        + sum(len(r["false_repairs"]) for r in v["calls_failing"].values())
        for v in results.values() if isinstance(v, dict))
    results["seconds"] = round(time.perf_counter() - started, 1)
    if print_report:
        print(f"  false repairs in all runs: {results['false_repairs_total']}")
    return results


if __name__ == "__main__":
    run()
