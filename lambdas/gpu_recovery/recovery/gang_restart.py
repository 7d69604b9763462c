"""Stage 4: restart every rank of a job as a gang once every node it needs is back.

The job is claimed once (PENDING_RESTART -> STARTING, attempt + 1); each rank is then
started under a lease on its rank item with a deterministic ``startedBy``. A launch
cut short is resumed by the sweep: a rank whose lease expired is looked up by
``startedBy`` before it is started, so no rank ever runs twice.
"""

from __future__ import annotations

import logging

from gpu_recovery import clock
from gpu_recovery.constants import CLAIM_LEASE_SECONDS, NotificationKind
from gpu_recovery.domain import policy
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.states import UNUSABLE_INSTANCE_STATES, JobState, RankState, SuspectVerdict
from gpu_recovery.recovery.ports import Deps, Outcome
from gpu_recovery.recovery.ranks import RankOperations, RankRegistration, restart_started_by, tags_for_attempt

logger = logging.getLogger(__name__)

RETRY_INTERVAL_SECONDS = 60


class GangRestart:
    def __init__(self, deps: Deps, ranks: RankOperations) -> None:
        self.deps = deps
        self.ranks = ranks

    def try_restart(self, job_id: str) -> Outcome:
        """Restart every rank of a job once every instance it needs is available."""
        repo = self.deps.repo
        job = repo.get_job(job_id)
        if job is None or job.state is not JobState.PENDING_RESTART:
            return Outcome("ignored", job_id, {"why": "not pending restart"})
        ranks = [r for r in repo.get_ranks(job) if r.attempt == job.attempt]
        if len(ranks) != job.world_size:
            self.fail_pending_restart(job, f"rank records of attempt {job.attempt} are incomplete "
                                           f"({len(ranks)} of {job.world_size}): cannot restart")
            return Outcome("restart_failed", job_id, {"why": "rank records incomplete"})
        instances = repo.get_instances(r.container_inst_id for r in ranks)
        unusable = sorted(i for i, inst in instances.items() if inst.state in UNUSABLE_INSTANCE_STATES)
        if unusable:
            self.fail_pending_restart(job, f"instance(s) {', '.join(unusable)} the job needs "
                                           "were quarantined or marked suspect meanwhile")
            return Outcome("restart_failed", job_id, {"unusable": unusable})
        stopping = [r.rank for r in ranks if not r.state.is_terminal]
        pending = policy.verdicts_pending(job.suspects)
        if (len(instances) < len({r.container_inst_id for r in ranks})
                or not policy.gang_ready(instances.values()) or stopping or pending):
            # Every verdict of the fault is in, every node back, every old rank stopped
            # (its GPUs are the restart's).
            return Outcome("waiting", job_id, {"stopping_ranks": stopping, "pending_verdicts": pending,
                                               "instances": {i: s.state.value for i, s in instances.items()}})
        now = clock.now()
        if not repo.claim_gang_restart(job, now=now, deadline_at=now + RETRY_INTERVAL_SECONDS):
            return Outcome("duplicate", job_id)
        started = repo.get_job(job_id) or job
        return self._launch_and_report(started, ranks)

    def resume(self, job: Job) -> str:
        """The sweep: finish a gang restart an invocation left half-way, then confirm it
        RUNNING once every rank is registered (its RUNNING events may be lost)."""
        previous = [r for r in self.deps.repo.get_ranks(job) if r.attempt == job.attempt - 1]
        if previous and self._launch_and_report(job, previous).action == "restart_failed":
            return "restart_failed"
        if self.confirm_running(job, "restart launched", actor="sweep"):
            return "restart_confirmed"
        self.deps.repo.rearm_job(job, clock.now() + RETRY_INTERVAL_SECONDS)
        return "restart_resuming" if previous else "restart_waiting"

    def _launch_and_report(self, job: Job, previous: list[Rank]) -> Outcome:
        """Launch what this invocation may; whoever starts the last rank reports the recovery."""
        launched = self._launch(job, previous)
        if launched is None:
            return Outcome("restart_failed", job.job_id)
        left = [r.rank for r in self.deps.repo.get_ranks(job) if r.attempt == job.attempt - 1]
        if left or not launched:
            return Outcome("restarted_partly", job.job_id, {"attempt": job.attempt, "not_started": left})
        self.deps.metrics.add_metric("Recoveries", "Count", 1)
        if job.fault_started_at:
            self.deps.metrics.add_metric("TimeToRestartSeconds", "Seconds",
                                         clock.now() - job.fault_started_at)
        rebooted = sorted(i for i, v in job.suspects.items() if v == SuspectVerdict.REBOOT.value)
        self.ranks.notify(
            job, None, NotificationKind.RECOVERED, "Job recovered and restarted",
            what_happened=job.last_error or "suspected GPU fault",
            what_was_done=(f"DCGM health check, reboot of {', '.join(rebooted)}; all {job.world_size} "
                           f"ranks restarted as attempt {job.attempt}"),
            operator_action="Nothing; watch the job. Repeated faults on the same node mean it should "
                            "be replaced.",
        )
        return Outcome("restarted", job.job_id, {"attempt": job.attempt, "tasks": launched})

    def confirm_running(self, job: Job, reason: str, actor: str = "recovery") -> bool:
        """STARTING -> RUNNING only once every rank of the attempt is registered."""
        current = [r for r in self.deps.repo.get_ranks(job) if r.attempt == job.attempt]
        if len(current) < job.world_size:
            return False
        return self.deps.repo.confirm_job_running(job.job_id, job.attempt, reason, actor)

    def _launch(self, job: Job, previous: list[Rank]) -> list[str] | None:
        """Start every rank of ``job.attempt`` whose lease this invocation wins."""
        attempt = job.attempt
        launched: list[str] = []
        for rank in sorted(previous, key=lambda r: r.rank):
            now = clock.now()
            retaken = rank.launch_attempt == attempt  # an earlier invocation held this lease
            if not self.deps.repo.claim_rank_launch(rank, attempt, now + CLAIM_LEASE_SECONDS, now):
                continue  # another invocation is starting it (or it is registered already)
            started_by = restart_started_by(job.job_id, attempt, rank.rank)
            found = self.deps.ecs.tasks_started_by(started_by) if retaken else []
            task_arn = found[0] if found else self._start_rank(rank, attempt, started_by)
            if task_arn is None:
                self._fail_restart(job, rank, attempt)
                return None
            self.ranks.register_rank(RankRegistration(
                job_id=job.job_id, rank=rank.rank, world_size=job.world_size, attempt=attempt,
                task_arn=task_arn, task_definition_arn=rank.task_definition_arn,
                container_instance_arn=rank.container_instance_arn, ec2_instance_id=rank.ec2_instance_id,
                overrides=rank.overrides, tags=tags_for_attempt(rank.tags, attempt), group=rank.group,
                started_by=started_by, state=RankState.STARTING,
            ))
            launched.append(task_arn)
        return launched

    def _start_rank(self, rank: Rank, attempt: int, started_by: str) -> str | None:
        for _ in range(self.deps.settings.restart_start_retries):
            result = self.deps.ecs.start_task(
                task_definition=rank.task_definition_arn,
                container_instance_arn=rank.container_instance_arn or rank.container_inst_id,
                overrides=rank.overrides, tags=tags_for_attempt(rank.tags, attempt),
                started_by=started_by, group=rank.group or None,
            )
            if result.task_arns:
                return result.task_arns[0]
            logger.warning("restart placement failed", extra={
                "job_id": rank.job_id, "rank": rank.rank, "reasons": result.reasons()})
        return None

    def _fail_restart(self, job: Job, rank: Rank, attempt: int) -> None:
        reason = f"could not start rank {rank.rank} on {rank.container_inst_id} for attempt {attempt}"
        if self.deps.repo.finish_job(job.job_id, None, JobState.FAILED, reason,
                                     fields={"last_error": reason}):
            self.deps.metrics.add_metric("Failures", "Count", 1)
            fresh = self.deps.repo.get_job(job.job_id) or job
            self.ranks.stop_live_ranks(fresh, why="restart failed")
            self.ranks.notify(fresh, None, NotificationKind.FAILED, "Job failed: restart failed",
                              what_happened=reason, what_was_done="Job marked FAILED; started ranks stopped",
                              operator_action="Check the cluster's capacity and the instance, then "
                                              "resubmit the job.")

    def fail_pending_restart(self, job: Job, reason: str) -> None:
        if self.deps.repo.finish_job(job.job_id, job.attempt, JobState.FAILED, reason,
                                     fields={"last_error": reason}, from_states=[JobState.PENDING_RESTART]):
            self.deps.metrics.add_metric("Failures", "Count", 1)
            self.ranks.notify(job, None, NotificationKind.FAILED, "Job failed: cannot be restarted",
                              what_happened=reason, what_was_done="Job marked FAILED",
                              operator_action="Repair or replace the node, set it ACTIVE again, and "
                                              "resubmit the job.")
