"""The scheduler's time-sharing duties, around the pure policy (``domain.time_sharing``,
``queue.planner``): quota charges released, ABOVE_NORMAL jobs demoted, running gangs for
preemption, victims asked to suspend.

Every tick reads the sparse holding index once (the queue jobs that hold nodes, with a
few projected attributes): a job there in a state that holds no nodes gets its charge
released (exactly once, see ``repository.time_sharing``); a RUNNING ABOVE_NORMAL job that
has run long enough drops to NORMAL; the rest are the running gangs preemption may
choose from. A gang's nodes (the nodes its ranks still hold, from its attempt's latch shards:
``ceil(n / 64)`` items, not its rank items) are read only when a blocked job of higher priority
looks for victims, once per tick.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.domain.states import HOLDING_JOB_STATES, JobState
from gpu_recovery.domain.time_sharing import (
    Priority,
    QuotaBook,
    QuotaEntry,
    RunningGang,
    SuspendKind,
    demotion_due,
    priority_name,
)
from gpu_recovery.queue.planner import Step
from gpu_recovery.repository.time_sharing import ChargeClaim, HoldingRepository, QuotaCharge
from gpu_recovery.settings import TimeSharingSettings

logger = logging.getLogger(__name__)


class SuspendPort(Protocol):
    """The recovery loop's suspension stage (``RecoveryService.request_suspend``)."""

    def request_suspend(self, job_id: str, attempt: int, *, kind: SuspendKind, reason: str,
                        grace_seconds: int, actor: str, hold: bool = False, by_job: str = "",
                        by_user: str = "", by_priority: int | None = None) -> bool: ...


class HeldNodes(Protocol):
    """The nodes a gang's attempt still holds (``repository.latches``)."""

    def held_nodes(self, job_id: str, attempt: int, world_size: int) -> set[str]: ...


def subject_of(item: Mapping[str, Any]) -> str:
    """The quota subject of a job's owner (recorded at submit; the owner's ARN before)."""
    return str(item.get("quota_subject") or item.get("user") or "")


class TimeSharing:
    def __init__(self, gangs: HeldNodes, holding: HoldingRepository, suspender: SuspendPort,
                 settings: TimeSharingSettings) -> None:
        self.gangs = gangs
        self.holding = holding
        self.suspender = suspender
        self.settings = settings
        self._holding_items: dict[str, dict[str, Any]] = {}
        self._footprints: dict[str, dict[str, int]] = {}

    # ------------------------------------------------------------ housekeeping
    def housekeeping(self, now: float) -> dict[str, list[str]]:
        """Release charges of jobs that hold no nodes; demote ABOVE_NORMAL jobs."""
        released: list[str] = []
        demoted: list[str] = []
        self._holding_items = {}
        self._footprints = {}
        for item in self.holding.holding_jobs():
            job_id = str(item.get("job_id", ""))
            try:
                state = JobState(item["job_state"])
            except (KeyError, ValueError):
                continue
            charge = item.get("quota_charge")
            if state not in HOLDING_JOB_STATES:
                if charge and self._release(job_id, charge):
                    released.append(job_id)
                continue
            if state is JobState.RUNNING and self._demote(item, now):
                demoted.append(job_id)
            self._holding_items[job_id] = item
        return {"released": released, "demoted": demoted}

    def release_if_waiting(self, item: Mapping[str, Any]) -> bool:
        """A queue-head job still carrying a charge from its last run: release it first."""
        charge = item.get("quota_charge")
        if not charge:
            return False
        return self._release(str(item["job_id"]), charge)

    def _release(self, job_id: str, raw: Mapping[str, Any]) -> bool:
        try:
            charge = QuotaCharge.from_item(raw)
        except (KeyError, TypeError, ValueError):
            logger.warning("malformed quota charge left alone", extra={"job_id": job_id})
            return False
        done = self.holding.release(job_id, charge)
        if done:
            logger.info("quota charge released", extra={"job_id": job_id, "key": charge.key,
                                                        "nodes": charge.nodes})
        return done

    def _demote(self, item: dict[str, Any], now: float) -> bool:
        priority = int(item.get("priority") or 0)
        since = item.get("launched_at")
        if not demotion_due(priority, None if since is None else float(since), now,
                            self.settings.demote_after_seconds):
            return False
        minutes = self.settings.demote_after_seconds // 60
        done = self.holding.demote(
            str(item["job_id"]), int(item.get("attempt") or 0), from_priority=priority,
            to_priority=int(Priority.NORMAL),
            reason=f"priority {priority_name(priority)} -> NORMAL after {minutes} min of running")
        if done:
            item["priority"] = int(Priority.NORMAL)
        return done

    # ------------------------------------------------------------------ quotas
    def quota_book(self, load: Any) -> QuotaBook:
        """``load(subject, priority) -> QuotaEntry | None`` reads the quota table."""
        return QuotaBook(self.settings.default_node_quotas, load)

    def charge_for(self, book: QuotaBook, item: Mapping[str, Any]) -> ChargeClaim:
        """The charge a launch claims, with the limit the tick read and the default."""
        subject, priority = subject_of(item), int(item.get("priority") or 0)
        entry: QuotaEntry = book.entry(subject, priority)
        charge = QuotaCharge(subject, priority, int(item.get("world_size") or 1))
        return ChargeClaim(charge, entry.limit, self.settings.default_node_quotas.get(priority))

    # --------------------------------------------------------------- preemption
    def running_gangs(self, below: int) -> list[RunningGang]:
        """Running queue jobs of priority below ``below`` (candidates), and jobs being
        suspended to make room for another (their nodes count as freed for it)."""
        gangs: list[RunningGang] = []
        for job_id, item in self._holding_items.items():
            state = str(item.get("job_state"))
            suspend = item.get("suspend") or {}
            priority = int(item.get("priority") or 0)
            if state == JobState.RUNNING.value and priority < below:
                preempted_for = ""
            elif (state == JobState.SUSPENDING.value and suspend.get("kind") == SuspendKind.PREEMPTED.value
                  and suspend.get("by_job")):
                preempted_for = str(suspend["by_job"])
            else:
                continue
            footprint = self._footprint(job_id, item)
            if footprint:
                started = float(item.get("launched_at") or item.get("holding_since") or 0)
                gangs.append(RunningGang(job_id, subject_of(item), priority, started, footprint,
                                         preempted_for))
        return gangs

    def _footprint(self, job_id: str, item: Mapping[str, Any]) -> dict[str, int]:
        """node -> GPUs the gang's rank there holds (a queue job's gang: one rank per node)."""
        if job_id not in self._footprints:
            gpus = int(item.get("gpus_per_node") or 0)
            nodes = self.gangs.held_nodes(job_id, int(item.get("attempt") or 0),
                                          int(item.get("world_size") or 1))
            self._footprints[job_id] = dict.fromkeys(sorted(nodes), gpus)
        return self._footprints[job_id]

    def suspend_victims(self, step: Step, preemptor: Mapping[str, Any]) -> list[str]:
        """Ask each victim of ``step`` to suspend (RUNNING -> SUSPENDING)."""
        asked: list[str] = []
        by_user = subject_of(preemptor)
        by_priority = int(preemptor.get("priority") or 0)
        for victim in step.victims:
            item = self._holding_items.get(victim)
            if item is None:
                continue
            grace = int(item.get("suspend_grace_seconds") or self.settings.suspend_grace_seconds)
            reason = (f"preempted by job {step.job_id} ({priority_name(by_priority)}, {by_user}) "
                      f"which needs its nodes")
            if self.suspender.request_suspend(
                    victim, int(item.get("attempt") or 0), kind=SuspendKind.PREEMPTED, reason=reason,
                    grace_seconds=grace, actor="scheduler", by_job=step.job_id, by_user=by_user,
                    by_priority=by_priority):
                asked.append(victim)
                item["job_state"] = JobState.SUSPENDING.value
                item["suspend"] = {"kind": SuspendKind.PREEMPTED.value, "by_job": step.job_id,
                                   "requested_at": clock.now()}
        return asked
