"""A fault the stack's own check could not diagnose (issue 49: missing evidence is not bad
evidence).

A DCGM check that gave no verdict by its timeout (its STOPPED event lost and its log line
unreadable, a check that hung) or that could not start (placement refused, no slot in time)
says nothing about the node: the check's failure is the stack's own. The node leaves its check
as it was before it (AVAILABLE, its suspect fence answered, nothing in its fault history), an
operator is e-mailed, and each waiting job goes on as its fault's tally says (restart, or
relocate when another node of the fault was found unusable) without spending any budget. A
node that is really faulty fails its job again: the next check judges it.

A node ECS reads with its agent disconnected when its check ends so (ECS refused to place
the check, AGENT, or lost its task) is no node to go back to: it leaves its check SUSPECT with the
lost node's origin instead, a suspect for the stack's own check and no more (nothing in its
history, nothing for the breaker), which runs when its agent reconnects and returns it
(``recovery.lost_node_checks``). A missing answer from ECS leaves it AVAILABLE as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.constants import NotificationKind
from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.models import LOST_NODE_ORIGIN, Instance, Job
from gpu_recovery.domain.remediation_plan import RemediationPlan, undiagnosed
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.recovery.lost_node_checks import LOOK_SECONDS, MarksNodes, mark_quietly
from gpu_recovery.recovery.notices import Owed
from gpu_recovery.recovery.ports import MetricsPort, after_commit
from gpu_recovery.recovery.remediation.node_decision import NodeRemediation
from gpu_recovery.recovery.stage_data import HasInstances, HasJobs, ReadsJob, ReadsNodeItems
from gpu_recovery.repository.node_decisions import SuspectFlag


class CheckReads(HasJobs[ReadsJob], HasInstances[ReadsNodeItems], Protocol):
    """The node and the jobs waiting for its check, read again before each try."""


def settle_undiagnosed(data: CheckReads, metrics: MetricsPort, remediation: NodeRemediation,
                       evidence_of: Callable[[Instance, dict[str, Any], list[Job]], Evidence],
                       instance: Instance, what: str, *, agent_away: MarksNodes | None = None) -> bool:
    """End ``instance``'s check without a verdict (``what``: why there is none); False when it
    moved on meanwhile or kept losing races. ``evidence_of``: the fault's evidence as the
    check's verdict would have read it; ``agent_away``: ECS reads the node's agent
    disconnected (the port its lost-node mark is put through)."""
    inst_id = instance.container_inst_id
    away = f"{inst_id}'s ECS agent is disconnected: flagged SUSPECT (no new queue work) until it " \
           "reconnects and the stack's own check passes it"
    flag = SuspectFlag(f"{away}; {what}", LOST_NODE_ORIGIN, clock.now() + LOOK_SECONDS) \
        if agent_away is not None else None
    for _ in range(3):  # a job that joined meanwhile: read and decide again
        raw = data.instances.get_instance_item(inst_id)
        if raw is None:
            return False
        instance = data.instances.instance_from_item(raw)
        if instance.state not in (InstanceState.HEALTH_CHECKING, InstanceState.HEALTH_CHECK_PENDING):
            return False
        jobs = [j for j in (data.jobs.get_job(job_id) for job_id in sorted(instance.hc_jobs)) if j]
        now = clock.now()
        evidence = evidence_of(instance, raw, jobs)
        reason = f"the stack's DCGM check of {inst_id} gave no verdict: {what}"
        plan = undiagnosed(remediation.plan(evidence, raw, now=now), reason)
        checking = instance.state is InstanceState.HEALTH_CHECKING
        findings: dict[str, Any] = {"verdict": "undiagnosed", "reason": what[:300]}
        if instance.check.task_arn:
            findings["task_arn"] = instance.check.task_arn

        def operator_notice(after: Instance, _plan: RemediationPlan) -> Owed:
            flagged = after.state is InstanceState.SUSPECT
            return remediation.notices.for_node(
                NotificationKind.HEALTH_CHECK_TIMEOUT,
                f"Health check gave no verdict: {inst_id} "
                + ("flagged SUSPECT, its ECS agent disconnected" if flagged else "left as it was"),
                container_inst_id=inst_id, instance_id=after.ec2_instance_id,
                what_happened=f"Instance {inst_id}: {what}",
                what_was_done=(away if flagged else f"{inst_id} back in service")
                + "; the jobs that waited for the check go on without spending a recovery",
                operator_action="Look at why the stack's check could not give a verdict (the check's task "
                                "and log, the recovery functions' errors and dead-letter queues); check the "
                                "node by hand if its jobs fail again.")

        applied = remediation.apply(
            instance, raw, plan, evidence, jobs, from_states=(instance.state,),
            hc_started_by=instance.check.started_by if checking else None,
            hc_jobs_count=len(instance.hc_jobs),
            findings=findings, node_notice=operator_notice, suspect=flag)
        if applied is not None:
            metrics.add_metric("HealthChecksUndiagnosed", "Count", 1)
            if agent_away is not None:  # flagged: its events reach the instance monitor by the mark
                after_commit("lost-node mark", mark_quietly, agent_away, instance)
            return True
    return False
