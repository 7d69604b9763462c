"""Act on AWS's own notices that capacity goes away (docs/aws-notices.md).

The instance monitor receives them (``event_patterns.ec2_notice_pattern`` /
``health_notice_pattern``); for each node of this cluster a notice names:

* the node is taken out of new placement **at once**: its cordon, of its own kind (the
  ``gpu-recovery.unavailable`` value ``aws-notice``, the reason the notice's), committed with the
  notice itself (the intent) and the operator's ``capacity_notice`` e-mail in one transaction;
  a node already cordoned keeps its cordon. Cordoned, it is never chosen as a spare, a reserved
  node or a relocation target (``domain.placement``);
* **busy**: each queue job on it is asked to checkpoint and move (the ``moved`` suspend of the
  driver warnings, ``recovery.suspension``) at once, with until the stop margin before the
  deadline to call go_suspend(); one that has not by then is stopped (its ranks SIGTERM'd, the
  job back at the head of its queue), so no rank is still there when AWS takes the node. A job
  whose capacity is gone and that cannot be placed elsewhere waits in the queue with the notice
  as its reason, never FAILED. A tag-registered job has no control channel: a relocatable one
  runs until ``stop_at`` (at once on a Spot warning), then its ranks are stopped and it is
  relocated as a fault of its own that spends no budget (the node ``UNAVAILABLE`` for it: no
  check, no node action); one that cannot move keeps running and is told;
* **idle**: left out of service until the window. At the deadline the sweep counts the jobs
  that were still there (they crash with the node); after a maintenance window (reboot,
  system maintenance) the node returns: the notice and its cordon go.

Every step is a conditional write on the notice's key: a duplicate or replayed event, a
retried delivery, or the sweep after a delivery died finds the step done and goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from functools import partial
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from gpu_recovery import clock
from gpu_recovery.adapters.ecs import EcsActionFailed
from gpu_recovery.constants import NOTICE_RETRY_SECONDS, RECOVERY_SWEEP_RATE_SECONDS, NotificationKind
from gpu_recovery.domain import goodput, placement
from gpu_recovery.domain.aws_notices import (
    DRAINED_KINDS,
    NOTICE_FAULT,
    STOP_MARGIN_SECONDS,
    Notice,
    NoticeKind,
    iso,
    move_bound,
    next_look,
    owes_drain,
    parse_notice,
    stop_due,
)
from gpu_recovery.domain.cordon import ECS_PENDING, cordon_record
from gpu_recovery.domain.gpu_warnings import asked, job_entry
from gpu_recovery.domain.models import Instance, Job, Rank
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.remediation_plan import RemediationPolicy
from gpu_recovery.domain.states import ACTIVE_JOB_STATES, JobState, RankState, system_stop_reason
from gpu_recovery.domain.time_sharing import SuspendKind, suspend_record
from gpu_recovery.once_more import twice
from gpu_recovery.recovery.cordons import Cordons
from gpu_recovery.recovery.deadline_calls import TaskStopper, stop_first
from gpu_recovery.recovery.notices import Notices, Owed
from gpu_recovery.recovery.ports import (
    ListsContainerInstances,
    MetricsPort,
    Outcome,
    after_commit,
)
from gpu_recovery.recovery.reactions import Reactions, reserved_first
from gpu_recovery.recovery.stage_data import HasInstances, HasJobs, ReadsJob, ReadsNode, ReadsNodeItems
from gpu_recovery.repository.aws_notices import AwsNoticeRepository
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

#: a rank asked to stop and still on the node after this long is asked again (StopTask is idempotent)
RESTOP_AFTER_SECONDS = 20
#: ECS's cluster query language takes a list after ``in``; ids per ListContainerInstances filter
IDS_PER_QUERY = 50
#: kinds after whose window the node is back (the others take the instance away for good)
COMES_BACK = (NoticeKind.REBOOT_MAINTENANCE, NoticeKind.MAINTENANCE)
_STARTED = ACTIVE_JOB_STATES | {JobState.SUSPENDING}


class CapacityPort(Protocol):
    def instances_in(self, reservation_id: str) -> list[str]: ...


class NoticeJobs(ReadsJob, Protocol):
    """The jobs on a node AWS gave notice of."""

    def live_ranks_on_instance(self, container_inst_id: str) -> list[Rank]: ...

    def request_rank_stop(self, rank: Rank, why: str, now: float, *, watched: bool = False) -> bool: ...


class NoticeNodes(ReadsNodeItems, ReadsNode, Protocol):
    """The node AWS gave notice of (recorded if the loop never saw it)."""

    def put_instance_if_absent(self, instance: Instance) -> bool: ...


class NoticeData(HasJobs[NoticeJobs], HasInstances[NoticeNodes], Protocol):
    """The node and the jobs on it."""


class NoticeEcs(TaskStopper, ListsContainerInstances, Protocol):
    """The nodes a notice names (found by a query), their drain, and a rank's stop."""

    def drain(self, container_instance_arn: str) -> str: ...


@dataclass(eq=False, repr=False)
class AwsNotices:
    data: NoticeData
    records: AwsNoticeRepository
    ecs: NoticeEcs
    cordons: Cordons  # the attribute put after the commit
    notices: Notices  # the e-mails' outbox
    capacity: CapacityPort | None = None
    _: KW_ONLY
    policy: RemediationPolicy
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    settings: Settings
    # A job moved off the node by a stop (no control channel): its stop intent sent
    # (GangOps.stop); told: its fault seen (its nodes reserved for its restart).
    stop_gang: Callable[[Job], Any] | None = None
    reactions: Reactions = field(default_factory=Reactions)

    # ------------------------------------------------------------------ the event
    def on_event(self, event: dict[str, Any]) -> Outcome:
        notice = parse_notice(event)
        if notice is None:
            logger.warning("AWS notice not understood: dropped", extra={
                "source": event.get("source"), "detail_type": event.get("detail-type")})
            return Outcome("dropped", detail={"why": "not a notice this stack reads"})
        self.metrics.add_metric("AwsNoticesReceived", "Count", 1)
        instance_ids = list(notice.instance_ids)
        if notice.reservation_id:
            if self.capacity is None:
                logger.error("Capacity Block warning: no EC2 client to list its instances",
                             extra={"reservation": notice.reservation_id})
                return Outcome("ignored", detail={"why": "no capacity lookup configured"})
            instance_ids = self.capacity.instances_in(notice.reservation_id)
        nodes = self._nodes(instance_ids)
        done: dict[str, str] = {}
        failed: list[Exception] = []
        for node in nodes:
            inst_id = str(node["containerInstanceArn"]).rsplit("/", 1)[-1]
            done[inst_id] = self._apply_now(notice, inst_id, node, failed)
        if failed:
            raise failed[-1]  # the delivery is retried: the nodes recorded find their key
        logger.warning("AWS notice handled", extra={"kind": notice.kind.value, "key": notice.key,
                                                    "deadline": iso(notice.deadline), "nodes": done})
        return Outcome("aws_notice" if nodes else "aws_notice_no_node_of_this_cluster",
                       detail={"kind": notice.kind.value, "nodes": done, "instances": len(instance_ids)})

    def _apply_now(self, notice: Notice, inst_id: str, node: dict[str, Any], failed: list[Exception]) -> str:
        """The notice on one node, a failed call tried again at once: until it is recorded the
        scheduler may still place work there, and the delivery's retry is a minute away (apply
        is idempotent: the notice's key). One node failing twice holds back no other."""
        try:
            return twice(lambda: self.apply(notice, inst_id, str(node["containerInstanceArn"]),
                                            str(node.get("ec2InstanceId") or ""), clock.now()))
        except (ClientError, BotoCoreError) as error:
            logger.error("AWS notice not recorded on a node: the delivery is retried",
                         extra={"instance": inst_id, "error": str(error)})
            failed.append(error)
        return "failed"

    def _nodes(self, instance_ids: Sequence[str]) -> list[dict[str, Any]]:
        """This cluster's container instances on those EC2 instances (ListContainerInstances
        filtered by ``ec2InstanceId``, DescribeContainerInstances: the others are not ours)."""
        found: list[dict[str, Any]] = []
        ids = sorted(set(instance_ids))
        for start in range(0, len(ids), IDS_PER_QUERY):
            listed = ", ".join(f"'{i}'" for i in ids[start:start + IDS_PER_QUERY])
            query = f"ec2InstanceId in [{listed}]"
            # A node just listed that DescribeContainerInstances answers MISSING (ECS is
            # eventually consistent), or a throttled call, is not given up: asked again at once,
            # then the delivery fails and is retried (a notice of two minutes has no minute to lose).
            found.extend(twice(partial(self.ecs.container_instances, query=query, missing_ok=False),
                               retry_on=(EcsActionFailed, ClientError, BotoCoreError)))
        return found

    # ------------------------------------------------------------------ one node
    def apply(self, notice: Notice, inst_id: str, arn: str, ec2_id: str, now: float) -> str:
        """The notice on one node: recorded with its cordon and e-mail, then its jobs asked."""
        repo = self.data
        repo.instances.put_instance_if_absent(Instance(inst_id, container_instance_arn=arn,
                                                       ec2_instance_id=ec2_id))
        raw = repo.instances.get_instance_item(inst_id) or {}
        current = dict(raw.get("notice") or {})
        if current.get("key") == notice.key:
            recorded = False  # a duplicate delivery, or a retry after the record: the jobs again
        elif current and not _more_urgent(notice, current):
            return "notice_already_more_urgent"
        else:
            cordon = None if repo.instances.instance_from_item(raw).cordoned else {
                **cordon_record(cause=f"aws-notice:{notice.kind.value}", reason=notice.describe(), now=now,
                                ecs=ECS_PENDING), "notice": True}
            busy = sorted({r.job_id for r in repo.jobs.live_ranks_on_instance(inst_id)})
            owed = self._node_notice(notice, inst_id, ec2_id, busy, already_cordoned=cordon is None)
            record = {**notice.as_record(), "jobs": {}}
            replaces = str(current.get("key") or "")
            if not self.records.record_notice(inst_id, record, replaces=replaces, deadline_at=now,
                                              cordon=cordon, version=now, also=self.notices.owe([owed], now)):
                return "raced"
            self.notices.send([owed])
            self.metrics.add_metric("AwsNotices", "Count", 1)
            if cordon is not None:
                after_commit("aws-notice cordon", self.cordons.sync_quietly, inst_id)
            recorded = True
        after = repo.instances.get_instance(inst_id)
        if after is None or after.notice.get("key") != notice.key:
            return "raced"
        live = repo.jobs.live_ranks_on_instance(inst_id)
        asked_now = self._ask_jobs(inst_id, after.notice, live, now)
        if stop_due(_float(after.notice.get("deadline")), now, RECOVERY_SWEEP_RATE_SECONDS):
            # Due already (a Spot warning's two minutes): stopped now, not at the next sweep.
            asked_now += self._stop_and_move(inst_id, after.notice, live, now)
        # A drain it owes is the sweep's, within the minute (the record is fresh: none recorded).
        self._rearm(inst_id, after.notice, live, now, drain_owed=owes_drain(after.notice))
        done = "notice_recorded" if recorded else "notice_again"
        return done + (f"_asked_{asked_now}" if asked_now else "")

    def _ask_jobs(self, inst_id: str, record: dict[str, Any], live: Sequence[Rank], now: float) -> int:
        """Each job with ranks on the node (``live``, read once per step) asked to move, or told."""
        repo = self.data
        count = 0
        stopping = stop_due(_float(record.get("deadline")), now, RECOVERY_SWEEP_RATE_SECONDS)
        for job_id in sorted({r.job_id for r in live}):
            job = repo.jobs.get_job(job_id)
            if job is None or asked(record, job_id, job.attempt) or job.state not in _STARTED:
                continue
            if stopping and self._stoppable(job):
                continue  # stopped and moved now (``_stop_and_move``): told then
            count += self._ask(inst_id, record, job, now)
        return count

    def _ask(self, inst_id: str, record: dict[str, Any], job: Job, now: float) -> int:
        """Ask one job on the node to checkpoint and move (1), or note that it cannot be (0)."""
        modes = self.policy.modes
        key, deadline = str(record["key"]), _float(record.get("deadline"))
        movable = (job.is_queue_job and job.state is JobState.RUNNING and modes.executes(Effect.STOP_TASKS)
                   and modes.executes(Effect.RESTART_JOB))
        why = str(record.get("why") or "AWS notice")
        if movable:
            fallback = self.settings.remediation.warning_checkpoint_seconds or 600
            bound = move_bound(deadline, now, fallback)
            avoid = {"node": inst_id, "rule": f"aws-notice:{record.get('kind')}", "action": "none",
                     "confidence": "announced by AWS", "reason": why[:300], "notice": str(record.get("kind")),
                     "force": deadline is not None}
            if deadline is not None:
                avoid["deadline"] = deadline
            told = (f"AWS notice on {inst_id}: {why}; checkpoint and stop within {int(bound)} s: the job "
                    "restarts elsewhere from that checkpoint")
            suspend = {**suspend_record(SuspendKind.MOVED, told, grace_seconds=int(bound), now=now),
                       "avoid": avoid}
            done = self.records.ask_job_to_leave(inst_id, key, job.job_id, job.attempt,
                                                 job_entry(job.job_id, job.attempt, now, "move"), suspend,
                                                 now + bound,
                                                 f"move requested ({told})")
            if done:
                self.metrics.add_metric("NoticeMovesRequested", "Count", 1)
                logger.warning("job asked to move off a node AWS takes away", extra={
                    "job_id": job.job_id, "instance": inst_id, "bound": int(bound)})
            return int(done)
        owed = None
        if job.state is JobState.RUNNING:
            owed = self._told(inst_id, job, why, deadline)
        entry = job_entry(job.job_id, job.attempt, now, "stays")
        if self.records.note_notice_job(inst_id, key, job.job_id, entry, also=self.notices.owe([owed], now)):
            self.notices.send([owed])
        return 0

    def _stoppable(self, job: Job) -> bool:
        """A job with no control channel the stack moves itself by a stop before the deadline:
        tag-registered, relocatable (every task tagged so), stops and restarts executed."""
        modes = self.policy.modes
        return (not job.is_queue_job and job.relocatable_tags and modes.executes(Effect.STOP_TASKS)
                and modes.executes(Effect.RESTART_JOB))

    def _told(self, inst_id: str, job: Job, why: str, deadline: float | None) -> Owed:
        """The e-mail to the owner of a job that cannot be asked to checkpoint."""
        if self._stoppable(job) and deadline is not None:
            done = ("The job keeps running until shortly before the deadline (its ranks get SIGTERM by "
                    f"{iso(deadline - STOP_MARGIN_SECONDS)}, then SIGKILL after the task's stopTimeout); it "
                    "then restarts on other nodes from its last checkpoint, without spending a recovery")
            action = ("To lose no work, save a checkpoint on SIGTERM, or stop the job at a checkpoint of "
                      f"yours before {iso(deadline)} and start it again: it will not land on this node.")
        else:
            stays = ("it is not a queue job: nothing can ask it to checkpoint, and it is not relocatable"
                     if not job.is_queue_job else "observe mode for stop_tasks / restart_job: the move is "
                                                  "only recorded")
            done = (f"The job keeps running ({stays}); when AWS takes the node, the job's ranks there end "
                    "and the recovery restarts it from its last checkpoint")
            action = ("To lose no work, stop the job at a checkpoint of yours before "
                      f"{iso(deadline)} and start it again: it will not land on this node.")
        return self.notices.for_job(
            job, None, NotificationKind.CAPACITY_NOTICE, "Job runs on a node AWS takes away",
            what_happened=f"AWS announced for node {inst_id}: {why}",
            what_was_done=f"{done}; {inst_id} takes no new work", operator_action=action)

    def _stop_and_move(self, inst_id: str, record: dict[str, Any], live: Sequence[Rank], now: float) -> int:
        """Once due (``stop_at``): each job with no control channel still on the node
        (tag-registered, relocatable) stopped and relocated, as a fault of its own that spends no
        budget. A failed call is tried again at once (a Spot warning leaves no sweep to spare);
        failing twice, the job's deadline has the sweep send its stop. A job that cannot move
        keeps running (its owner was told)."""
        moved = 0
        on_node: dict[str, Rank] = {}
        for rank in live:
            on_node.setdefault(rank.job_id, rank)
        for job_id, rank in sorted(on_node.items()):

            def move(job_id: str = job_id, rank: Rank = rank) -> bool:
                nonlocal moved
                count, settled = self._move_one(inst_id, record, job_id, rank, now)
                moved += count
                return settled

            try:
                settled = twice(move, done=bool)
            except (ClientError, BotoCoreError) as error:
                settled = False
                logger.warning("a call of a job's move off an announced node failed",
                               extra={"job_id": job_id, "instance": inst_id, "error": str(error)})
            if not settled:
                logger.error("job on a node AWS takes not stopped yet: the sweep tries again",
                             extra={"job_id": job_id, "instance": inst_id})
        return moved

    def _move_one(self, inst_id: str, record: dict[str, Any], job_id: str, rank: Rank,
                  now: float) -> tuple[int, bool]:
        """One job off the node: its move committed (one transaction: ``move_job_off_notice``),
        then its nodes reserved for its restart and every rank's stop sent. Each step finds the
        one before done on a retry: the commit is conditioned on the job RUNNING in that
        attempt, the stop intent is sent until recorded sent. Returns (jobs moved now, whether
        nothing is left to do)."""
        repo = self.data
        key, deadline = str(record["key"]), _float(record.get("deadline"))
        job = repo.jobs.get_job(job_id)
        if job is None or job.attempt != rank.attempt or not self._stoppable(job):
            return 0, True
        moved = 0
        if job.state is JobState.RUNNING:
            why = str(record.get("why") or "AWS notice")
            reason = (f"moved off {inst_id} before AWS takes it ({why}): every rank stopped at "
                      f"{iso(now)}; it restarts on other nodes from its last checkpoint, no recovery spent")
            owed = self.notices.for_job(
                job, None, NotificationKind.CAPACITY_NOTICE, "Job moved off a node AWS takes away",
                what_happened=f"AWS announced for node {inst_id}: {why}",
                what_was_done=("Every rank of the job was stopped (SIGTERM, then SIGKILL after the task's "
                               f"stopTimeout) before {iso(deadline)}; it restarts on other nodes from its "
                               "last checkpoint; no recovery was spent"),
                operator_action="None: the restart is automatic (gpujobs show / the recovered e-mail).")
            checkpoint_at = goodput.checkpoint_before(job.checkpoint, now)
            ledger = goodput.fault_marks(fault_at=now, checkpoint_at=checkpoint_at, node=inst_id,
                                         rule=f"aws-notice:{record.get('kind')}")
            entry = job_entry(job_id, job.attempt, now, "stopped")
            if not self.records.move_job_off_notice(inst_id, key, job, rank.rank, entry, reason=reason,
                                                    now=now, deadline_at=now + NOTICE_RETRY_SECONDS,
                                                    ledger=ledger, also=self.notices.owe([owed], now)):
                return 0, False  # raced (or its answer lost): read again
            moved = 1
            job = repo.jobs.get_job(job_id) or job
        unsent = (job.state is JobState.PENDING_RESTART and job.tally.opened_by == NOTICE_FAULT
                  and bool(job.stop_fanout) and not job.stop_fanout.get("sent_at"))
        if unsent:
            stop_first([rank], str(job.stop_fanout.get("why") or "AWS notice"), repo.jobs, self.ecs)
        if moved:
            self.notices.send([owed])
            self.metrics.add_metric("NoticeJobsStopped", "Count", 1)
            logger.warning("job with no control channel stopped before AWS takes its node", extra={
                "job_id": job_id, "instance": inst_id, "deadline": iso(deadline)})
        # Unsent, not moved here: an earlier try died before its reservation. Not reserved: the
        # gang's stop waits (this node's rank is stopped already), sent by the retry or the sweep.
        reserved = not (moved or unsent) or reserved_first(self.reactions, job)
        if unsent and self.stop_gang is not None:
            return moved, reserved and bool(self.stop_gang(job))
        return moved, True

    def _rearm(self, inst_id: str, record: dict[str, Any], live: Sequence[Rank], now: float, *,
               drain_owed: bool) -> None:
        """When the node is looked at again: each minute while jobs run on it (those not asked
        yet are asked; those still there at the deadline are counted); once none does, at the
        end of a maintenance window (the node returns) or never (the capacity goes for good: the
        cordon stays). A rebalance (no date) is left once its jobs were asked."""
        deadline, key = _float(record.get("deadline")), str(record["key"])
        window_end = _float(record.get("window_end"))
        comes_back = record.get("kind") in {k.value for k in COMES_BACK} and window_end is not None
        if deadline is None:
            self.records.settle_notice(inst_id, key)
        elif live or (now < deadline and drain_owed):
            # Jobs to move, or a drain ECS has not confirmed: looked at again within the minute
            # (and when the jobs with no control channel are due to be stopped: ``stop_at``).
            self.records.rearm_notice(inst_id, key, next_look(deadline, now, NOTICE_RETRY_SECONDS,
                                                              RECOVERY_SWEEP_RATE_SECONDS))
        elif comes_back:
            self.records.rearm_notice(inst_id, key, max(deadline, float(window_end or deadline)))
        else:
            self.records.settle_notice(inst_id, key)

    # ------------------------------------------------------------------ the sweep
    def sweep(self, inst_id: str, now: float) -> str:
        """The node's notice is due: jobs not asked yet are asked (a delivery died); at the
        deadline the jobs still there are counted (they crash with the node); after a
        maintenance window the node returns to service."""
        repo = self.data
        instance = repo.instances.get_instance(inst_id)
        if instance is None or not instance.notice:
            return "ignored"
        record = instance.notice
        key, deadline = str(record["key"]), _float(record.get("deadline"))
        if deadline is None or now < deadline:
            try:
                return self._before_deadline(instance, now)
            except (ClientError, BotoCoreError) as error:
                # The next sweep may be past the deadline: tried again at once, on the node read
                # again (the first try may have asked a job; every step is idempotent).
                logger.warning("a call failed: tried again at once", extra={"error": str(error)})
            return self._before_deadline(repo.instances.get_instance(inst_id), now)
        window_end = _float(record.get("window_end"))
        comes_back = record.get("kind") in {k.value for k in COMES_BACK} and window_end is not None
        # Due again after it was settled (a late redelivery of its event re-armed it), the notice is
        # settled again: its first visit's record of the jobs left stays.
        ended = None if record.get("ended_at") else {
            "notice.ended_at": now, "notice.left": self._jobs_left(inst_id)}
        if not comes_back:  # the capacity is gone: the notice and the cordon stay for good
            return "notice_capacity_gone" if self.records.settle_notice(inst_id, key, ended) else "raced"
        if now < (window_end or 0):  # cordoned until the maintenance window's end
            settled = ended is None or self.records.settle_notice(inst_id, key, ended)
            return "notice_window" if settled and self.records.rearm_notice(
                inst_id, key, float(window_end or now)) else "raced"
        uncordon = bool(instance.cordon.get("notice"))
        if self.records.end_notice(inst_id, key, now, uncordon=uncordon):
            if uncordon:
                after_commit("aws-notice uncordon", self.cordons.sync_quietly, inst_id)
            return "notice_window_over"
        return "raced"

    def _jobs_left(self, inst_id: str) -> list[str]:
        """The jobs still on the node at its deadline (they crash with it), counted."""
        left = sorted({r.job_id for r in self.data.jobs.live_ranks_on_instance(inst_id)})
        if left:
            self.metrics.add_metric("NoticeJobsCrashed", "Count", len(left))
            logger.error("jobs still on a node at its AWS deadline",
                         extra={"instance": inst_id, "jobs": left})
        return left

    def _before_deadline(self, instance: Instance | None, now: float) -> str:
        """The sweep's step of a notice whose deadline has not come: its jobs asked (stopped when
        due), its drain done, its next step armed."""
        if instance is None or not instance.notice:
            return "ignored"
        inst_id, record = instance.container_inst_id, instance.notice
        live = self.data.jobs.live_ranks_on_instance(inst_id)  # read once for every step below
        self._stop_again(live, now)
        asked_now = self._ask_jobs(inst_id, record, live, now)
        if stop_due(_float(record.get("deadline")), now, RECOVERY_SWEEP_RATE_SECONDS):
            asked_now += self._stop_and_move(inst_id, record, live, now)
        drained = after_commit("aws-notice drain", self._drain, instance, now)
        self._rearm(inst_id, record, live, now, drain_owed=owes_drain(record) and not drained)
        return "notice_moving_jobs" if asked_now else "notice_waiting"

    def _drain(self, instance: Instance, now: float) -> bool:
        """A Capacity Block's node drained in ECS (``DRAINED_KINDS``), by the sweep (the
        instance monitor that records the notice takes no node action: least privilege): the
        notice is the intent; DRAINING is idempotent; ECS's answer recorded after
        (``notice.drained_at``). Not confirmed (throttled, its answer lost), it is owed: the
        node stays due for the next sweep. Returns whether no drain is owed any more."""
        record = instance.notice
        if not owes_drain(record):
            return True
        self.ecs.drain(instance.container_instance_arn or instance.container_inst_id)
        if not self.records.record_notice_drained(instance.container_inst_id, str(record["key"]), now):
            return False
        logger.warning("node drained: AWS takes its capacity", extra={
            "instance": instance.container_inst_id, "notice": record.get("kind")})
        return True

    def _stop_again(self, live: Sequence[Rank], now: float) -> None:
        """A moving job's rank on the node asked to stop whose stop was not confirmed (a throttled
        StopTask, a lost answer): asked again now, not at the gang stop's paced re-ask (minutes):
        the node goes at the deadline. Moving: a queue job suspending to move, or a job with no
        control channel stopped to move (``_stop_and_move``)."""
        repo = self.data
        for rank in live:
            asked_at = rank.stop_requested_at or now
            if rank.state is not RankState.STOP_REQUESTED or asked_at > now - RESTOP_AFTER_SECONDS:
                continue
            job = repo.jobs.get_job(rank.job_id)
            if job is None or job.attempt != rank.attempt or not _moving_off_notice(job):
                continue
            why = str(job.stop_fanout.get("why") or "suspended: AWS takes the node")
            self.ecs.stop_task_before_deadline(rank.task_arn, system_stop_reason(why))
            logger.warning("rank on a node AWS takes away asked to stop again", extra={
                "job_id": job.job_id, "rank": rank.rank, "instance": rank.container_inst_id})

    # ------------------------------------------------------------------ e-mails
    def _node_notice(self, notice: Notice, inst_id: str, ec2_id: str, busy: list[str], *,
                     already_cordoned: bool) -> Owed:
        kept = ("it was cordoned already and stays so" if already_cordoned else
                f"it takes no new work from now (placement attribute {placement.UNAVAILABLE_ATTRIBUTE}="
                f"{placement.NOTICE}) and is never chosen as a spare or relocation target")
        jobs = (f"its job(s) {', '.join(busy[:10])} are asked to checkpoint and move (a queue job that "
                f"has not "
                f"by {iso(notice.deadline - 45) if notice.deadline is not None else 'then'} is stopped and "
                "requeued at the head of its priority; a tag-registered one keeps running and is told)"
                if busy else "no job runs on it")
        after = ("it returns to service after the window" if notice.kind in COMES_BACK
                 else "it is drained in ECS (DRAINING: no scheduler places on it) and stays cordoned: AWS "
                      "takes the instance" if notice.kind in DRAINED_KINDS
                 else "it stays cordoned: AWS takes the instance")
        return self.notices.for_node(
            NotificationKind.CAPACITY_NOTICE,
            f"AWS takes a GPU node away: {notice.kind.value.replace('_', ' ')}",
            container_inst_id=inst_id, instance_id=ec2_id,
            what_happened=f"AWS announced for {ec2_id or inst_id}: {notice.describe()}",
            what_was_done=f"The node: {kept}; {jobs}; {after}",
            operator_action=("None required: queue jobs move by themselves at their checkpoint and resume "
                             "elsewhere when capacity exists. To return a node that stays cordoned: "
                             "gpu-recovery-admin uncordon."),
            details=[f"notice key: {notice.key}", f"deadline: {iso(notice.deadline)}"])


def _moving_off_notice(job: Job) -> bool:
    return ((job.state is JobState.SUSPENDING and bool((job.suspend.get("avoid") or {}).get("notice")))
            or (job.state is JobState.PENDING_RESTART and job.tally.opened_by == NOTICE_FAULT))


def _more_urgent(new: Notice, current: dict[str, Any]) -> bool:
    """A later notice replaces the node's when it takes the node sooner (a 2-minute warning
    after a scheduled retirement) or the current one has no date."""
    old = _float(current.get("deadline"))
    return new.deadline is not None and (old is None or new.deadline < old)


def _float(value: Any) -> float | None:
    return float(value) if value is not None else None
