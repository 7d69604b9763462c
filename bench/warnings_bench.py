"""Driver warnings (issue 44): faults the driver announced before they happened, with and
without the stack acting on the warning; and counters that rise below the catalog's rate.

**Announced faults** (the deployed handlers on the emulator, the simulated ECS data plane, the
real node API and sweeps; one small cluster per case): a 2-node queue job (three 8-GPU nodes)
whose rank 0 checkpoints every ``CHECKPOINT_EVERY`` seconds on its own and, told to suspend,
saves at once and calls ``go_suspend()`` (polling the control channel every ``POLL_SECONDS``,
as ``gpu_recovery_client`` does; a checkpoint takes ``CHECKPOINT_SECONDS`` to save). Its rank-1
node's driver announces a repair (the recovery
action Reset, or a pending row remap) ``WARN_AFTER`` seconds into the job; the GPU fails
``lead`` seconds later *unless it was repaired by then* (what the driver's instruction is
for). Each lead is run twice: the stack acting on the warning, and the crash path (the same
fault, nobody acting on the warning). Per case: did a rank crash, the training work lost (time
since the checkpoint the job restarted from, at the stop), and the time the job did not train
(its last rank stopped -> every rank running again).

**Counters** (the heartbeat service's own rate logic, ``domain.gpu_counters`` + the catalog's
warning rules, over simulated reports every 30 s): NVLink replay and corrected-ECC counters
rising with Poisson noise at a share of the catalog's rate, many GPU-hours: the warnings (hence
moves) they raise must be 0; the same counters past the rate: how long until the warning.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Any

from gpu_recovery import constants as C

MIN = 60
CHECKPOINT_EVERY = 10 * MIN  # the job's own checkpoints
CHECKPOINT_SECONDS = 30  # saving one (a GPU that fails meanwhile loses it)
POLL_SECONDS = 2  # rank 0 asks the control channel every step
WARN_AFTER = 7 * MIN  # into the job: 7 minutes of work since its last checkpoint
LEADS = (5, 20, 60, 120, 300, 900)  # warning -> the GPU's failure
KINDS = ("recovery_action", "remap_pending")
REPORT_EVERY = 30  # the node agent's interval


@dataclass
class Case:
    kind: str
    lead: int
    acted: bool  # the stack acted on the warning (False: the crash path)
    crashed: bool
    moved: bool
    work_lost: float  # seconds of training since the checkpoint the job restarted from
    not_training: float  # seconds from its last rank stopping to every rank running again
    restarted: bool  # running again (attempt 2) after the move or the crash


class _Rank0:
    """Rank 0's program: a checkpoint every CHECKPOINT_EVERY s; told to suspend, one more
    (CHECKPOINT_SECONDS to save; lost if the job faults meanwhile) and go_suspend().
    ``checkpoints``: when each was saved (a restart's starting point is the last one)."""

    def __init__(self, sim: Any, repo: Any, job_id: str, started: float) -> None:
        self.sim, self.repo, self.job_id = sim, repo, job_id
        self.last_checkpoint = started
        self.checkpoints = [started]
        self.told_attempt = 0

    def start(self) -> None:
        self.sim.schedule(self.sim.now() + POLL_SECONDS, self.poll, "rank 0")

    def poll(self) -> None:
        from gpu_recovery import runtime

        job = self.repo.jobs.get_job(self.job_id)
        if job is None or job.state.is_terminal:
            return
        now = self.sim.now()
        if job.state is C.JobState.RUNNING and now - self.last_checkpoint >= CHECKPOINT_EVERY:
            self.last_checkpoint = now
            self.checkpoints.append(now)
        if job.state is C.JobState.SUSPENDING and self.told_attempt != job.attempt:
            control = runtime.job_control_service()
            if control.status(self.job_id, 0, job.attempt)["suspend"]:
                self.told_attempt = job.attempt
                attempt = job.attempt
                self.sim.schedule(now + CHECKPOINT_SECONDS, lambda: self._saved(attempt), "checkpoint saved")
        self.start()

    def _saved(self, attempt: int) -> list[Any]:
        from gpu_recovery import runtime

        job = self.repo.jobs.get_job(self.job_id)
        if job is None or job.attempt != attempt or job.state is not C.JobState.SUSPENDING:
            return []  # the GPU failed while it saved: the checkpoint is lost, recovery took over
        self.last_checkpoint = self.sim.now()
        self.checkpoints.append(self.sim.now())
        runtime.job_control_service().go_suspend(self.job_id, 0, attempt)
        return []


def _case(kind: str, lead: int, acted: bool) -> Case:
    from local_mode.world import build_world

    env = {"POWERTOOLS_LOG_LEVEL": "CRITICAL", C.ENV_CONTROL_API_URL: "https://control.invalid/prod"}
    with build_world(dynamodb="memory", extra_env=env) as world:
        sim, repo = world.ecs, world.repo
        world.schedule_queue_scheduler(MIN)
        for node in ("node-a", "node-b", "node-c"):
            sim.add_node(node, gpus=8)
        definition = sim.register_training_task_definition("train", gpus=8)
        sim.plan_family("train", run_seconds=4 * 3600, exit_code=0)  # runs past the case's end
        job_id = world.submit_queue_job({
            "name": "bench", "task_definition": definition, "nnodes": 2, "gpus_per_node": 8,
            "max_infra_recoveries": 3}, "alice")
        def running() -> bool:
            job = repo.jobs.get_job(job_id)
            return job is not None and job.state is C.JobState.RUNNING

        sim.run_until_true(running, max_seconds=5 * MIN)
        started = sim.now()
        rank0 = _Rank0(sim, repo, job_id, started)
        rank0.start()
        rank1 = repo.jobs.get_rank(job_id, 1)
        assert rank1 is not None, "the job did not start"
        node = world.node_name(rank1.container_inst_id)
        sim.run_for(WARN_AFTER)
        warned_at = sim.now()
        if kind == "recovery_action":
            sim.warn_gpu(node, recovery_action="gpu_reset")
        else:
            sim.warn_gpu(node, remap_pending=True)
        if acted:
            reports = _AgentReports(sim, node)
            reports.start()
        crash: dict[str, float | None] = {"at": None}

        def fail() -> list[dict[str, Any]]:
            n = sim.node(node)
            if not n.gpu_state:  # repaired before: the announced failure does not happen
                return []
            if any(t.tags.get(C.TAG_JOB_ID) == job_id for t in sim.running_tasks(node)):
                crash["at"] = sim.now()
            sim.inject_gpu_fault(node, health="reset_fixable", exit_code=1, nccl_cascade=True)
            return []

        sim.schedule(warned_at + lead, fail, "the announced failure")

        def ended() -> bool:  # running again after the move or the crash (or ended)
            job = repo.jobs.get_job(job_id)
            return job is not None and (job.state.is_terminal or (
                job.attempt >= 2 and job.state is C.JobState.RUNNING and sim.now() > warned_at + lead))

        sim.run_until_true(ended, max_seconds=3 * 3600)
        sim.run_for(MIN)  # the restarted ranks placed, then RUNNING
        item = repo.jobs.get_job_item(job_id) or {}
        moves = [m for m in item.get("moves") or [] if m.get("outcome") == "moved"]
        tasks = sorted((t for t in sim.tasks.values() if t.tags.get(C.TAG_JOB_ID) == job_id
                        and not t.health_check), key=lambda t: t.created_at)
        first_stop = min((t.stopped_at for t in tasks if t.stopped_at and t.stopped_at > warned_at),
                         default=None)
        # The ranks started after the first stop (a gang restart replays the tasks' tags: the
        # attempt tag of a recovery's restart is not the new attempt).
        later = [t.started_at for t in tasks if first_stop is not None and t.created_at >= first_stop
                 and t.started_at is not None]
        running_again = max(later) if len(later) >= 2 else None
        # The work since the checkpoint the job restarted from, at its first stop after the warning.
        lost = (first_stop - max(c for c in rank0.checkpoints if c <= first_stop)) if first_stop \
            else float("nan")
        # A crash: the job went through the recovery loop (a fault of one of its attempts), not a
        # rank of a job already stopping at its checkpoint that the failing GPU took down too.
        faulted = int(item.get("recoveries_used") or 0) > 0 or any(
            h.get("to") in (C.JobState.PENDING_HEALTHCHECK.value, C.JobState.PENDING_RESTART.value)
            for h in item.get("history") or [])
        return Case(kind, lead, acted, faulted, bool(moves), lost,
                    (running_again - first_stop) if running_again and first_stop else float("nan"),
                    item.get("job_state") == C.JobState.RUNNING.value and int(item.get("attempt") or 0) >= 2)


class _AgentReports:
    """The warned node's agent: a GPU report every REPORT_EVERY seconds (the heartbeat service)."""

    def __init__(self, sim: Any, node: str) -> None:
        self.sim, self.node = sim, node

    def start(self) -> None:
        self.sim.report_gpu_state(self.node)
        self.sim.schedule(self.sim.now() + REPORT_EVERY, self.start, "agent")


def _counters(seed: int = 20261120) -> dict[str, Any]:
    """Counters below and past the catalog's rate, through the heartbeat service's rate logic."""
    from gpu_recovery.domain import gpu_counters
    from gpu_recovery.domain.evidence import build_evidence
    from gpu_recovery.domain.fault_catalog import default_catalog
    from gpu_recovery.domain.fault_vocabulary import Trigger
    from gpu_recovery.domain.gpu_warnings import driver_warning

    catalog = default_catalog()
    rng = random.Random(seed)
    limits = {r.match.counter_rate[0]: r.match.counter_rate[1] for r in catalog.warning_rules
              if r.match.counter_rate}

    naive = {"warned": 0}

    def series(counter: str, per_hour: float, hours: float) -> float | None:
        """Seconds until the first warning (None: none) for one GPU, reports every 30 s. Also
        counts (``naive``) the GPUs the measured rate alone, against the limit, would warn."""
        anchors: dict[str, Any] = {}
        value, now = 0, 0.0
        crossed = False
        while now < hours * 3600:
            now += REPORT_EVERY
            # Poisson arrivals in the interval (a burst now and then, as errors come).
            expected = per_hour * REPORT_EVERY / 3600
            trials = int(expected * 10) + 10
            value += sum(1 for _ in range(trials) if rng.random() < expected / trials)
            anchors, rates = gpu_counters.advance(anchors, [("GPU-0", {counter: value})], now,
                                                  catalog.counter_window_seconds)
            if not crossed and any(r.per_hour >= limits[counter] for r in rates):
                crossed = True
                naive["warned"] += 1
            item = {"gpu_telemetry": [{"i": 0, "u": "GPU-0"}], "last_gpu_report_at": now,
                    "gpu_counter_rates": [r.to_dict() for r in rates if r.increase > 0]}
            evidence = build_evidence(node_id="n", fault_at=now, trigger=Trigger.TELEMETRY,
                                      instance_item=item, catalog=catalog)
            if driver_warning(evidence, catalog) is not None:
                return now
        return None

    below: dict[str, Any] = {}
    past: dict[str, Any] = {}
    for counter in ("nvlink_replay_errors", "ecc_corrected_volatile"):
        limit = limits[counter]
        gpus, hours = 20, 6.0
        naive["warned"] = 0
        warned = sum(1 for share in (0.25, 0.5, 0.8) for _ in range(gpus)
                     if series(counter, limit * share, hours))
        below[counter] = {"rate_limit_per_hour": limit, "gpu_hours": round(3 * gpus * hours),
                          "shares_of_the_rate": [0.25, 0.5, 0.8], "warnings": warned,
                          "gpus_the_measured_rate_alone_would_warn": naive["warned"]}
        delays = [series(counter, limit * 2, 2.0) for _ in range(10)]
        found = [d for d in delays if d is not None]
        past[counter] = {"at_twice_the_rate": f"{len(found)}/10 warned",
                         "minutes_to_warning": round(statistics.median(found) / 60, 1) if found else None}
    return {"below_the_rate": below, "past_the_rate": past,
            "moves_from_counters_below_the_rate": sum(v["warnings"] for v in below.values())}


def _mean(values: list[float]) -> float | None:
    return round(statistics.mean(values), 1) if values else None


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def run() -> dict[str, Any]:
    cases = [_case(kind, lead, acted) for kind in KINDS for lead in LEADS for acted in (True, False)]
    print(f"{'warning':<16} {'lead':>6} {'path':<10} {'crashed':<8} {'moved':<6} {'work lost':>10} "
          f"{'not training':>13}")
    for c in cases:
        print(f"{c.kind:<16} {c.lead:>5}s {'acted on' if c.acted else 'crash':<10} {c.crashed!s:<8} "
              f"{c.moved!s:<6} {c.work_lost:>9.0f}s {c.not_training:>12.0f}s")
    acted = [c for c in cases if c.acted]
    crash = [c for c in cases if not c.acted]
    avoided = [c for c in acted if not c.crashed]
    lost_crash = [c.work_lost for c in crash if c.crashed]
    lost_moved = [c.work_lost for c in avoided if c.moved]
    downtime_moved = [c.not_training for c in avoided if c.moved and c.not_training == c.not_training]
    downtime_crash = [c.not_training for c in crash if c.crashed and c.not_training == c.not_training]
    min_lead = min((c.lead for c in avoided), default=None)
    summary = {
        "announced_faults": len(acted),
        "never_crashed_a_job": f"{len(avoided)}/{len(acted)}",
        "avoided_at_lead_seconds": sorted({c.lead for c in avoided}),
        "crashed_at_lead_seconds": sorted({c.lead for c in acted if c.crashed}),
        "work_lost_per_avoided_crash_s": _mean(lost_moved),
        "work_lost_per_crash_s (crash path)": _mean(lost_crash),
        "not_training_moved_s (median)": _median(downtime_moved),
        "not_training_crash_s (median)": _median(downtime_crash),
        "shortest_lead_avoided_s": min_lead,
        "all_restarted": all(c.restarted for c in cases),
    }
    counters = _counters()
    print("\nannounced faults that never crashed a job:", summary["never_crashed_a_job"],
          f"(leads avoided {summary['avoided_at_lead_seconds']}, crashed "
          f"{summary['crashed_at_lead_seconds']})")
    print(f"work lost per avoided crash: {summary['work_lost_per_avoided_crash_s']} s (the move checkpoints "
          "first); per crash on the crash path: "
          f"{summary['work_lost_per_crash_s (crash path)']} s; time not training: moved "
          f"{summary['not_training_moved_s (median)']} s, crashed "
          f"{summary['not_training_crash_s (median)']} s (medians)")
    print("moves caused by counters below the catalog's rate: "
          f"{counters['moves_from_counters_below_the_rate']} ({counters['below_the_rate']}); past it: "
          f"{counters['past_the_rate']}")
    return {"cases": [c.__dict__ for c in cases], "summary": summary, "counters": counters}
