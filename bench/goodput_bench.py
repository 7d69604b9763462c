"""Goodput with and without hot spares (issue 19): a seeded discrete-event **model** of the
recovery paths' timings, not a run of the handlers.

One job on ``nodes`` nodes (128) trains for ``days`` (30) of wall time; every node of the
cluster (the job's and the spares) fails at ``failures_per_1000_node_days`` (6.5: Meta's
RSC-1, docs in /work/shared/design/scale-facts.md). The job checkpoints every
``checkpoint_seconds`` (600) of training; a fault loses the training since the last
checkpoint and stops the whole gang until every rank has a healthy node again.

Fault mix (parameters; the catalog's three remedies): ``transient`` (60 %: a reboot fixes
it, e.g. XID 79), ``dead_gpu`` (25 %: DCGM says replace, e.g. row-remap failure / XID 64),
``flapping`` (15 %: a reboot fixes it for a while; it faults again after
``flap_mean_hours`` of work on average (idle in the pool it does not flap), and after
``reboots_before_replace`` reboots within ``reboot_window_hours`` the next fault replaces
it, the escalation of the remediation settings' defaults).

Each path's duration, and where it comes from:

* ``diag`` 120 s: the DCGM level-2 diag, ``bench.remediation_bench.DCGM_SECONDS`` (the
  floor the remediation bench and the emulator use). Without a spare the job waits for
  its verdict (then for the reboot or a node); with a spare free it does not (spare
  first: the emulator measures 10 s from the fault to the relocated ranks running,
  tests/remediation/test_spare_relocation.py, against 125 s when the move waited for the
  verdict).
* ``reboot`` 180 s: ``bench.remediation_bench.REBOOT_SECONDS`` (the 3-5 min of
  the remediation anchors; the stack waits up to ``reboot_timeout_seconds``).
* ``replacement`` (default 20 min, a parameter): a new instance launched by its Auto
  Scaling group, booted and registered with ECS. Not a figure of this code.
* ``restart`` (default 180 s, a parameter): the stack's share (the one-minute sweep), ECS
  stop/start (15 s in the emulator) and the training's own restart (rendezvous, checkpoint
  load): the last is not this code's and is assumed.
* ``detect`` (default 30 s): fault -> the recovery loop knows (task exit, XID, heartbeat).

Paths. **No spares** (today's path in a full cluster): the job waits for the diag and the
reboot, or for a replacement node (the relocation wait of domain/relocation.py: a node
that frees is reserved for it). **Spares** (``spare_nodes``, 2 % / 5 % of 128 rounded up:
3 / 7): after the diag the ranks of the bad node move to a free spare (relocation takes free
3 / 7): as soon as the fault is known the ranks of the bad node move to a free spare,
without waiting for the diag or the reboot (spare first, domain/relocation.py
``spare_first``; with a pool a reboot-fixable node is not waited for either); the bad node
is diagnosed, rebooted or replaced in the background and joins the pool when healthy. No
spare free: the path without spares. The last line (``diag_wait=True``) is the spare path
as it was before spare first: the move waited for the verdict.

Storm line: the emulator's storm scenario (tests/queue_scheduler/test_storm.py: 16 nodes
kept full by the queue and one tag-registered job that cannot move, 4 XID 79 faults within
10 minutes, the breaker tripping on the 4th) run with the real handlers, counting jobs that
failed, jobs waiting HELD for the breaker's reset, and tasks placed on a node known to be
bad. It is a run, not part of the model.

    PYTHONPATH=lambdas:. .venv/bin/python -m bench.goodput_bench
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any

from bench.remediation_bench import DCGM_SECONDS, REBOOT_SECONDS
from gpu_recovery.domain.relocation import SparePool
from gpu_recovery.domain.remediation_settings import parse_remediation_settings

DAY = 86_400.0
_ESCALATION = parse_remediation_settings({}).escalation


@dataclass(frozen=True)
class Model:
    nodes: int = 128
    days: float = 30.0
    failures_per_1000_node_days: float = 6.5
    checkpoint_seconds: float = 600.0
    spare_nodes: str = "0"
    mix: tuple[tuple[str, float], ...] = (("transient", 0.60), ("dead_gpu", 0.25), ("flapping", 0.15))
    detect_seconds: float = 30.0
    diag_seconds: float = float(DCGM_SECONDS)
    reboot_seconds: float = float(REBOOT_SECONDS)
    replacement_seconds: float = 20 * 60.0
    restart_seconds: float = 180.0
    flap_mean_hours: float = 24.0
    reboots_before_replace: int = _ESCALATION.reboots_before_replace
    reboot_window_hours: float = _ESCALATION.reboot_window_seconds / 3600
    diag_wait: bool = False  # True: a spare taken only after the verdict (before spare first)
    seed: int = 20261123

    @property
    def spares(self) -> int:
        return SparePool.parse(self.spare_nodes).size(self.nodes)


@dataclass
class _Node:
    flaky: bool = False
    reboots: list[float] = field(default_factory=list)
    healthy: bool = True
    generation: int = 0  # a recurrence scheduled for an older incarnation is void


@dataclass
class Result:
    label: str
    spares: int
    wall_seconds: float
    productive_seconds: float
    interruptions: int
    recover_seconds: list[float]
    lost_seconds: float
    faults: int
    relocations: int

    @property
    def ratio(self) -> float:
        return self.productive_seconds / self.wall_seconds

    @property
    def mttr_seconds(self) -> float:
        return sum(self.recover_seconds) / len(self.recover_seconds) if self.recover_seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"spares": self.spares, "effective_training_time_ratio": round(self.ratio, 4),
                "mttr_seconds": round(self.mttr_seconds, 1), "interruptions": self.interruptions,
                "work_lost_hours": round(self.lost_seconds / 3600, 2), "node_faults": self.faults,
                "relocations": self.relocations}


def simulate(model: Model, label: str = "") -> Result:
    """One seeded run. The fault times and kinds depend on the seed alone (one stream per
    node), so runs with different spare counts see the same faults on the job's nodes."""
    n_job, n_spare = model.nodes, model.spares
    end = model.days * DAY
    rate = model.failures_per_1000_node_days / 1000 / DAY  # per node-second
    kinds, weights = zip(*model.mix, strict=True)
    nodes: dict[int, _Node] = {i: _Node() for i in range(n_job + n_spare)}
    streams = {i: random.Random(model.seed * 1_000_003 + i) for i in nodes}
    job: set[int] = set(range(n_job))
    pool: set[int] = set(range(n_job, n_job + n_spare))
    events: list[tuple[float, int, str, int, int]] = []  # time, seq, kind, node, generation
    seq = 0

    def push(at: float, kind: str, node: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, kind, node, nodes[node].generation))

    for i in nodes:
        push(streams[i].expovariate(rate), "fault", i)

    running_since: float | None = 0.0  # None: stopped
    stopped_at = 0.0
    restart_token = 0  # a restart pushed before a newer fault is void
    restart_pushed = -1
    missing: dict[int, float] = {}  # slot (the node that left) -> earliest time it may be refilled
    waiting_on_self: set[int] = set()  # slots whose own node may still take them back
    productive = lost = 0.0
    interruptions = faults = relocations = 0
    recover: list[float] = []

    def stop(at: float) -> None:
        nonlocal running_since, stopped_at, productive, lost, interruptions
        if running_since is None:
            return
        trained = at - running_since
        kept = math.floor(trained / model.checkpoint_seconds) * model.checkpoint_seconds
        productive += kept
        lost += trained - kept
        running_since, stopped_at = None, at
        interruptions += 1

    def try_fill(now: float) -> None:
        """Refill the missing slots from the pool (relocation), then restart when none is left."""
        nonlocal relocations, restart_pushed, seq
        for slot, earliest in sorted(missing.items(), key=lambda s: (s[1], s[0])):
            if earliest > now or not pool:
                continue
            target = min(pool)
            pool.discard(target)
            job.add(target)
            del missing[slot]
            waiting_on_self.discard(slot)
            relocations += 1
        if not missing and running_since is None and restart_pushed != restart_token:
            restart_pushed = restart_token
            seq += 1
            heapq.heappush(events, (now + model.restart_seconds, seq, "restart", -1, restart_token))

    while events:
        at, _, kind, node, generation = heapq.heappop(events)
        if at >= end:
            break
        if kind == "restart":
            if generation == restart_token and not missing and running_since is None:
                running_since = at
                recover.append(at - stopped_at)
            continue
        if kind == "fill":
            try_fill(at)
            continue
        state = nodes[node]
        if kind == "fault":
            push(at + streams[node].expovariate(rate), "fault", node)
        if kind == "recur" and generation != state.generation:
            continue  # the node it was scheduled for has faulted, or been replaced, since
        if kind == "recur" and node in pool:
            # A flapping node flaps under load: idle, it waits (memoryless: draw again).
            push(at + streams[node].expovariate(1 / (model.flap_mean_hours * 3600)), "recur", node)
            continue
        if kind in ("fault", "recur"):
            if not state.healthy:
                continue
            what = "flapping" if kind == "recur" else streams[node].choices(kinds, weights)[0]
            faults += 1
            state.healthy = False
            state.reboots = [t for t in state.reboots if t > at - model.reboot_window_hours * 3600]
            escalated = state.flaky and len(state.reboots) >= model.reboots_before_replace
            replace_it = what == "dead_gpu" or escalated
            verdict = at + model.detect_seconds + model.diag_seconds
            back = verdict + (model.replacement_seconds if replace_it else model.reboot_seconds)
            if replace_it:
                state.flaky, state.reboots = False, []
            else:
                state.reboots.append(at)
                state.flaky = state.flaky or what == "flapping"
            push(back, "healthy", node)
            if node in pool:
                pool.discard(node)  # an idle spare: found by its checks, costs the job nothing
            elif node in job:
                stop(at)
                restart_token += 1
                job.discard(node)
                missing[node] = verdict if model.diag_wait else at + model.detect_seconds
                waiting_on_self.add(node)
                seq += 1
                heapq.heappush(events, (missing[node], seq, "fill", -1, 0))
        elif kind == "healthy":
            state.healthy = True
            state.generation += 1
            if state.flaky:
                push(at + streams[node].expovariate(1 / (model.flap_mean_hours * 3600)), "recur", node)
            if node in waiting_on_self:  # its own slot: the ranks go back to it
                waiting_on_self.discard(node)
                missing.pop(node, None)
                job.add(node)
            else:
                pool.add(node)  # healed in the background: a spare again
            try_fill(at)
    if running_since is not None:
        productive += end - running_since
    return Result(label, n_spare, end, productive, interruptions, recover, lost, faults, relocations)


def storm() -> dict[str, Any]:
    """The storm scenario of tests/queue_scheduler/test_storm.py, run with the handlers."""
    from contextlib import contextmanager

    from gpu_recovery import constants as C
    from gpu_recovery.constants import InstanceState, JobState
    from tests.queue_scheduler.conftest import make_queue_cluster

    with contextmanager(make_queue_cluster)(nodes=[8] * 16, sweep=True) as qc:
        qc.sim.start_job("pinned", qc.train_td, ["node-7"])  # tag-registered, not relocatable
        jobs = [qc.submit(nnodes=1, gpus=8) for _ in range(24)] + ["pinned"]
        qc.scheduler().tick()
        for k, name in enumerate(["node-1", "node-3", "node-5", "node-7"]):
            qc.sim.inject_xid(name, 79, after=(1 + 2 * k) * 60.0)
        seen = {t.arn for t in qc.live_tasks()}
        bad_placements = 0
        for _ in range(14):
            ids = {name: qc.sim.node(name).container_instance_id for name in qc.sim.nodes}
            instances = qc.repo.instances.get_instances(list(ids.values()))
            bad = {name for name, i in ids.items() if (inst := instances.get(i)) is not None
                   and (inst.state is not InstanceState.AVAILABLE or inst.cordoned)}
            qc.scheduler().tick()
            for task in qc.live_tasks():
                if task.arn not in seen:
                    seen.add(task.arn)
                    bad_placements += task.node in bad and bool(task.tags.get(C.TAG_JOB_ID))
            qc.sim.run_for(60.0)
        failed = sum(qc.state(j) is JobState.FAILED for j in jobs)
        held = sum(qc.state(j) is JobState.HELD for j in jobs)
        breaker = (qc.repo.breaker.read() or {}).get("state", "closed")
    return {"jobs": len(jobs), "jobs_failed": failed, "jobs_held": held,
            "tasks_placed_on_known_bad_nodes": bad_placements, "breaker": breaker}


def scenarios(base: Model) -> list[tuple[str, Model]]:
    return [
        ("no spares (today's path)", replace(base, spare_nodes="0")),
        ("2 % spares", replace(base, spare_nodes="2%")),
        ("5 % spares", replace(base, spare_nodes="5%")),
        ("5 % spares, after the diag (before)", replace(base, spare_nodes="5%", diag_wait=True)),
    ]


def run(print_report: bool = True, base: Model | None = None, with_storm: bool = True,
        seeds: int = 50) -> dict[str, Any]:
    base = base or Model()
    results = {label: simulate(model, label) for label, model in scenarios(base)}
    out: dict[str, Any] = {label: r.as_dict() for label, r in results.items()}
    spread: dict[str, list[float]] = {label: [] for label in results}
    for k in range(seeds):
        for label, model in scenarios(replace(base, seed=base.seed + 1 + k)):
            spread[label].append(simulate(model, label).ratio)
    for label, ratios in spread.items():
        if ratios:
            out[label]["ratio_over_seeds"] = {"seeds": len(ratios), "min": round(min(ratios), 4),
                                              "mean": round(sum(ratios) / len(ratios), 4)}
    if print_report:
        print(f"\nModel (not a run of the handlers): {base.nodes}-node job, {base.days:g} days, "
              f"{base.failures_per_1000_node_days:g} node failures / 1,000 node-days, checkpoint every "
              f"{base.checkpoint_seconds / 60:g} min, seed {base.seed}")
        print(f"  mix {', '.join(f'{k} {w:.0%}' for k, w in base.mix)}; detect {base.detect_seconds:g} s, "
              f"diag {base.diag_seconds:g} s, reboot {base.reboot_seconds:g} s, replacement "
              f"{base.replacement_seconds / 60:g} min, restart {base.restart_seconds:g} s")
        print(f"  {'scenario':<36} {'spares':>6} {'effective':>9} {'MTTR':>8} {'stops':>6} "
              f"{'work lost':>10} {'faults':>7} {'effective, ' + str(seeds) + ' other seeds':>27}")
        for label, r in results.items():
            more = out[label].get("ratio_over_seeds")
            other = f"mean {more['mean']:.2%}, min {more['min']:.2%}" if more else ""
            print(f"  {label:<36} {r.spares:>6} {r.ratio:>9.2%} {r.mttr_seconds / 60:>6.1f}m "
                  f"{r.interruptions:>6} {r.lost_seconds / 3600:>9.1f}h {r.faults:>7} {other:>27}")
    if with_storm:
        out["storm"] = storm()
        if print_report:
            s = out["storm"]
            print(f"\nFault storm (emulator, handlers; tests/queue_scheduler/test_storm.py): 16 nodes, "
                  f"{s['jobs']} one-node jobs, 4 XID 79 faults in 7 min, breaker {s['breaker']}: "
                  f"{s['jobs_failed']} jobs lost, {s['jobs_held']} waiting HELD for its reset (not failed), "
                  f"{s['tasks_placed_on_known_bad_nodes']} tasks placed on a node known to be bad")
    return out


if __name__ == "__main__":
    run()
