"""Relocation in a full cluster (issue 41): fault -> every rank RUNNING again after the job
moves to a spare, per stage, at 8 and 128 ranks, in simulated time (moto + the simulated ECS
data plane, the deployed handlers); then a busy cluster of many jobs (issue 50,
``_busy_cluster``).

Each world: a relocatable job (8 ranks on 8 nodes, one 8-GPU rank each; or 128 ranks on 16
nodes, eight 1-GPU ranks each), ``spare_nodes=2``, and six more nodes that another scheduler
(``local_mode.sim.eager_scheduler``) keeps busy, placing its own work onto any node the
documented constraint allows the moment it frees: the cluster is full but for the spares.
Its tasks run 9 to 27 minutes, so nodes free now and then. Four dead GPUs, 12 minutes apart,
each under a rank of the job (DCGM: replace), so each fault moves the job again and the pool
must refill from busy nodes between faults.

Per fault, seconds after it: **seen** (the stack entered recovery), **old ranks stopped**
(every task of the faulted attempt STOPPED), **placed** (every rank of the next attempt
placed by StartTask), **all RUNNING** (every one of them RUNNING); with the count of the
stack's placements on a node whose GPU was bad, the other scheduler's placements on a node
the stack held (reserved, spare) or had judged bad, and the jobs failed.
"""

from __future__ import annotations

import contextlib
import io
import time
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from gpu_recovery import constants as C

MIN = 60
SPARES = 2
OTHER_NODES = 6
FAULTS = 4
FAULT_EVERY_SECONDS = 12 * MIN
JOB_ID = "big-train"
SCENARIOS = ((8, 1), (128, 8))  # (ranks, ranks per node)


@dataclass
class FaultTimeline:
    node: str
    at: float
    seen: float | None = None
    stopped: float | None = None
    placed: float | None = None
    running: float | None = None
    moved_to: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "seen_s": self.seen, "old_ranks_stopped_s": self.stopped,
                "placed_s": self.placed, "all_running_s": self.running, "moved_to": self.moved_to}


def _scenario(ranks: int, per_node: int) -> dict[str, Any]:
    from local_mode.sim.eager_scheduler import EagerScheduler
    from local_mode.world import build_world

    job_nodes = ranks // per_node
    gpus = 8 // per_node
    durations = iter([(9 + 6 * (i % 4)) * MIN for i in range(10_000)])
    env = {"POWERTOOLS_LOG_LEVEL": "CRITICAL", C.ENV_SPARE_NODES: str(SPARES),
           C.ENV_RELOCATION_WAIT_SECONDS: "1800"}
    with build_world(dynamodb="memory", extra_env=env) as w:
        names = [f"node-{i:02d}" for i in range(job_nodes + SPARES + OTHER_NODES)]
        for name in names:
            w.ecs.add_node(name)
        task_definition = w.ecs.register_training_task_definition("big", gpus=gpus)
        w.ecs.plan_family("big", run_seconds=None)
        placement = [n for n in names[:job_nodes] for _ in range(per_node)]
        w.ecs.start_job(JOB_ID, task_definition, placement,
                        extra_tags={C.TAG_RELOCATABLE: "true", C.TAG_MAX_INFRA_RECOVERIES: str(FAULTS + 1)})
        w.ecs.run_for(2 * MIN)  # registered; the pool marked before the other scheduler fills the rest
        eager = EagerScheduler(w.ecs, run_seconds=lambda: float(next(durations))).attach()
        w.ecs.run_for(MIN)
        wall = time.perf_counter()
        faults: list[FaultTimeline] = []
        for _ in range(FAULTS):
            ranks_now = [t for t in w.ecs.running_tasks() if t.tags.get(C.TAG_JOB_ID) == JOB_ID]
            if len(ranks_now) != ranks:  # not running again (the code before issue 41: failed)
                break
            victim = sorted({t.node for t in ranks_now})[0]
            fault = FaultTimeline(victim, w.ecs.now() + 1)
            w.ecs.inject_gpu_fault(victim, after=1, health="replace", nccl_cascade=True)
            w.ecs.run_for(FAULT_EVERY_SECONDS)
            _stages(w, fault, [t.arn for t in ranks_now])
            faults.append(fault)
        w.ecs.run_for(2 * MIN)
        judged = {n: float((w.node_item(n).get("last_fault") or {}).get("at") or 0) for n in names}
        holds_log = eager.started
        stack_on_faulted = [(p.node, round(p.time - faults[0].at)) for p in w.ecs.placements
                            if p.training and p.started_by not in ("gpujobs", "eager-scheduler")
                            and p.health != "healthy"]
        eager_on_judged = [(n, t) for t, n, _ in holds_log if judged.get(n) and t >= judged[n]]
        failed = [n for n in w.aws.notifications()
                  if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "failed"]
        running = [f.running for f in faults if f.running is not None]
        job_state = w.job(JOB_ID).get("job_state")
        return {
            "ranks": ranks, "nodes": len(names), "job_nodes": job_nodes, "spare_nodes": SPARES,
            "faults": [f.as_dict() for f in faults],
            "all_running_mean_s": round(mean(running), 1) if running else None,
            "all_running_max_s": max(running) if running else None,
            "relocated": len(running), "stack_placements_on_faulted_nodes": stack_on_faulted,
            "other_scheduler_on_judged_nodes": eager_on_judged, "jobs_failed": len(failed),
            "other_scheduler_tasks": len(eager.started), "job_state": job_state,
            "wall_seconds": round(time.perf_counter() - wall, 1),
        }


def _stages(w: Any, fault: FaultTimeline, old: list[str]) -> None:
    """The fault's stages, from the job's history and the data plane's task records."""
    at = fault.at
    history = w.job(JOB_ID).get("history") or []
    seen = [float(h["at"]) for h in history if h.get("to") == "PENDING_HEALTHCHECK" and float(h["at"]) >= at]
    fault.seen = round(min(seen) - at, 1) if seen else None
    stopped = [w.ecs.tasks[a].stopped_at for a in old if w.ecs.tasks[a].stopped_at]
    fault.stopped = round(max(stopped) - at, 1) if len(stopped) == len(old) else None
    new = [t for t in w.ecs.tasks.values() if t.tags.get(C.TAG_JOB_ID) == JOB_ID and not t.health_check
           and t.created_at >= at and t.arn not in old]
    if new and len(new) == len(old):
        fault.placed = round(max(t.created_at for t in new) - at, 1)
        started = [t.started_at for t in new if t.started_at]
        fault.running = round(max(started) - at, 1) if len(started) == len(new) else None
        fault.moved_to = sorted({t.node for t in new} - {w.ecs.tasks[a].node for a in old})


BUSY_NODES = 16
BUSY_HOURS = 12.0
BUSY_JOBS = 110
BUSY_FAULT_SHARE = 0.5
BUSY_SEEDS = (1, 2)
BUSY_RATES = (0.0, 0.01)  # none broken; 1 % of the stack's calls broken past botocore's retries


def _busy_cluster(seed: int, hours: float = BUSY_HOURS, rate: float = 0.0) -> dict[str, Any]:
    """Issue 50's soak: ``BUSY_NODES`` nodes, ``spare_nodes=2``, the user's own scheduler
    (``local_mode.soak``'s: it starts the next queued job the moment enough nodes the
    constraint allows are free, so the cluster stays full) with more jobs queued than the
    hours can run: 1-4 ranks (one per node), 20-80 minutes each, every other one relocatable;
    half of them meet one fault (``soak.FAULTS``: a GPU a reboot fixes, a dead GPU, an
    application error, XID 79 from the node agent; each with the NCCL cascade). Per fault of a
    relocatable job: seconds from the fault to every rank of the next attempt RUNNING, and
    whether it moved; whether each relocatable dead-GPU job completed. ``rate``: the share of
    the stack's AWS calls broken at random (the soak's ``CallFaults.arm_random``)."""
    import random

    from local_mode.soak import _UserScheduler, plan_jobs
    from local_mode.world import build_world

    rng = random.Random(seed)
    planned = plan_jobs(rng, BUSY_JOBS, hours, BUSY_FAULT_SHARE)
    for i, job in enumerate(planned):
        job.relocatable = i % 2 == 0
    env = {"POWERTOOLS_LOG_LEVEL": "CRITICAL", C.ENV_SPARE_NODES: str(SPARES),
           C.ENV_RELOCATION_WAIT_SECONDS: "1800"}
    # the product's default budget (3 infrastructure recoveries; the emulator's default is 1)
    with build_world(dynamodb="memory", extra_env=env, max_recovery_attempts=3) as w:
        for i in range(BUSY_NODES):
            w.ecs.add_node(f"node-{i:02d}")
        w.ecs.run_for(2 * MIN)  # the pool marked before the scheduler fills the rest
        scheduler = _UserScheduler(w.aws, w.ecs, planned, rng)
        if rate:
            w.aws.call_faults.arm_random(rate, seed)
        wall = time.perf_counter()
        end = w.ecs.now() + hours * 3600
        while w.ecs.now() < end:
            scheduler.tick()
            w.ecs.run_for(MIN)
        scheduler.queue.clear()
        w.aws.call_faults.disarm()
        w.ecs.run_for(2 * 3600)  # every job started ends
        moves: list[dict[str, Any]] = []
        in_place: list[dict[str, Any]] = []
        training: dict[str, list[Any]] = {}  # job id -> its training tasks, every attempt
        for task in w.ecs.tasks.values():
            if not task.health_check and task.tags.get(C.TAG_JOB_ID):
                training.setdefault(task.tags[C.TAG_JOB_ID], []).append(task)
        for job in planned:
            if job.started_at is None or job.fault is None or not job.relocatable:
                continue
            at = job.started_at + job.fault_after
            first: list[Any] = []
            later: list[Any] = []
            for task in training.get(job.job_id, []):
                (first if task.created_at < at else later).append(task)
            if not first or at > end:
                continue
            started = sorted(later, key=lambda t: t.created_at)[:job.ranks]
            row = {"job": job.job_id, "fault": job.fault, "ranks": job.ranks,
                   "all_running_s": None, "moved_to": []}
            if len(started) == job.ranks and all(t.started_at for t in started):
                row["all_running_s"] = round(max(float(t.started_at or 0) for t in started) - at, 1)
                row["moved_to"] = sorted({t.node for t in started} - {t.node for t in first})
            (moves if row["moved_to"] else in_place).append(row)
        dead = [j.job_id for j in planned if j.fault == "dead_gpu" and j.relocatable and j.started_at
                and j.started_at + j.fault_after <= end]
        states = {job: w.job(job).get("job_state") for job in dead}
        running_s = [float(m["all_running_s"]) for m in moves if m["all_running_s"] is not None]
        return {
            "seed": seed, "rate": rate, "hours": hours,
            "jobs_started": sum(1 for j in planned if j.started_at),
            "relocations": moves, "relocatable_faults_not_moved": in_place,
            "all_running_mean_s": round(mean(running_s), 1) if running_s else None,
            "all_running_max_s": max(running_s) if running_s else None,
            "relocatable_dead_gpu_jobs": len(dead),
            "completed": sum(1 for s in states.values() if s == "COMPLETE"), "dead_gpu_job_states": states,
            "wall_seconds": round(time.perf_counter() - wall, 1),
            "failed_histories": {job: [(round(float(h["at"])), h.get("to"), h.get("reason", "")[:160])
                                       for h in w.job(job).get("history") or []]
                                 for job, state in states.items() if state != "COMPLETE"},
        }


def run(print_report: bool = True) -> dict[str, Any]:
    from bench.recovery_bench import quiet_logs

    quiet_logs()
    results = {f"{ranks}_ranks": _scenario(ranks, per_node) for ranks, per_node in SCENARIOS}
    with contextlib.redirect_stdout(io.StringIO()):  # the handlers' metrics
        busy = [_busy_cluster(seed, rate=rate) for rate in BUSY_RATES for seed in BUSY_SEEDS]
    results["busy_cluster"] = {"seeds": busy}
    if print_report:
        print(f"\nRelocation in a full cluster: spare_nodes={SPARES}, {OTHER_NODES} more nodes another "
              "scheduler keeps busy (it places on any node the constraint allows the moment it frees);")
        print(f"{FAULTS} dead GPUs (DCGM replace) {FAULT_EVERY_SECONDS // MIN} min apart, each under a rank "
              "of the job; seconds after each fault (simulated)")
        for ranks, per_node in SCENARIOS:
            r = results[f"{ranks}_ranks"]
            print(f"\n  {ranks} ranks ({r['job_nodes']} nodes x {per_node}), {r['nodes']} nodes in all")
            print(f"  {'fault':<6}{'node':<9}{'seen':>7}{'old ranks stopped':>19}{'placed':>9}"
                  f"{'all RUNNING':>13}  moved to")
            for i, f in enumerate(r["faults"], 1):
                cells = [f"{v:>.0f} s" if v is not None else "-" for v in
                         (f["seen_s"], f["old_ranks_stopped_s"], f["placed_s"], f["all_running_s"])]
                print(f"  #{i:<5}{f['node']:<9}{cells[0]:>7}{cells[1]:>19}{cells[2]:>9}{cells[3]:>13}  "
                      f"{', '.join(f['moved_to']) or '-'}")
            print(f"  all RUNNING: mean {r['all_running_mean_s']} s, max {r['all_running_max_s']} s over "
                  f"{r['relocated']} relocations; stack placements on faulted nodes: "
                  f"{len(r['stack_placements_on_faulted_nodes'])}; other scheduler on judged-bad nodes: "
                  f"{len(r['other_scheduler_on_judged_nodes'])}; jobs failed: {r['jobs_failed']} "
                  f"({r['wall_seconds']} s of wall time)")
        _print_busy(busy)
    return results


def _print_busy(busy: list[dict[str, Any]]) -> None:
    print(f"\nA busy cluster (issue 50): {BUSY_NODES} nodes, spare_nodes={SPARES}, the user's scheduler "
          f"keeping it full of 1-4-rank jobs, every other one relocatable, half of them faulted; "
          f"{BUSY_HOURS:.0f} simulated hours")
    for r in busy:
        moves = r["relocations"]
        kinds: dict[str, int] = {}
        for m in moves:
            kinds[m["fault"]] = kinds.get(m["fault"], 0) + 1
        print(f"  seed {r['seed']}, {r['rate']:.0%} of calls broken: {r['jobs_started']} jobs started, "
              f"{len(moves)} relocations "
              f"({', '.join(f'{v} {k}' for k, v in sorted(kinds.items()))}); fault to every rank RUNNING: "
              f"mean {r['all_running_mean_s']} s, max {r['all_running_max_s']} s; relocatable faults not "
              f"moved: {len(r['relocatable_faults_not_moved'])}; relocatable dead-GPU jobs completed: "
              f"{r['completed']} of {r['relocatable_dead_gpu_jobs']} ({r['wall_seconds']} s of wall time)")


if __name__ == "__main__":
    run()
