"""Stage 3: reboot (or quarantine) a node, and notice it coming back.

A reboot is issued at most once per verdict: the intent (``reboot_claimed_at``) is
committed before the API call and its answer (``reboot_issued_at``) after it. A reboot
whose answer was lost is re-issued only when the node shows no sign of it (agent never
disconnected, no later boot time) after a grace period; a claim whose own answer was lost is
the same try's again at once (its token passes the claim's condition).

"Back" needs evidence of the reboot (``domain.reboot_evidence``: the host's boot time
later than the request, else an agent outage that an agent update or a blip cannot
explain), judged by event time and version: a stale or redelivered event changes nothing.

While the stack reboots a node, the node carries the custom attribute
``gpu-recovery.rebooting`` (put before the reboot is issued, deleted once the node is back
or given up): the container-instance rule matches only such nodes, so the task starts and
stops of every other node invoke nothing. A mark left behind (its delete failed) is deleted
by the first event it brings; one lost (a stale event's delete raced a new reboot's put) is
put again by the sweep, which judges REBOOTING nodes every minute from ECS anyway.

:class:`NodeActionGate` is the blast-radius breaker every automatic reboot, replacement
and quarantine asks first (node decisions, timed-out reboots and health checks, nodes
lost with their agent disconnected), its answer written in the caller's transaction: it
lives in ``recovery.breaker.gate``; ``Reboots.gate`` is the one the stages share.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.adapters.errors import refused
from gpu_recovery.constants import (
    CLAIM_LEASE_SECONDS,
    REBOOTING_ATTRIBUTE,
    RETRY_INTERVAL_SECONDS,
    NotificationKind,
)
from gpu_recovery.domain import ecs_instance_status as ecs_status
from gpu_recovery.domain import reboot_evidence as evidence
from gpu_recovery.domain.cordon import ECS_PENDING, cordon_record
from gpu_recovery.domain.escalation import (
    NodeFaultRecord,
    fault_summary,
    stored_history_with,
)
from gpu_recovery.domain.fault_vocabulary import Action
from gpu_recovery.domain.models import Instance, Job, container_instance_id
from gpu_recovery.domain.reboot_evidence import AgentEvent, RebootProgress
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.remediation_plan import RemediationPolicy
from gpu_recovery.domain.states import (
    HEALTH_CHECK_STATES,
    RECOVERING_JOB_STATES,
    InstanceState,
    JobState,
    SuspectVerdict,
)
from gpu_recovery.domain.validation import Repair, replacement_watch
from gpu_recovery.events.ecs import EcsContainerInstanceDetail
from gpu_recovery.once_more import claimed_with_token
from gpu_recovery.recovery.breaker.gate import NodeActionGate
from gpu_recovery.recovery.cordons import Cordons
from gpu_recovery.recovery.gang import GangOps
from gpu_recovery.recovery.goodput_metrics import ended
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.recovery.ports import EcsPort, MetricsPort, Outcome, RebootPort, ReplacePort, after_commit
from gpu_recovery.recovery.ranks import RankOperations
from gpu_recovery.recovery.reactions import AgentChanged, NodeBack, Reactions, RestartDue
from gpu_recovery.recovery.stage_data import (
    HasInstances,
    HasJobs,
    MarksNodesBack,
    ReadsNode,
    RecordsNodeDecisions,
)
from gpu_recovery.repository.deadlines import DeadlineIndex
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.node_decisions import JobFailure
from gpu_recovery.repository.reboots import RebootRepository
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

# A reboot call whose answer was lost is repeated only if, this long after it, the node
# still shows no sign of rebooting (an EC2 reboot falls back to a hard reboot after a
# few minutes; an ECS agent disconnects well within this).
REBOOT_CONFIRM_SECONDS = 300


class RebootJobs(Protocol):
    """The jobs waiting for a node."""

    def get_job(self, job_id: str) -> Job | None: ...
    def get_job_item(self, job_id: str) -> dict[str, Any] | None: ...


class RebootData(HasJobs[RebootJobs], HasInstances[ReadsNode],
                 MarksNodesBack, RecordsNodeDecisions, Protocol):
    """The node back, the jobs waiting for it, a node that ran out of time, its deadline pushed."""

    deadlines: DeadlineIndex
    faults: FaultRepository


class DeletesMarks(Protocol):
    def delete_attributes(self, container_instance: str, names: list[str]) -> Any: ...


def unmark_quietly(ecs: DeletesMarks, target: str, name: str) -> str:
    """DeleteAttributes of the custom attribute ``name`` the container-instance rule matches
    (the rebooting mark, a lost node's); a failure leaves the mark, which the next event it
    brings deletes (nothing else depends on it)."""
    try:
        ecs.delete_attributes(target, [name])
    except Exception as error:
        logger.warning("deleting a node's mark failed; its next event deletes it",
                       extra={"instance": target, "mark": name, "error": str(error)})
        return "unmark_failed"
    return "unmarked"


@dataclass(eq=False, repr=False)
class Reboots:
    """``gate``: the breaker every node action asks; ``cordons``: the node attributes kept in sync."""

    data: RebootData
    records: RebootRepository
    ecs: EcsPort
    ranks: RankOperations
    gang: GangOps  # a failed job's ranks stopped
    gate: NodeActionGate
    cordons: Cordons
    notices: Notices  # the outbox
    _: KW_ONLY
    rebooter: RebootPort
    replacer: ReplacePort
    policy: RemediationPolicy
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    settings: Settings
    # Told: a repaired node is back (it validates under load before it is AVAILABLE);
    # with nothing reacting, it is straight back (``mark_available``).
    reactions: Reactions = field(default_factory=Reactions)

    # -------------------------------------------------------------------- issue
    def issue(self, instance: Instance, *, agent_connected: bool | None = None, marked: bool = False) -> str:
        """Reboot a REBOOTING instance unless it is (or may be) rebooting already. The node
        is marked rebooting first (``marked``: the caller saw the mark on it): a reboot whose
        mark could not be put is not issued (the sweep tries again)."""
        now = clock.now()
        progress = evidence.reboot_progress(instance, now=now, lease_seconds=REBOOT_CONFIRM_SECONDS,
                                            agent_connected=agent_connected)
        if progress in (RebootProgress.NOT_ISSUED, RebootProgress.UNCONFIRMED) and not marked:
            self.mark(instance)
        if progress is RebootProgress.NOT_ISSUED:
            claim = self.records.claim
        elif progress is RebootProgress.UNCONFIRMED:
            logger.warning("reboot not confirmed and no sign of it: issuing it again", extra={
                "instance": instance.container_inst_id, "claimed_at": instance.reboot_claimed_at})
            claim = self.records.take_over_claim
        else:
            return progress.value.lower()
        if not claimed_with_token(partial(claim, instance, now)):
            return "raced"
        try:
            path = self.rebooter.reboot(
                self.ranks.ec2_instance_id(instance),
                f"gpu-recovery: {instance.reboot_reason or 'DCGM asked for a reboot'}"[:100])
        except Exception as error:
            if refused(error):  # nothing happened: the next try may issue it
                self.records.release_claim(instance, now, now + RETRY_INTERVAL_SECONDS)
            raise
        self.records.record_issued(instance, path, clock.now(), now + RETRY_INTERVAL_SECONDS)
        self.metrics.add_metric("Reboots", "Count", 1)
        logger.info("reboot requested", extra={"instance": instance.container_inst_id,
                                               "ec2_instance": instance.ec2_instance_id, "via": path})
        return "issued"

    def quarantine(self, instance: Instance) -> None:
        """Drain (idempotent): ECS places nothing new on the instance; then confirm it.
        A replacement by ``terminate_in_asg`` then terminates the instance in its group."""
        fresh = self.data.instances.get_instance(instance.container_inst_id) or instance
        if fresh.drain_pending or not fresh.terminate_pending:
            # Raises (EcsActionFailed) unless ECS confirmed it: the drain is then recorded by
            # the sweep's next try, never before ECS said so.
            self.ecs.drain(fresh.container_instance_arn or fresh.container_inst_id)
            if self.records.record_drained(fresh.container_inst_id, terminate_next=fresh.terminate_pending,
                                           uncordon=fresh.cordoned):
                self.metrics.add_metric("Quarantines", "Count", 1)
                logger.warning("instance quarantined", extra={"instance": fresh.container_inst_id,
                                                              "why": fresh.quarantine_reason})
                if fresh.cordoned:  # DRAINING keeps placements off now: the attribute goes
                    self.cordons.sync_quietly(fresh.container_inst_id)
        if fresh.terminate_pending:
            self.terminate(fresh)

    def terminate(self, instance: Instance) -> str:
        """TerminateInstanceInAutoScalingGroup without decrementing the desired capacity:
        the group launches a new node. The intent (``terminate_claimed_at``) is committed
        first; a claim taken over is looked up (DescribeAutoScalingInstances) before the
        call is repeated; the result is recorded after."""
        now = clock.now()
        retaken = instance.terminate_claimed_at is not None
        if not claimed_with_token(partial(self.records.claim_termination, instance, now,
                                          CLAIM_LEASE_SECONDS)):
            return "in_flight"
        ec2_id = self.ranks.ec2_instance_id(instance)
        found = self.replacer.groups_of([ec2_id]).get(ec2_id) if ec2_id.startswith("i-") else None
        state, group = found if found else (None, "")
        if state is None or state.startswith("Terminat"):
            result = ("terminating in its Auto Scaling group" if state or retaken
                      else "not in an Auto Scaling group: left drained for an operator")
        else:
            try:
                result = self.replacer.terminate_in_asg(ec2_id)
            except Exception as error:
                if refused(error):  # nothing happened: let the next try claim it again
                    logger.warning("termination refused", extra={"instance": ec2_id, "error": str(error)})
                raise
            self.metrics.add_metric("Replacements", "Count", 1)
        now = clock.now()
        # The node the group launches in its place is validated before it takes work.
        watch = replacement_watch(since=now, group=group) \
            if group and self.settings.validation.enabled else None
        self.records.record_termination(instance.container_inst_id, result, now, watch)
        logger.warning("instance replaced", extra={"instance": instance.container_inst_id, "result": result})
        return result

    def finish_quarantine(self, instance: Instance) -> str:
        """The sweep: a quarantine whose drain (or termination) was never confirmed."""
        self.quarantine(instance)
        return "drained"

    def converge_after_verdict(self, instance: Instance) -> Outcome:
        """A verdict event seen again (or a stale one). The reboot or drain it led to is
        finished by the sweep, never here: a concurrent duplicate may still be in that
        call, and the sweep decides from what the node shows."""
        return Outcome("duplicate", detail={"instance": instance.container_inst_id,
                                            "state": instance.state.value})

    # ------------------------------------------------------- the rebooting mark
    def mark(self, instance: Instance) -> None:
        """PutAttributes ``gpu-recovery.rebooting`` (idempotent): the node's events reach the
        instance monitor from now on."""
        self.ecs.put_attributes(instance.container_instance_arn or instance.container_inst_id,
                                     {REBOOTING_ATTRIBUTE: str(int(instance.reboot_requested_at or 0))})

    def unmark_quietly(self, target: str) -> str:
        """DeleteAttributes of the mark once the node is back or given up."""
        return unmark_quietly(self.ecs, target, REBOOTING_ATTRIBUTE)

    # ------------------------------------------------------------- node is back
    def on_container_instance_change(self, detail: EcsContainerInstanceDetail,
                                     event_time: datetime | None = None) -> Outcome:
        inst_id = container_instance_id(detail.containerInstanceArn)
        instance = self.data.instances.get_instance(inst_id)
        if instance is None or instance.state is not InstanceState.REBOOTING:
            lost: Outcome | None = self.reactions.emit(AgentChanged(instance, detail))
            if lost is not None:  # a lost node's ECS agent (recovery.lost_node_checks)
                return lost
            if detail.attribute(REBOOTING_ATTRIBUTE) is not None:  # a mark left behind
                return Outcome(self.unmark_quietly(detail.containerInstanceArn),
                               detail={"instance": inst_id, "why": "not rebooting"})
            return Outcome("ignored", detail={"instance": inst_id, "why": "not rebooting"})
        when = detail.updatedAt or event_time
        event = AgentEvent(status=detail.status, agent_connected=detail.agentConnected,
                           at=when.timestamp() if when else clock.now(), version=detail.version,
                           agent_version=detail.agent_version)
        return self._judge(instance, event)

    def on_boot_reported(self, inst_id: str, boot_time: float) -> Outcome:
        """The node agent reported a boot time: a REBOOTING node that booted after the
        request and whose ECS agent is connected is back, even if its disconnect event
        was never seen."""
        instance = self.data.instances.get_instance(inst_id)
        if instance is None or instance.state is not InstanceState.REBOOTING:
            return Outcome("ignored", detail={"instance": inst_id, "why": "not rebooting"})
        instance.boot_time = max(boot_time, instance.boot_time or 0.0)
        event, _ = self._described(instance)
        if event is None:  # ECS answered MISSING: no word on its agent, nothing to judge on
            return Outcome("ignored", detail={"instance": inst_id, "why": "not described by ECS"})
        return self._judge(instance, event)

    def _described(self, instance: Instance) -> tuple[AgentEvent | None, bool]:
        """The agent as DescribeContainerInstances shows it now (None when ECS answers the
        instance MISSING: its absence is not an agent disconnect), and whether the node
        carries the rebooting mark."""
        described = self.ecs.describe_container_instance(
            instance.container_instance_arn or instance.container_inst_id)
        if described is None:
            return None, False
        marked = any(a.get("name") == REBOOTING_ATTRIBUTE for a in described.get("attributes") or [])
        return AgentEvent(status=str(described.get("status", "")),
                          agent_connected=bool(described.get("agentConnected")),
                          at=clock.now(), version=int(described.get("version") or 0),
                          agent_version=str((described.get("versionInfo") or {}).get("agentVersion") or "")
                          ), marked

    def _judge(self, instance: Instance, event: AgentEvent) -> Outcome:
        inst_id = instance.container_inst_id
        if instance.reset_pending:  # its GPUs are being reset (recovery.gpu_resets), not a reboot
            return Outcome("ignored", detail={"instance": inst_id, "why": "GPU reset in progress"})
        if instance.validating:  # back already, proving itself (recovery.validations)
            return Outcome("ignored", detail={"instance": inst_id, "why": "validating after its repair"})
        if evidence.is_new_disconnect(instance, event):
            self.records.record_agent_disconnected(instance, event.at, event.version, event.agent_version)
            return Outcome("agent_disconnected", detail={"instance": inst_id})
        judged = evidence.judge_return(instance, event, clock.now())
        if judged.back:
            return self._mark_back(instance, judged.why)
        if evidence.is_first_reconnect(instance, event):
            self.records.record_agent_reconnected(instance, event.at, event.version, event.agent_version)
            logger.info("agent reconnected without proof of the reboot",
                        extra={"instance": inst_id, "why": judged.why})
            return Outcome("agent_reconnected", detail={"instance": inst_id, "why": judged.why})
        return Outcome("ignored", detail={"instance": inst_id, "why": judged.why})

    def _mark_back(self, instance: Instance, why: str) -> Outcome:
        return self.node_back(instance, Repair.REBOOT, why)

    def node_back(self, instance: Instance, repair: Repair, why: str, *,
                  reset_result: dict[str, Any] | None = None) -> Outcome:
        """The node is back from ``repair`` (its reboot proven, its GPU reset passed): it
        validates first (``NodeBack``) or is AVAILABLE at once."""
        if self.reactions.handles(NodeBack):
            back: Outcome = self.reactions.emit(NodeBack(instance, repair, why, reset_result))
            return back
        return self.mark_available(instance, repair, why, reset_result=reset_result)

    def mark_available(self, instance: Instance, repair: Repair, why: str, *,
                       reset_result: dict[str, Any] | None = None,
                       validation: dict[str, Any] | None = None) -> Outcome:
        """REBOOTING -> AVAILABLE once, then release (and restart) every job waiting for it
        (``validation``: what their history says of the node's validation, e.g. that it is off)."""
        inst_id = instance.container_inst_id
        now = clock.now()
        if reset_result is not None:
            back = self.data.nodes_back.record_gpu_reset_passed(instance, reset_result, now)
        else:
            back = self.data.nodes_back.mark_instance_back(instance, now)
        if not back:
            return Outcome("duplicate", detail={"instance": inst_id})
        logger.info("instance back", extra={"instance": inst_id, "repair": repair.value, "evidence": why})
        if repair is Repair.REBOOT:
            self.unmark_quietly(instance.container_instance_arn or inst_id)
        if instance.cordoned:  # healthy again: cordon cleared in the same write
            self.cordons.sync_quietly(inst_id)
        restarted = after_commit("release after repair", partial(self.release_waiting, instance,
                                                                 validation=validation))
        return Outcome("instance_available", detail={"instance": inst_id, "restarted": restarted or []})

    def release_waiting(self, instance: Instance, *, validation: dict[str, Any] | None = None) -> list[str]:
        """The node is back: each job waiting for it counts one rebooting node fewer (once,
        with the node letting it go, the node's validation on the job's suspect item: its
        restart's history and e-mail say it), then tries its restart. The sweep finishes this
        for a node left AVAILABLE with waiting jobs."""
        inst_id = instance.container_inst_id
        if validation is None:  # the sweep's: what the node's item says of its last return
            validation = instance.last_validation if self.settings.validation.enabled \
                and instance.last_validation else {"result": "off", "repair": Repair.REBOOT.value}
        restarted = []
        for job_id in sorted(instance.waiting_jobs):
            job = self.data.jobs.get_job(job_id)
            self.data.nodes_back.release_waiting_job(inst_id, job, job_id, validation=validation)
            if job is None:
                continue
            outcome = self.reactions.emit(RestartDue(job_id))
            if outcome is not None and outcome.action in ("restarted", "restarting"):
                restarted.append(job_id)
        self.data.nodes_back.clear_waiting_deadline(inst_id)
        return restarted

    # -------------------------------------------------------------------- sweep
    def sweep(self, instance: Instance, now: float) -> str:
        """Scheduled, every minute while REBOOTING: issue what was never issued, repeat
        what provably did not happen, notice the node back from ECS if its events were
        lost, and give up after the reboot timeout: counted from the reboot's sending (a node
        rebooted late, its reboot refused for a while, has the whole of it to come back), or
        from its request while it was never sent."""
        timeout_at = (instance.reboot_issued_at or instance.reboot_requested_at or now) \
            + self.settings.reboot_timeout_seconds
        out_of_time = now >= timeout_at
        observed, marked = self._described(instance) if out_of_time and instance.reboot_issued_at \
            else (None, False)
        if out_of_time and observed is not None and self._answers(instance, observed):
            # Issue 49: the node is there and its agent answers, but its reboot was never
            # proven (no outage seen, or the agent updated across it): the stack's doubt, not
            # the node's fault. It is asked instead of quarantined: back as from a reboot, its
            # validation after repair (when on) deciding whether it takes work again.
            why = evidence.judge_return(instance, observed, now).why
            self.metrics.add_metric("RebootsUnproven", "Count", 1)
            back = self.node_back(instance, Repair.REBOOT, f"its reboot not proven ({why}); the node answers")
            return "back_unproven" if back.action != "duplicate" else "raced"
        if out_of_time:
            what = "did not come back after its reboot" if instance.reboot_claimed_at is not None \
                else "was not rebooted: every try to send its reboot failed"
            return self.time_out(instance, NotificationKind.REBOOT_TIMEOUT, what,
                                 verdict=SuspectVerdict.TIMEOUT)
        observed, marked = self._described(instance)  # None (MISSING): no word on the agent
        if observed is not None and not marked and instance.reboot_claimed_at is not None:
            self.mark(instance)  # its mark was lost: put again
            marked = True
        issued = self.issue(instance, agent_connected=observed.agent_connected if observed else None,
                            marked=marked)
        fresh = self.data.instances.get_instance(instance.container_inst_id)
        if observed is not None and fresh is not None and fresh.state is InstanceState.REBOOTING \
                and issued != "raced":
            judged = self._judge(fresh, observed)
            if judged.action in ("instance_available", "validating"):
                return "back"
        self.data.deadlines.rearm_instance(instance.container_inst_id, InstanceState.REBOOTING,
                                           min(timeout_at, now + RETRY_INTERVAL_SECONDS))
        return f"rebooting_{issued}"

    @staticmethod
    def _answers(instance: Instance, observed: AgentEvent) -> bool:
        """A rebooting node (not a GPU reset, not validating) whose ECS agent is connected
        and ACTIVE now, and whose node agent, if it reports, says nothing against a reboot."""
        if instance.reset_pending or instance.validating:
            return False
        if not (observed.agent_connected and observed.status == ecs_status.ACTIVE):
            return False
        return instance.boot_time is None or evidence.booted_after_request(instance) \
            or (instance.last_report_at or 0.0) < (instance.reboot_requested_at or 0.0)

    # ----------------------------------------------------------------- timeouts
    def time_out(self, instance: Instance, kind: NotificationKind, what: str, *,
                 verdict: SuspectVerdict, quarantine: bool = True) -> str:
        """The instance's check or reboot ran out of time: the instance leaves recovery and
        every job waiting for it fails, atomically; then drain and notify. A relocatable
        job waiting to restart (its fault already paid for) moves to healthy nodes instead.

        The quarantine is an automatic node action like any other: observe mode
        (``drain=observe``) and the blast-radius breaker may hold it back; the node is then
        marked SUSPECT (no new work; the breaker's hold is kept in its backlog) and the
        node's history records the quarantine as not executed."""
        inst_id = instance.container_inst_id
        job_ids: Iterable[str] = (instance.hc_jobs if instance.state in HEALTH_CHECK_STATES
                                     else instance.waiting_jobs)
        failures, moving, jobs = [], [], []
        for job_id in sorted(job_ids):
            job = self.data.jobs.get_job(job_id)
            if job is None or job.state not in RECOVERING_JOB_STATES:
                continue
            jobs.append(job_id)
            if quarantine and job.state is JobState.PENDING_RESTART and job.relocatable \
                    and job.in_fault:
                moving.append(job_id)
                suspect = self.data.faults.get_suspect(job.job_id, job.attempt, inst_id)
                failures.append(JobFailure(job, f"instance {inst_id} {what}", verdict, moves=True,
                                           suspect_pending=suspect is None or suspect.pending,
                                           suspect_rebooting=suspect is not None and suspect.rebooting))
            else:
                failures.append(JobFailure(job, f"instance {inst_id} {what}", verdict))
        now = clock.now()
        drain, observed, history, blocked, update, tripped = quarantine, False, None, None, None, None
        cordon, cordon_tripped = None, None
        if quarantine:
            cause = f"builtin:{kind.value.replace('_', '-')}"
            observed = not self.policy.modes.executes(Effect.DRAIN)
            # Known bad from now on: drained, or (breaker, observe mode) cordoned.
            answer = self.gate.decide(node=inst_id, action=None if observed else Action.REPLACE.value,
                                      job_ids=jobs, reason=f"instance {what}", now=now,
                                      cordon_unless_drained=True, drains_if_allowed=True)
            update, tripped = answer.update, answer.tripped
            decided = answer.breaker
            if observed or (decided is not None and not decided.allowed):
                drain = False
            if decided is not None and not decided.allowed:
                blocked = {"action": Action.REPLACE.value, "at": now, "reason": decided.reason[:300],
                           "rule": cause, "jobs": jobs, "quarantine_only": True}
            cordon = answer.cordon_record(cause=cause, reason=f"instance {what}", now=now)
            if drain and cordon is None:  # cordoned until ECS has its DRAINING (record_drained)
                cordon = cordon_record(cause=cause, reason=f"instance {what}", now=now, ecs=ECS_PENDING)
            if answer.cordon is not None and answer.cordon.tripped_now:
                cordon_tripped = answer.cordon
            record = NodeFaultRecord(at=now, cause=cause, action=Action.REPLACE, executed=drain,
                                     evidence=fault_summary(None, note=f"instance {what}"))
            history = stored_history_with(instance.fault_history, record, now, self.policy.escalation)
        if blocked is not None:
            done = "; instance marked SUSPECT: the blast-radius breaker held its quarantine back"
        elif observed:
            done = "; instance marked SUSPECT (observe mode: would have drained it)"
        else:
            done = "; instance drained (DRAINING)" if drain else "; instance marked SUSPECT"
        notices = [self.gate.tripped_notice(tripped, inst_id) if tripped is not None else None,
                   self.cordons.limit_tripped_notice(cordon_tripped, inst_id, f"instance {what}")
                   if cordon_tripped is not None else None]
        for failure in failures:
            if not failure.moves:
                failed = replace(failure.job, state=JobState.FAILED, last_error=failure.reason[:1000])
                notices.append(self.notices.for_job(
                    failed, instance, kind, f"Job failed: instance {what}",
                    what_happened=f"Instance {inst_id} {what}", what_was_done="Job marked FAILED" + done,
                    operator_action="Check the instance (console, SSM, ECS agent log); repair or replace "
                                    "it, then resubmit the job."))
        if observed and not any(not f.moves for f in failures):
            notices.append(self.notices.for_node(
                NotificationKind.OBSERVED, f"Observe mode: instance {what}, not drained",
                container_inst_id=inst_id, instance_id=instance.ec2_instance_id,
                what_happened=f"Instance {inst_id} {what}", what_was_done="Nothing" + done,
                operator_action="Check the instance and drain it by hand if it is faulty."))
        if not self.data.decisions.time_out_instance(instance, quarantine=drain, what=what, failures=failures,
                                                     fault_history=history, breaker_blocked=blocked,
                                                     breaker=update, cordon=cordon,
                                                     also=self.notices.owe(notices, now)):
            return "raced"
        self.notices.send(notices)
        if tripped is not None:
            self.gate.tripped(tripped)
        if cordon_tripped is not None:
            self.cordons.limit_tripped(cordon_tripped, inst_id)
        failed_jobs = [f.job.job_id for f in failures if not f.moves]
        self.metrics.add_metric("Failures", "Count", len(failed_jobs))
        for job_id in failed_jobs:
            ended(self.metrics, self.data.jobs, job_id, True)
        after_commit("timed-out instance", self._after_time_out, instance, cordon is not None, drain, moving,
                     failed_jobs)
        return kind.value

    def _after_time_out(self, instance: Instance, cordoned: bool, drain: bool, moving: list[str],
                        failed_jobs: list[str]) -> None:
        """After the commit: the cordon's attribute, the drain, relocations and stops (each
        with its own intent and deadline: the sweep finishes what fails here)."""
        inst_id = instance.container_inst_id
        if instance.state is InstanceState.REBOOTING:  # given up: its events matter no more
            self.unmark_quietly(instance.container_instance_arn or inst_id)
        if cordoned:
            self.cordons.sync_quietly(inst_id)
        if drain:
            self.quarantine(instance)
        for job_id in moving:
            self.reactions.emit(RestartDue(job_id))  # the instance is unusable now: relocation
        for job_id in failed_jobs:
            job = self.data.jobs.get_job(job_id)
            if job is not None:
                with contextlib.suppress(Exception):  # the sweep sends an unsent stop intent
                    self.gang.stop(job)
