"""Time sharing, (a) suspend latency, through the emulator (``bench.time_sharing_bench``).

**Suspend latency**, through the emulator path of ``make demo``'s time-sharing scenario
(``local_mode/time_sharing_scenario.py``, trimmed: it stops once the victim is
SUSPENDED): the preemption decision (bob's submit triggers the scheduler) is placed at
several phases of rank 0's 2 s poll; rank 0 runs the real ``gpu_recovery_client``
over HTTP. Measured in simulated seconds: decision -> rank 0 informed, -> StopTask,
-> GPUs free (every rank STOPPED), for a rank 0 that calls ``go_suspend()`` and for
one that never does (stopped by force once its grace is over, by the recovery sweep
that runs every minute). The simulated containers exit 10 s after SIGTERM (the
simulator's ``stop_delay_seconds``, the StopTask -> STOPPED share).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from bench.stats import quantiles

PHASES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8)  # of the decision in rank 0's 2 s poll


def suspend_latency(phases: Sequence[float] = PHASES,
                    forced_offsets: Sequence[float] = (0, 12, 24, 36, 48),
                    forced_grace: int = 30) -> dict[str, Any]:
    """The trimmed scenario once per phase (go_suspend) and once per offset in the sweep's
    minute (forced after ``forced_grace``)."""
    from local_mode import time_sharing_scenario as scenario

    graceful, forced = [], []
    for phase in phases:
        result = scenario.run(phase=phase, until="suspended", finetune_at=50, duplicate_delivery=False)
        graceful.append(_latencies(result, phase))
    for offset in forced_offsets:
        result = scenario.run(phase=0.7, until="suspended", finetune_at=50 + offset, respond=False,
                              grace_seconds=forced_grace, duplicate_delivery=False)
        forced.append(_latencies(result, 0.7, offset))
    return {"go_suspend": graceful, "forced": forced, "forced_grace_seconds": forced_grace}


def _latencies(result: Any, phase: float, offset: float = 0.0) -> dict[str, Any]:
    facts = result.facts
    row = {"phase": phase, "offset": offset, "ok": result.ok, "problems": result.problems,
           "informed": result.informed_seconds, "stop_issued": result.stop_issued_seconds,
           "gpus_free": result.gpus_free_seconds, "wall_seconds": round(result.wall_seconds, 1)}
    if facts.get("forced") and result.stop_issued_seconds is not None:
        row["sweep_share"] = round(result.stop_issued_seconds - facts["grace_seconds"], 3)
    return row


def print_latency(report: dict[str, Any]) -> None:
    def line(label: str, values: Iterable[float | None]) -> str:
        q = quantiles([v for v in values if v is not None])
        if not q["n"]:
            return f"  {label:<46} (no value)"
        return f"  {label:<46} min {q['min']:6.1f}  p50 {q['p50']:6.1f}  max {q['max']:6.1f}  (n={q['n']})"

    graceful, forced = report["go_suspend"], report["forced"]
    print("(a) Suspend latency, emulator path (moto + simulated ECS + the local API over HTTP; rank 0 runs")
    print("    the real gpu_recovery_client, poll every 2 s); simulated seconds from the preemption decision")
    phases = ", ".join(f"{r['phase']:.1f}" for r in graceful)
    print(f"  rank 0 calls go_suspend() as soon as told: {len(graceful)} runs, decision at phases "
          f"{phases} s of its poll")
    print(line("decision -> rank 0 informed", (r["informed"] for r in graceful)))
    print(line("decision -> StopTask (go_suspend())", (r["stop_issued"] for r in graceful)))
    print(line("decision -> GPUs free (every rank STOPPED)", (r["gpus_free"] for r in graceful)))
    grace = report["forced_grace_seconds"]
    offsets = ", ".join(f"+{r['offset']:.0f}" for r in forced)
    print(f"  rank 0 never calls go_suspend() (grace {grace} s; forced by the recovery sweep, every minute): "
          f"{len(forced)} runs, decision at {offsets} s in the sweep's minute")
    print(line("decision -> rank 0 informed", (r["informed"] for r in forced)))
    print(line("grace (job's suspend_grace_seconds)", (grace for _ in forced)))
    print(line("grace over -> forced StopTask (sweep's share)", (r.get("sweep_share") for r in forced)))
    print(line("decision -> GPUs free (every rank STOPPED)", (r["gpus_free"] for r in forced)))
    print("  StopTask -> STOPPED: 10 s in every run (the simulated container's exit after SIGTERM)")
    wrong = [r for r in graceful + forced if not r["ok"]]
    print(f"  runs as described: {len(graceful) + len(forced) - len(wrong)}/{len(graceful) + len(forced)}")
    for row in wrong:
        print(f"  WRONG: {row}")


# ================================================================== (b) simulated day
