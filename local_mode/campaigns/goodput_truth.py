"""The goodput ledger checked against what the simulated training really did (issue 52).

The campaigns' training tasks keep no checkpoint: each attempt starts from step 0 and only
an attempt that runs to its end (exit 0) trains for good. So the truth of a job is the
time its gang trained (from its last rank RUNNING to rank 0's end) in attempts that
completed; everything a faulted attempt ran is lost work. The simulated program tells the
stack where it starts, as the training client would (``checkpoint_saved(0)`` at its start:
the step it resumes from), and the ledger must match the truth within ``TOLERANCE`` of the
job's wall time.
"""

from __future__ import annotations

from typing import Any

from gpu_recovery import clock
from gpu_recovery import constants as C
from gpu_recovery.domain import goodput
from gpu_recovery.repository import Repository

from ..sim.ecs import SimulatedEcs

TOLERANCE = 0.01  # of the job's wall time


def report_start(repo: Repository, sim: SimulatedEcs, job_id: str) -> None:
    """Each running attempt of the job: ``checkpoint_saved(0)`` at its start (the step a
    program without checkpoints resumes from), as the control API records it."""
    for attempt, tasks in _attempts(sim, job_id).items():
        started = [t.started_at for t in tasks if t.started_at is not None and t.last_status == "RUNNING"]
        if started and len(started) == len(tasks):
            repo.jobs.record_checkpoint(job_id, attempt, 0, float(max(started)))


def truth(sim: SimulatedEcs, job_id: str) -> float:
    """Seconds of training kept: in the attempts whose every task ran to its end (exit 0), the
    time from the gang's rendezvous (its last rank RUNNING: the simulated ranks train from
    there, ``Plan.gang``) to rank 0's end. Before it rank 0 runs but waits for its peers (a
    rank a broken call started late), which is the restart's time, not training."""
    kept = 0.0
    for tasks in _attempts(sim, job_id).values():
        if all(t.exit_code == 0 and t.started_at is not None and t.stopped_at is not None for t in tasks):
            met = max(float(t.started_at) for t in tasks)
            kept += max(0.0, float(_rank_zero(tasks).stopped_at) - met)
    return kept


def _rank_zero(tasks: list[Any]) -> Any:
    """The attempt's task of rank 0 (a grouped start names its ranks in one tag)."""
    for task in tasks:
        ranks = str(task.tags.get(C.TAG_RANK) or task.tags.get(C.TAG_RANKS) or "")
        first = ranks.split(" ")[0]  # "0", or a grouped start's runs ("0-3 5 9")
        if first == "0" or first.startswith("0-"):
            return task
    return min(tasks, key=lambda t: float(t.started_at))


def compare(repo: Repository, sim: SimulatedEcs, job_id: str) -> dict[str, Any]:
    """The ledger's figures beside the truth (a campaign result's facts)."""
    item = repo.jobs.get_job_item(job_id) or {}
    ledger = goodput.ledger_of(item, clock.now())
    return {"wall": round(ledger.wall, 1), "productive": round(ledger.seconds[goodput.PRODUCTIVE], 1),
            "truth": round(truth(sim, job_id), 1), "ettr": ledger.ettr,
            "badput": {c: round(s, 1) for c, s in ledger.seconds.items() if s and c != goodput.PRODUCTIVE},
            "lost_work_unknown": ledger.lost_work_unknown}


def problems(figures: dict[str, Any]) -> list[str]:
    """The ledger off the truth by more than the tolerance (empty: it matches)."""
    if not figures:
        return []
    off = abs(float(figures["productive"]) - float(figures["truth"]))
    if off <= TOLERANCE * max(float(figures["wall"]), 1.0):
        return []
    return [f"goodput ledger: productive {figures['productive']} s, the truth {figures['truth']} s "
            f"(off by {off:.1f} s, over {TOLERANCE:.0%} of {figures['wall']} s wall; {figures['badput']})"]


def _attempts(sim: SimulatedEcs, job_id: str) -> dict[int, list[Any]]:
    """The job's training tasks by attempt."""
    attempts: dict[int, list[Any]] = {}
    for task in sim.tasks.values():
        if not task.health_check and task.tags.get(C.TAG_JOB_ID) == job_id:
            attempts.setdefault(int(task.tags.get(C.TAG_ATTEMPT, "1")), []).append(task)
    return attempts
