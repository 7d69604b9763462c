"""Stage 5: the scheduled sweep (every minute). Reads only items whose deadline passed.

Every intermediate state that needs a follow-up carries a short deadline, and the
sweep runs the same converge step as the event path: whatever call a delivery died
at, the next sweep (at most about two minutes later) finishes its work.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from gpu_recovery import clock
from gpu_recovery.domain.models import Instance, Job
from gpu_recovery.domain.states import HEALTH_CHECK_STATES, InstanceState, JobState
from gpu_recovery.recovery.breaker import BreakerOperations
from gpu_recovery.recovery.gang_restart import GangRestart
from gpu_recovery.recovery.health_checks import HealthChecks
from gpu_recovery.recovery.ports import Deps, Outcome
from gpu_recovery.recovery.reboots import Reboots
from gpu_recovery.recovery.suspension import Suspensions
from gpu_recovery.recovery.task_events import TaskEvents

logger = logging.getLogger(__name__)

RETRY_INTERVAL_SECONDS = 60
# A job whose gang restart has not happened this long after its fault (health check,
# reboot and a margin) fails instead of waiting forever.
RESTART_GIVE_UP_MARGIN_SECONDS = 600


class Sweep:
    def __init__(self, deps: Deps, faults: TaskEvents, health: HealthChecks, reboots: Reboots,
                 restarts: GangRestart, breaker: BreakerOperations, suspensions: Suspensions) -> None:
        self.deps = deps
        self.faults = faults
        self.health = health
        self.reboots = reboots
        self.restarts = restarts
        self.breaker = breaker
        self.suspensions = suspensions

    def run(self) -> Outcome:
        now = clock.now()
        handled: dict[str, int] = {}
        for instance in self.deps.repo.due_instances(now):
            self._count(handled, partial(self._instance, instance, now),
                        {"instance": instance.container_inst_id})
        for item in self.deps.repo.due_job_items(now):
            self._count(handled, partial(self._job, item, now), {"job_id": item.get("job_id")})
        try:
            for action, count in self.breaker.sweep(now).items():
                handled[action] = handled.get(action, 0) + count
        except Exception:
            logger.exception("breaker sweep failed")
            handled["error"] = handled.get("error", 0) + 1
        return Outcome("swept", detail={"handled": handled})

    @staticmethod
    def _count(handled: dict[str, int], step: Callable[[], str], context: dict[str, Any]) -> None:
        try:
            action = step()
        except Exception:
            # One item's AWS error must not stop the others; the item keeps its deadline
            # and the next sweep tries it again.
            logger.exception("sweep step failed", extra=context)
            action = "error"
        handled[action] = handled.get(action, 0) + 1

    def _instance(self, instance: Instance, now: float) -> str:
        if instance.state in HEALTH_CHECK_STATES:
            return self.health.sweep(instance, now)
        if instance.state is InstanceState.REBOOTING:
            return self.reboots.sweep(instance, now)
        if instance.state is InstanceState.QUARANTINED and (instance.drain_pending
                                                             or instance.terminate_pending):
            return self.reboots.finish_quarantine(instance)
        self.deps.repo.clear_instance_deadline(instance.container_inst_id, instance.state)
        return "cleared"

    def _job(self, item: dict[str, Any], now: float) -> str:
        if item.get("item_type") != "JOB":
            return "ignored"
        repo = self.deps.repo
        job = repo.job_from_item(item)
        if job.state is JobState.PENDING_RESTART:
            settings = self.deps.settings
            give_up_at = ((job.fault_started_at or now) + settings.health_check_timeout_seconds
                          + settings.reboot_timeout_seconds + RESTART_GIVE_UP_MARGIN_SECONDS)
            if now >= give_up_at:
                self.restarts.fail_pending_restart(
                    job, "the gang restart did not happen in time (instances or old ranks never "
                         "became ready)")
                return "restart_timed_out"
            outcome = self.restarts.try_restart(job.job_id)
            if outcome.action == "waiting":
                self._stop_old_ranks(job)
                repo.rearm_job(job, now + RETRY_INTERVAL_SECONDS)
            return f"restart_{outcome.action}"
        if job.state is JobState.PENDING_HEALTHCHECK:
            # Stop what is still running, open any health check the fault still lacks
            # (timeouts of open checks are the instance sweep's).
            self.faults.converge_fault(job, reissue=True)
            repo.rearm_job(job, now + RETRY_INTERVAL_SECONDS)
            return "health_check_waiting"
        if job.state is JobState.STARTING and job.restarted_attempt == job.attempt:
            return self.restarts.resume(job)
        if job.state is JobState.SUSPENDING:
            # The grace is over (stop by force), or stops are still to be confirmed.
            return self.suspensions.sweep(job, now)
        repo.clear_job_deadline(job.job_id, job.state, item.get("deadline_at"))
        return "cleared"

    def _stop_old_ranks(self, job: Job) -> None:
        """A restart waits for the old ranks to stop: ask again for any still running."""
        self.faults.ranks.stop_live_ranks(job, why=job.last_error or "suspected GPU fault", reissue=True)
