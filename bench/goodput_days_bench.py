"""Goodput over days, from the stack's own ledger (issue 52): one long training job run by the
real handlers on the simulated cluster, GPU faults arriving at a realistic rate, and the
ledger's ETTR and badput by cause printed, the stack's own share called out.

The scenario: ``nodes`` 8-GPU nodes run one tag-registered, relocatable job (``nodes`` ranks)
for ``days`` of simulated time, with ``spares`` spare nodes (``SPARE_NODES``) beside it. The
training client's ``checkpoint_saved`` is reported every ``checkpoint_minutes`` of each
attempt's training (as rank 0 would, after each save). Faults arrive as a Poisson process at
Meta's rate (HPCA'25: about one job interruption per 8 hours at 1,024 GPUs, so per GPU-hour
1 / (8 x 1,024)), scaled by ``rate_scale`` when a smaller job should see as many faults as a
1,024-GPU one (the default: the job's share of a 1,024-GPU job's faults, scale 1024 / GPUs).
The mix is the soak's: a GPU a reboot fixes (60 %), a dead GPU DCGM says to replace (25 %),
XID 79 reported by the node agent (15 %, the fast path), each with the NCCL cascade.

What it reads is what an operator reads: the job item's ledger (``domain.goodput.ledger_of``),
as ``gpujobs show`` prints it. ``make bench BENCH=goodput_days``; figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
import warnings
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.domain import goodput
from gpu_recovery.repository import Repository
from local_mode.world import build_world

MIN = 60
HOUR = 3600
DAY = 24 * HOUR
META_FAULTS_PER_GPU_HOUR = 1 / (8 * 1024)
MIX = (("reboot", 0.60), ("dead_gpu", 0.25), ("xid79", 0.15))
JOB_ID = "long-pretrain"


def _fault_kind(rng: random.Random) -> str:
    roll, total = rng.random(), 0.0
    for kind, share in MIX:
        total += share
        if roll < total:
            return kind
    return MIX[-1][0]


#: the configurations ``make bench`` runs: with the spare pool and without it
CONFIGS = ({"spares": 2}, {"spares": 0})


def run(*, days: float = 3.0, seeds: tuple[int, ...] = (1,)) -> list[dict[str, Any]]:
    """Each of :data:`CONFIGS` for ``days`` per seed; a table printed, the figures returned."""
    results = [run_one(days=days, seed=seed, **config) for config in CONFIGS for seed in seeds]
    causes = [c for c in goodput.CAUSES if c != goodput.PRODUCTIVE
              and any(c in r["gpu_hours_lost_by_cause"] for r in results)]
    print(f"{'spares':>6} {'seed':>4} {'faults':>6} {'ETTR':>7} {'stack share':>11}  GPU-hours lost: "
          + ", ".join(causes))
    for r in results:
        lost = ", ".join(f"{r['gpu_hours_lost_by_cause'].get(c, 0.0):g}" for c in causes)
        print(f"{r['spares']:>6} {r['seed']:>4} {r['faults_in_ledger']:>6} {r['ettr']:>7.2%} "
              f"{r['stack_share_of_wall']:>11.2%}  {lost}   ({r['wall_seconds_to_run']:.0f} s)")
    return results


def run_one(*, nodes: int = 16, spares: int = 2, days: float = 3.0, checkpoint_minutes: float = 30.0,
            rate_scale: float | None = None, seed: int = 1) -> dict[str, Any]:
    """The job's ledger after ``days`` (see the module docstring)."""
    warnings.filterwarnings("ignore", category=UserWarning)
    logging.getLogger().setLevel(logging.CRITICAL)
    rng = random.Random(seed)
    gpus = nodes * 8
    scale = rate_scale if rate_scale is not None else 1024 / gpus
    per_second = META_FAULTS_PER_GPU_HOUR * gpus * scale / HOUR
    env = {C.ENV_SPARE_NODES: str(spares), C.ENV_RELOCATION_WAIT_SECONDS: "1800",
           "POWERTOOLS_LOG_LEVEL": "CRITICAL"}
    started = time.monotonic()
    with build_world(duplicate_delivery=True, max_recovery_attempts=20, extra_env=env,
                     dynamodb="memory") as world:
        sim = world.ecs
        names = [f"node-{i:02d}" for i in range(nodes + spares)]
        for name in names:
            sim.add_node(name, gpus=8)
        repo = Repository(world.aws.resource("dynamodb"), world.aws.job_table, world.aws.instance_table)
        family = "train-long"
        task_definition = sim.register_training_task_definition(family, gpus=8)
        sim.plan_family(family, run_seconds=None)  # trains until the campaign ends
        sim.start_job(JOB_ID, task_definition, names[:nodes],
                      extra_tags={C.TAG_RELOCATABLE: "true", C.TAG_MAX_INFRA_RECOVERIES: "20"})
        end = sim.now() + days * DAY
        next_fault = sim.now() + rng.expovariate(per_second)
        injected: dict[str, int] = {}
        last_checkpoint: dict[int, float] = {}
        while sim.now() < end:
            _report_checkpoints(repo, sim, last_checkpoint, checkpoint_minutes * MIN)
            if sim.now() >= next_fault:
                running = sorted({t.node for t in sim.running_tasks()
                                  if not t.health_check and t.tags.get(C.TAG_JOB_ID) == JOB_ID})
                if running:
                    kind = _fault_kind(rng)
                    _inject(sim, rng.choice(running), kind)
                    injected[kind] = injected.get(kind, 0) + 1
                next_fault = sim.now() + rng.expovariate(per_second)
            sim.run_for(MIN)
        item = repo.jobs.get_job_item(JOB_ID) or {}
        ledger = goodput.ledger_of(item, sim.now())
    view = ledger.to_view()
    hours = {cause: round(seconds / HOUR, 2) for cause, seconds in view["seconds"].items() if seconds}
    gpu_hours_lost = {cause: round(seconds / HOUR * gpus, 1) for cause, seconds in view["seconds"].items()
                      if seconds and cause != goodput.PRODUCTIVE}
    return {"nodes": nodes, "gpus": gpus, "spares": spares, "days": days, "seed": seed,
            "faults_per_day_expected": round(per_second * DAY, 2), "faults_injected": injected,
            "faults_in_ledger": view["faults"], "ettr": view["ettr"], "hours_by_cause": hours,
            "gpu_hours_lost_by_cause": gpu_hours_lost,
            "stack_share_hours": round(view["stack_share_seconds"] / HOUR, 2),
            "stack_share_of_wall": round(view["stack_share_seconds"] / max(view["wall_seconds"], 1), 4),
            "job_state": str(item.get("job_state")), "attempt": int(item.get("attempt") or 0),
            "wall_seconds_to_run": round(time.monotonic() - started, 1)}


def _inject(sim: Any, node: str, kind: str) -> None:
    if kind == "reboot":
        sim.inject_gpu_fault(node, after=1, health="reboot_fixable", nccl_cascade=True)
    elif kind == "dead_gpu":
        sim.inject_gpu_fault(node, after=1, health="replace", nccl_cascade=True)
    else:
        sim.inject_xid(node, 79, after=1, health="reboot_fixable", nccl_cascade=True, crash_delay_seconds=10)


def _report_checkpoints(repo: Repository, sim: Any, last: dict[int, float], every: float) -> None:
    """Rank 0's ``checkpoint_saved`` after each save: every ``every`` seconds of the running
    attempt's training, as the control API records it (the step is the attempt's seconds)."""
    tasks = [t for t in sim.running_tasks() if not t.health_check and t.tags.get(C.TAG_JOB_ID) == JOB_ID]
    attempts = {int(t.tags.get(C.TAG_ATTEMPT) or 1) for t in tasks}
    if len(attempts) != 1:
        return
    attempt = attempts.pop()
    started = [t.started_at for t in tasks if t.last_status == "RUNNING" and t.started_at is not None]
    if not started or len(started) != len(tasks):
        return
    since = last.get(attempt, max(started))
    if sim.now() - since >= every:
        repo.jobs.record_checkpoint(JOB_ID, attempt, int(sim.now() - max(started)), sim.now())
        last[attempt] = sim.now()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--spares", type=int, default=2)
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate-scale", type=float, default=None)
    args = parser.parse_args(argv)
    print(json.dumps(run_one(nodes=args.nodes, spares=args.spares, days=args.days, seed=args.seed,
                             rate_scale=args.rate_scale), indent=1))


if __name__ == "__main__":
    main()
