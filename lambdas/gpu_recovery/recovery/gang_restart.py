"""Stage 4: restart every rank of a job as a gang once every node it needs is back, or
on healthy nodes when one of its nodes is unusable (relocation).

The job is claimed once (PENDING_RESTART -> STARTING, attempt + 1); each rank is then
started under a lease on its rank item with a deterministic ``startedBy``. A launch
cut short is resumed by the sweep: a rank whose lease expired is looked up by
``startedBy`` before it is started, so no rank ever runs twice.

Relocation (a node quarantined or replaced, or rebooting with ``relocate_instead_of_wait``)
waits, like a restart, for every verdict of the fault and every old rank to stop; then

* a **queue job** goes back through the scheduler at the head of its priority (it keeps
  its original queue position; the scheduler picks healthy nodes and a new MASTER_ADDR);
* a **tag-registered job** whose tasks carry ``gpu-recovery:relocatable=true`` keeps its
  ranks on healthy nodes and moves the others to healthy free nodes: the placement
  (rank -> node) is committed with the claim, so a resumed launch starts every rank where
  the claim said. Other tag-registered jobs fail (their environment may pin addresses).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpu_recovery import clock
from gpu_recovery.constants import (
    CLAIM_LEASE_SECONDS,
    TAG_RELOCATABLE,
    NotificationKind,
    relocated_queue_order,
)
from gpu_recovery.domain import policy
from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.models import Instance, Job, Rank, container_instance_id
from gpu_recovery.domain.relocation import SpareNode, choose_targets, describe_moves, gpu_count
from gpu_recovery.domain.states import (
    FATAL_SUSPECT_VERDICTS,
    UNUSABLE_INSTANCE_STATES,
    InstanceState,
    JobState,
    RankState,
    SuspectVerdict,
)
from gpu_recovery.recovery.ports import Deps, Outcome
from gpu_recovery.recovery.ranks import RankOperations, RankRegistration, restart_started_by, tags_for_attempt
from gpu_recovery.repository.scheduling import SchedulingRepository

logger = logging.getLogger(__name__)

RETRY_INTERVAL_SECONDS = 60


class GangRestart:
    def __init__(self, deps: Deps, ranks: RankOperations) -> None:
        self.deps = deps
        self.ranks = ranks

    def relocatable(self, job: Job, ranks: list[Rank] | None = None) -> bool:
        """Queue jobs always; tag-registered jobs only when every rank's task carries
        ``gpu-recovery:relocatable=true``."""
        if job.is_queue_job:
            return True
        ranks = ranks if ranks is not None else [r for r in self.deps.repo.get_ranks(job)
                                                 if r.attempt == job.attempt]
        return bool(ranks) and all(r.tag_values.get(TAG_RELOCATABLE, "").lower() == "true" for r in ranks)

    def try_restart(self, job_id: str) -> Outcome:
        """Restart every rank of a job once every instance it needs is available, or
        relocate it off the instances it can no longer use."""
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
        unusable = sorted({i for i, inst in instances.items() if inst.state in UNUSABLE_INSTANCE_STATES}
                          | {i for i, v in job.suspects.items()
                             if SuspectVerdict(v) in FATAL_SUSPECT_VERDICTS and i in instances})
        relocatable = self.relocatable(job, ranks)
        if unusable and not relocatable:
            self.fail_pending_restart(job, f"instance(s) {', '.join(unusable)} the job needs "
                                           "were quarantined or marked suspect meanwhile")
            return Outcome("restart_failed", job_id, {"unusable": unusable})
        stopping = [r.rank for r in ranks if not r.state.is_terminal]
        pending = policy.verdicts_pending(job.suspects)
        if stopping or pending:
            # Every verdict of the fault is in, every old rank stopped (its GPUs are the
            # restart's, or free for others when the job moves).
            return Outcome("waiting", job_id, {"stopping_ranks": stopping, "pending_verdicts": pending,
                                               "instances": {i: s.state.value for i, s in instances.items()}})
        rebooting = sorted(i for i, inst in instances.items() if inst.state is InstanceState.REBOOTING)
        if relocatable and (unusable or job.relocate
                            or (rebooting and self.deps.settings.relocate_instead_of_wait)):
            moved = self._relocate(job, ranks, instances, unusable, rebooting)
            if moved is not None:
                return moved
        known = len(instances) >= len({r.container_inst_id for r in ranks})
        if not known or not policy.gang_ready(instances.values()):
            return Outcome("waiting", job_id, {"stopping_ranks": [], "pending_verdicts": [],
                                               "instances": {i: s.state.value for i, s in instances.items()}})
        now = clock.now()
        if not repo.claim_gang_restart(job, now=now, deadline_at=now + RETRY_INTERVAL_SECONDS):
            return Outcome("duplicate", job_id)
        started = repo.get_job(job_id) or job
        return self._launch_and_report(started, ranks)

    # --------------------------------------------------------------- relocation
    def _relocate(self, job: Job, ranks: list[Rank], instances: dict[str, Instance], unusable: list[str],
                  rebooting: list[str]) -> Outcome | None:
        """Move the job off ``unusable`` (and, with relocate_instead_of_wait, ``rebooting``)
        nodes. None: nothing to move now (wait for the reboot as usual)."""
        leaving = sorted(set(unusable) | (set(rebooting) if self.deps.settings.relocate_instead_of_wait
                                          else set()))
        why = self._relocation_reason(job, unusable, rebooting)
        if job.is_queue_job and unusable:
            return self._requeue(job, ranks, why)
        try:
            targets = self._spares_for(job, ranks, instances, leaving)
        except (ClientError, BotoCoreError) as error:
            # No cluster access from this function (or throttled): the sweep tries again.
            logger.warning("relocation snapshot failed", extra={"job_id": job.job_id, "error": str(error)})
            self.deps.repo.rearm_job(job, clock.now())
            return Outcome("waiting", job.job_id, {"why": "cluster snapshot failed"})
        if job.is_queue_job:
            # relocate_instead_of_wait: only when healthy free nodes exist now; otherwise the
            # reboot is the faster way back.
            return self._requeue(job, ranks, why) if targets is not None else None
        if targets is None:
            if unusable:
                self.fail_pending_restart(job, f"no healthy free node to relocate the ranks on "
                                               f"{', '.join(leaving)} ({why})")
                return Outcome("restart_failed", job.job_id, {"why": "no spare node"})
            return None
        placement: dict[str, dict[str, Any]] = {}
        for rank in ranks:
            target = targets.get(rank.rank)
            placement[str(rank.rank)] = {
                "from": rank.container_inst_id,
                "node": target.node_id if target else rank.container_inst_id,
                "arn": target.container_instance_arn if target else rank.container_instance_arn,
                "ec2": target.ec2_instance_id if target else rank.ec2_instance_id,
                "why": why if target else ""}
        now = clock.now()
        moves = describe_moves({r: (p["from"], p["node"]) for r, p in placement.items()})
        reason = f"relocated: {moves}; {why}"
        if not self.deps.repo.claim_gang_restart(job, now=now, deadline_at=now + RETRY_INTERVAL_SECONDS,
                                                 placement=placement, reason=reason):
            return Outcome("duplicate", job.job_id)
        self.deps.metrics.add_metric("Relocations", "Count", 1)
        started = self.deps.repo.get_job(job.job_id) or job
        return self._launch_and_report(started, ranks)

    @staticmethod
    def _relocation_reason(job: Job, unusable: list[str], rebooting: list[str]) -> str:
        if unusable:
            labels = ", ".join(f"{i} {job.suspects.get(i, 'unusable').lower()}" for i in unusable)
            return f"node(s) unusable: {labels}"
        return f"node(s) rebooting ({', '.join(rebooting)}): relocate_instead_of_wait"

    def _spares_for(self, job: Job, ranks: list[Rank], instances: dict[str, Instance],
                    leaving: list[str]) -> dict[int, SpareNode] | None:
        """Healthy free nodes for the ranks on ``leaving`` nodes (None: not enough)."""
        moving = [r for r in ranks if r.container_inst_id in leaving]
        if not moving:
            return {}
        described = self.deps.ecs.container_instances()
        ids = [container_instance_id(ci["containerInstanceArn"]) for ci in described]
        states = self.deps.repo.get_instances(ids) if ids else {}
        held = self._held_by_other_recoveries(job)
        staying = {r.container_inst_id for r in ranks if r.container_inst_id not in leaving}
        spares = []
        for ci, node_id in zip(described, ids, strict=True):
            instance = states.get(node_id)
            if ci.get("status") != "ACTIVE" or not ci.get("agentConnected") or node_id in held \
                    or node_id in staying or node_id in leaving \
                    or (instance is not None and instance.state is not InstanceState.AVAILABLE):
                continue
            spares.append(SpareNode(node_id, ci["containerInstanceArn"], str(ci.get("ec2InstanceId", "")),
                                    gpu_count(ci.get("remainingResources")),
                                    gpu_count(ci.get("registeredResources"))))
        registered = {node_id: gpu_count(ci.get("registeredResources"))
                      for ci, node_id in zip(described, ids, strict=True)}
        needs = {r.rank: r.gpus or registered.get(r.container_inst_id, 0) or 1 for r in moving}
        return choose_targets(needs, spares)

    def _held_by_other_recoveries(self, job: Job) -> set[str]:
        """Nodes other jobs in recovery will restart on (their GPUs are free, not spare)."""
        held: set[str] = set()
        for item in SchedulingRepository(self.deps.repo).jobs_in_recovery():
            other = self.deps.repo.job_from_item(item)
            if other.job_id == job.job_id:
                continue
            for rank in self.deps.repo.get_ranks(other):
                if rank.attempt == other.attempt and rank.container_inst_id:
                    held.add(rank.container_inst_id)
            held.update(str(p.get("node", "")) for p in other.placement.values())
        return held

    def _requeue(self, job: Job, ranks: list[Rank], why: str) -> Outcome:
        item = self.deps.repo.get_job_item(job.job_id) or {}
        order = relocated_queue_order(int(item.get("priority") or 0),
                                      float(item.get("submitted_at") or job.created_at), job.job_id)
        relocation = {"at": clock.now(), "attempt": job.attempt, "reason": why[:500],
                      "from": {str(r.rank): r.container_inst_id for r in ranks}}
        if not self.deps.repo.requeue_for_relocation(
                job, queue_order=order, relocation=relocation,
                reason=f"relocation: back in the queue at the head of its priority ({why})"):
            return Outcome("duplicate", job.job_id)
        self.deps.metrics.add_metric("Relocations", "Count", 1)
        fresh = self.deps.repo.get_job(job.job_id) or job
        self.ranks.notify(
            fresh, None, NotificationKind.RELOCATED, "Job relocated to healthy nodes",
            what_happened=why,
            what_was_done=("Job back in the queue ahead of every job of its priority (original queue "
                           "position kept); the scheduler starts every rank on healthy nodes with a new "
                           "MASTER_ADDR"),
            operator_action="Nothing for the job; look after the faulty node.",
            # Still the fault's attempt: the scheduler starts the next one.
            details=self._fault_lines(fresh, fresh.attempt))
        return Outcome("relocated", job.job_id, {"via": "queue", "from": relocation["from"]})

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
        self.ranks.notify(
            job, None, NotificationKind.RECOVERED, "Job recovered and restarted",
            what_happened=job.last_error or "suspected GPU fault",
            what_was_done=f"{self._what_was_done(job)}; all {job.world_size} ranks restarted as attempt "
                          f"{job.attempt}",
            operator_action="Nothing; watch the job. Repeated faults on the same node escalate it to "
                            "replacement automatically.",
            details=self._fault_lines(job, job.attempt - 1),
        )
        return Outcome("restarted", job.job_id, {"attempt": job.attempt, "tasks": launched})

    @staticmethod
    def _what_was_done(job: Job) -> str:
        done = []
        checked = sorted(i for i, v in job.verdicts.items() if (v or {}).get("source") != "fast path")
        if checked:
            done.append(f"DCGM health check of {', '.join(checked)}")
        fast = sorted(i for i, v in job.verdicts.items() if (v or {}).get("source") == "fast path")
        if fast:
            done.append(f"no DCGM diag for {', '.join(fast)} (definitive evidence)")
        rebooted = sorted(i for i, v in job.suspects.items() if v == SuspectVerdict.REBOOT.value)
        if rebooted:
            done.append(f"reboot of {', '.join(rebooted)}")
        moves = {r: (p.get("from", ""), p.get("node", "")) for r, p in job.placement.items()}
        if any(a != b for a, b in moves.values()):
            done.append(f"relocated {describe_moves(moves)}")
        if not job.suspects and job.restart_reason:
            done.append(f"restart without node action ({job.restart_reason})")
        return "; ".join(done) or "gang restart"

    @staticmethod
    def _fault_lines(job: Job, attempt: int) -> list[str]:
        """The evidence and decision of every node of the fault of ``attempt``."""
        lines: list[str] = []
        for key, record in sorted(job.faults.items()):
            if not key.startswith(f"a{attempt}:") or not isinstance(record, dict):
                continue
            if record.get("evidence"):
                # An older record may not parse: the decision line below still says what happened.
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    lines += Evidence.from_dict(record["evidence"]).render_lines()
            plan = record.get("plan") or {}
            decision = plan.get("decision") or {}
            if plan:
                lines.append(f"Decision for {key.split(':', 1)[1]}: {plan.get('action', '?')} "
                             f"({decision.get('reason', '')})")
        return lines

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
            target = job.placement.get(str(rank.rank)) or {}
            node_arn = str(target.get("arn") or rank.container_instance_arn or rank.container_inst_id)
            ec2_id = str(target.get("ec2") or rank.ec2_instance_id) if target else rank.ec2_instance_id
            found = self.deps.ecs.tasks_started_by(started_by) if retaken else []
            task_arn = found[0] if found else self._start_rank(rank, attempt, started_by, node_arn)
            if task_arn is None:
                self._fail_restart(job, rank, attempt)
                return None
            self.ranks.register_rank(RankRegistration(
                job_id=job.job_id, rank=rank.rank, world_size=job.world_size, attempt=attempt,
                task_arn=task_arn, task_definition_arn=rank.task_definition_arn,
                container_instance_arn=node_arn, ec2_instance_id=ec2_id,
                overrides=rank.overrides, tags=tags_for_attempt(rank.tags, attempt), group=rank.group,
                started_by=started_by, state=RankState.STARTING, gpus=rank.gpus,
            ))
            launched.append(task_arn)
        return launched

    def _start_rank(self, rank: Rank, attempt: int, started_by: str, node_arn: str) -> str | None:
        for _ in range(self.deps.settings.restart_start_retries):
            result = self.deps.ecs.start_task(
                task_definition=rank.task_definition_arn,
                container_instance_arn=node_arn,
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
