"""Cold starts (issue 50): how long importing each Lambda handler module takes.

Each run is a fresh interpreter that imports ``handlers.<name>`` and times that import
alone (what a new Lambda container pays before its first event, on top of the runtime's
own start). The bytecode is warm: one untimed import first compiles every module into a
cache of the bench's own (``PYTHONPYCACHEPREFIX`` under the temporary directory: nothing
is written into the tree or the virtualenv, whatever ``PYTHONDONTWRITEBYTECODE`` says).
Runs go round-robin over the handlers so that the load of a shared machine spreads over
all of them; the figure is the median of ``IMPORT_BENCH_RUNS`` runs (5). Each run gives
two figures: the CPU time of the import (``time.process_time``: what the import costs,
whatever else the machine runs) and its wall time (what a container waits: the CPU time
plus any wait for a core that other processes hold). The goals, under 0.5 s for the two
API authorizers and under 1.2 s for the others on the 2-core machine, are held against
the CPU time: on a machine of its own the two agree. Outside Lambda Powertools' Tracer
disables itself but still imports the X-Ray SDK; in Lambda it also patches the libraries
it traces (the ones installed).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HANDLERS_DIR = ROOT / "lambdas" / "handlers"
AUTHORIZERS = ("node_authorizer", "job_control_authorizer")
GOAL_AUTHORIZER_SECONDS = 0.5
GOAL_OTHER_SECONDS = 1.2

_PROBE = ("import sys, time\n"
          "cpu, wall = time.process_time(), time.perf_counter()\n"
          "import handlers.{name}\n"
          "cpu, wall = time.process_time() - cpu, time.perf_counter() - wall\n"
          "print(cpu, wall, sum(1 for m in sys.modules if m.startswith('gpu_recovery')))\n")


def handler_names() -> list[str]:
    return sorted(p.stem for p in HANDLERS_DIR.glob("*.py") if not p.name.startswith("_"))


def goal_of(name: str) -> float:
    return GOAL_AUTHORIZER_SECONDS if name in AUTHORIZERS else GOAL_OTHER_SECONDS


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LAMBDA_TASK_ROOT", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONPATH"] = os.pathsep.join((str(ROOT / "lambdas"), str(ROOT)))
    env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "gpu-recovery-bench-pycache")
    return env


def import_once(name: str, env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds importing ``handlers.<name>``, gpu_recovery modules loaded),
    in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", _PROBE.format(name=name)], env=env or _environment(),
                          cwd=ROOT, capture_output=True, text=True, check=True)
    cpu, wall, modules = done.stdout.split()
    return float(cpu), float(wall), int(modules)


def measure(runs: int) -> dict[str, dict[str, Any]]:
    env = _environment()
    names = handler_names()
    for name in names:  # warm bytecode
        import_once(name, env)
    cpu: dict[str, list[float]] = {name: [] for name in names}
    wall: dict[str, list[float]] = {name: [] for name in names}
    modules: dict[str, int] = {}
    for _ in range(runs):
        for name in names:
            seconds, waited, modules[name] = import_once(name, env)
            cpu[name].append(seconds)
            wall[name].append(waited)
    return {name: {"cpu_median_s": round(statistics.median(cpu[name]), 3),
                   "cpu_max_s": round(max(cpu[name]), 3),
                   "wall_median_s": round(statistics.median(wall[name]), 3),
                   "wall_min_s": round(min(wall[name]), 3), "goal_s": goal_of(name),
                   "gpu_recovery_modules": modules[name]} for name in names}


def run() -> dict[str, Any]:
    runs = int(os.environ.get("IMPORT_BENCH_RUNS") or 5)
    results = measure(runs)
    print(f"import time of each handler module: fresh interpreter, warm bytecode, median of {runs} runs")
    print(f"{'handler':<24} {'CPU':>7} {'max':>7} {'goal':>6}  {'':4} {'wall':>7} {'min':>7}  "
          "gpu_recovery modules")
    for name, row in results.items():
        verdict = "ok" if row["cpu_median_s"] < row["goal_s"] else "OVER"
        print(f"{name:<24} {row['cpu_median_s']:>6.3f}s {row['cpu_max_s']:>6.3f}s {row['goal_s']:>5.1f}s  "
              f"{verdict:<4} {row['wall_median_s']:>6.3f}s {row['wall_min_s']:>6.3f}s  "
              f"{row['gpu_recovery_modules']}")
    print(f"load average: {_load_average()}")
    return {"runs": runs, "load_average": _load_average(), "handlers": results}


def _load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


if __name__ == "__main__":
    run()
