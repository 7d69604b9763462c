"""Cold starts (issue 50): how long importing each Lambda handler module takes.

Each run is a fresh interpreter that imports ``handlers.<name>`` and times that import
alone (what a new Lambda container pays before its first event, on top of the runtime's
own start); the bytecode is warm (one untimed import first, as the deployed package ships
compiled files). Runs go round-robin over the handlers so that the load of a shared
machine spreads over all of them; the figure is the median of ``IMPORT_BENCH_RUNS`` runs
(5). Goals: under 0.5 s for the two API authorizers, under 1.2 s for the others, on the
2-core machine. Outside Lambda Powertools' Tracer disables itself but still imports the
X-Ray SDK; in Lambda it also patches the libraries it traces (the ones installed).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HANDLERS_DIR = ROOT / "lambdas" / "handlers"
AUTHORIZERS = ("node_authorizer", "job_control_authorizer")
GOAL_AUTHORIZER_SECONDS = 0.5
GOAL_OTHER_SECONDS = 1.2

_PROBE = ("import sys, time\n"
          "started = time.perf_counter()\n"
          "import handlers.{name}\n"
          "elapsed = time.perf_counter() - started\n"
          "print(elapsed, sum(1 for m in sys.modules if m.startswith('gpu_recovery')))\n")


def handler_names() -> list[str]:
    return sorted(p.stem for p in HANDLERS_DIR.glob("*.py") if not p.name.startswith("_"))


def goal_of(name: str) -> float:
    return GOAL_AUTHORIZER_SECONDS if name in AUTHORIZERS else GOAL_OTHER_SECONDS


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LAMBDA_TASK_ROOT", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONPATH"] = os.pathsep.join((str(ROOT / "lambdas"), str(ROOT)))
    return env


def import_once(name: str, env: dict[str, str] | None = None) -> tuple[float, int]:
    """(seconds importing ``handlers.<name>``, gpu_recovery modules loaded), in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", _PROBE.format(name=name)], env=env or _environment(),
                          cwd=ROOT, capture_output=True, text=True, check=True)
    seconds, modules = done.stdout.split()
    return float(seconds), int(modules)


def measure(runs: int) -> dict[str, dict[str, Any]]:
    env = _environment()
    names = handler_names()
    for name in names:  # warm bytecode
        import_once(name, env)
    times: dict[str, list[float]] = {name: [] for name in names}
    modules: dict[str, int] = {}
    for _ in range(runs):
        for name in names:
            seconds, modules[name] = import_once(name, env)
            times[name].append(seconds)
    return {name: {"median_s": round(statistics.median(times[name]), 3), "min_s": round(min(times[name]), 3),
                   "max_s": round(max(times[name]), 3), "goal_s": goal_of(name),
                   "gpu_recovery_modules": modules[name]} for name in names}


def run() -> dict[str, Any]:
    runs = int(os.environ.get("IMPORT_BENCH_RUNS") or 5)
    results = measure(runs)
    print(f"import time of each handler module: fresh interpreter, warm bytecode, median of {runs} runs")
    print(f"{'handler':<24} {'median':>8} {'min':>7} {'max':>7} {'goal':>6}  {'':4} gpu_recovery modules")
    for name, row in results.items():
        verdict = "ok" if row["median_s"] < row["goal_s"] else "OVER"
        print(f"{name:<24} {row['median_s']:>7.3f}s {row['min_s']:>6.3f}s {row['max_s']:>6.3f}s "
              f"{row['goal_s']:>5.1f}s  {verdict:<4} {row['gpu_recovery_modules']}")
    return {"runs": runs, "handlers": results}


if __name__ == "__main__":
    run()
