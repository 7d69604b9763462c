"""Jobs held by the blast-radius breaker: they wait (HELD) instead of failing.

A job that cannot move (not relocatable) whose restart needs a node whose reboot the
breaker held back enters HELD from PENDING_RESTART once every verdict of its fault is in
and every old rank ended (``GangRestart.try_restart`` asks :meth:`HeldJobs.hold`). One
conditional write: the job HELD with its hold (nodes, since, until) and a deadline in the
sparse due index; nothing is charged. Then one e-mail (``event_kind=job_held``) says which
node it waits for and what a reset will do.

Every minute the sweep reads the held job, the nodes it waits for and the breaker's item
(:meth:`HeldJobs.sweep`; ``domain.breaker.hold.judge_hold`` decides):

* every node back and healthy (the reset's ``--resume-backlog`` rebooted it): HELD ->
  PENDING_RESTART, its restart charged once (conditional on HELD), then the gang restart
  of the loop (which the sweep resumes if this delivery dies);
* the backlog dropped, or a node lost (quarantined, gone): FAILED with that reason;
* the deadline passed (``held_job_deadline_seconds``): FAILED naming the node and the hold.

Cost: per held job a minute, one job item and the few nodes it waits for; nothing scanned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

from gpu_recovery import clock
from gpu_recovery.constants import RETRY_INTERVAL_SECONDS, NotificationKind
from gpu_recovery.domain.breaker.hold import (
    BreakerHold,
    HoldAction,
    NodeStanding,
    NodeView,
    backlog_nodes,
    holdable,
    judge_hold,
    standing,
)
from gpu_recovery.domain.models import Instance, Job
from gpu_recovery.domain.states import JobState, SuspectVerdict
from gpu_recovery.recovery.goodput_metrics import ended
from gpu_recovery.recovery.notices import Notices, Owed
from gpu_recovery.recovery.ports import MetricsPort, Outcome
from gpu_recovery.recovery.stage_data import EndsJobs, HasInstances, HasJobs, ReadsInstances
from gpu_recovery.repository.breaker import BreakerRepository
from gpu_recovery.repository.deadlines import DeadlineIndex
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

_FAILED_ACTION = ("Find why the breaker tripped, repair or reboot the node by hand (then "
                  "`gpu-recovery-admin uncordon --node-id <id>`), and resubmit the job.")


def node_view(instance: Instance | None) -> NodeView:
    if instance is None:
        return NodeView(None)
    held = str((instance.breaker_blocked or {}).get("action") or "")
    return NodeView(instance.state, instance.cordoned, held)


def _at(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class HoldData(HasJobs[EndsJobs], HasInstances[ReadsInstances], Protocol):
    """The job (its failure, its next look), its nodes and suspects."""

    deadlines: DeadlineIndex
    faults: FaultRepository


@dataclass(eq=False, repr=False)
class HeldJobs:
    data: HoldData
    breaker: BreakerRepository
    notices: Notices
    _: KW_ONLY
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    settings: Settings

    # ------------------------------------------------------------------ enter
    def hold(self, job: Job, unusable: list[str]) -> Outcome | None:
        """A PENDING_RESTART job that cannot move, with every verdict in: HELD while a node
        it needs has its reboot held back by the breaker (or released and not back yet).
        None: nothing to hold for (every such node is back: restart as usual) or a node it
        cannot wait for (lost for good, or a hold of 0 s): the caller fails it as before.
        ``unusable``: the job's nodes the loop marked SUSPECT or QUARANTINED meanwhile."""
        tally = job.tally
        seconds = self.settings.held_job_deadline_seconds
        if job.relocate or tally.fatal > tally.held or seconds <= 0 or not (tally.held or unusable):
            return None
        repo = self.data
        held_here = {s.node for s in repo.faults.suspects(job.job_id, job.attempt)
                     if s.verdict is SuspectVerdict.BLOCKED} if tally.held else set()
        nodes = sorted(held_here | set(unusable))
        instances = repo.instances.get_instances(nodes)
        views = {n: node_view(instances.get(n)) for n in nodes}
        breaker = self.breaker.read()
        backlog = backlog_nodes(breaker)
        if not holdable(views, backlog=backlog):
            return None
        waiting = [n for n in nodes if standing(views[n], in_backlog=n in backlog) is not NodeStanding.BACK]
        if not waiting:
            return None
        now = clock.now()
        existing = job.breaker_hold
        if existing is not None:
            # Held again on this fault (one node back, another still held): same deadline.
            hold = replace(existing, nodes=tuple(waiting), resumed_at=None)
            if hold.expired(now):
                self.fail(job, hold.timeout_reason())
                return Outcome("restart_failed", job.job_id, {"why": "held too long"})
        else:
            raw = (repo.jobs.get_job_item(job.job_id) or {}).get("breaker_hold") or {}
            spend = str(raw.get("spend", "")) if int(raw.get("attempt") or 0) == job.attempt else ""
            reasons = sorted({str((instances[n].breaker_blocked or {}).get("reason") or "")
                              for n in waiting if n in instances} - {""})
            why = "reboot held back by the blast-radius breaker" + (f": {reasons[0]}" if reasons else "")
            hold = BreakerHold.start(job.job_id, job.attempt, now, seconds, waiting, spend=spend, why=why)
        notice = self._held_notice(replace(job, state=JobState.HELD), hold) if existing is None else None
        if not self.breaker.hold_job(job, hold, min(hold.until, now + RETRY_INTERVAL_SECONDS),
                                     also=self.notices.owe([notice], now)):
            return Outcome("duplicate", job.job_id)
        self.notices.send([notice])
        self.metrics.add_metric("JobsHeld", "Count", 1)
        logger.warning("job held by the breaker", extra={"job_id": job.job_id, "nodes": waiting,
                                                         "until": hold.until})
        return Outcome("held", job.job_id, {"nodes": list(hold.nodes), "until": hold.until})

    # ------------------------------------------------------------------ sweep
    def sweep(self, job: Job, now: float, restart: Callable[[str], Outcome]) -> str:
        """Every minute while HELD: go on once every node is back, fail when waiting cannot
        help any more (backlog dropped, node lost, deadline), otherwise wait."""
        repo = self.data
        hold = job.breaker_hold
        if hold is None:
            self.fail(job, "held without a record of what it waits for")
            return "held_failed"
        instances = repo.instances.get_instances(list(hold.nodes))
        breaker = self.breaker.read() or {}
        judged = judge_hold(hold, {n: node_view(instances.get(n)) for n in hold.nodes},
                            backlog=backlog_nodes(breaker), now=now,
                            reset_by=str(breaker.get("last_reset_by") or ""))
        if judged.action is HoldAction.FAIL:
            self.fail(job, judged.reason)
            return "held_failed"
        if judged.action is HoldAction.RESUME:
            if not self.breaker.resume_held_job(job, hold, judged.reason, now):
                return "held_raced"
            return f"held_resumed_{restart(job.job_id).action}"
        repo.deadlines.rearm_job(job, min(hold.until, now + RETRY_INTERVAL_SECONDS))
        return "held_waiting"

    # ------------------------------------------------------------------ fail
    def fail(self, job: Job, reason: str) -> bool:
        """HELD (or PENDING_RESTART, re-entering an expired hold) -> FAILED, once."""
        notice = self.notices.for_job(
            replace(job, state=JobState.FAILED, last_error=reason[:1000]), None, NotificationKind.FAILED,
            "Job failed: held node not rebooted", what_happened=reason,
            what_was_done="Job marked FAILED (it was HELD, not charged)", operator_action=_FAILED_ACTION)
        if not ended(self.metrics, self.data.jobs, job.job_id, self.data.jobs.finish_job(
                job.job_id, job.attempt, JobState.FAILED, reason, fields={"last_error": reason[:1000]},
                from_states=[job.state], also=self.notices.owe([notice]))):
            return False
        self.notices.send([notice])
        self.metrics.add_metric("Failures", "Count", 1)
        return True

    def _held_notice(self, job: Job, hold: BreakerHold) -> Owed:
        nodes = hold.named()
        closes_itself = self.settings.remediation.breaker.auto_close
        title = ("Job held: waiting for the breaker to close" if closes_itself
                 else "Job held: waiting for the breaker's reset")
        by_itself = ("The breaker closes by itself once its window has passed and the nodes it acted on are "
                     "back healthy (breaker_auto_close): it then reboots the held nodes a window's allowance "
                     "at a time and the job restarts, with no one acting; it stays open for an operator if "
                     "the reboots did not fix them. " if closes_itself else "")
        or_closing = " or the breaker closing" if closes_itself else ""
        return self.notices.for_job(
            job, None, NotificationKind.JOB_HELD, title,
            what_happened=f"{nodes}: {hold.why}",
            what_was_done=(f"Job HELD on {nodes}, not failed (its budget is not charged while held); its "
                           f"other nodes stay reserved for its restart; it waits until {_at(hold.until)} "
                           f"({hold.seconds} s, held_job_deadline_seconds)"),
            operator_action=(f"{by_itself}`gpu-recovery-admin breaker reset --resume-backlog` reboots "
                             f"{nodes} now; the job restarts on its nodes once they are back (charged once "
                             "for the fault). `--drop-backlog` fails the job at the next sweep (the node "
                             f"stays SUSPECT and cordoned). Without a reset{or_closing} the job fails at "
                             f"{_at(hold.until)}."),
            details=[f"Held: job {job.job_id} (attempt {job.attempt}) waits on {n}" for n in hold.nodes[:10]])
