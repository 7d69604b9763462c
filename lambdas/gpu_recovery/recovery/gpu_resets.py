"""Stage 3a: reset a node's GPUs (the catalog's ``reset_gpu``) before rebooting it.

A node decision of ``reset_gpu`` leaves the node REBOOTING with ``reset_pending``: every
job waiting for it counts it decided and waits as for a reboot (restart once it is back),
and the breaker counted it as a remediation when the decision was taken. This stage then:

1. waits until no rank holds the node's GPUs (``nvidia-smi -r`` refuses a GPU in use);
2. **claims** the reset (``reset_started_by``, deterministic per node and decision) before
   StartTask of the privileged reset task on that container instance; a claim taken over
   (its claimer died, or StartTask's answer was lost) looks the task up by startedBy first;
3. records the task's ARN, and learns the result from its STOPPED event (exit 0: the
   reset and a short DCGM diag passed; anything else: failed);
4. passed: the node is back (REBOOTING -> AVAILABLE, the write a node back from its reboot
   makes) and its waiting jobs restart as after a healthy reboot; failed, could not be
   placed, lost or out of time: the decision becomes today's reboot (a new reboot request,
   recorded in the node's history so reboot -> replace counts it) and an operator e-mail is
   owed in the same transaction.

The instance keeps a deadline the sweep reaches at every step (waiting for GPUs, a claim,
a running task: ``sweep``), so a reset whose result event was lost is read from
DescribeTasks, at its time limit too, and one that never ends is stopped and replaced by the
reboot. That reboot is no verdict on the node: it is the repair its fault called for, by the
heavier means a reset was tried before (the catalog's reset -> reboot ladder), recorded
because it was done.
"""

from __future__ import annotations

import logging
from dataclasses import KW_ONLY, dataclass
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.constants import (
    RETRY_INTERVAL_SECONDS,
    NotificationKind,
    system_stop_reason,
)
from gpu_recovery.domain import started_by as task_started_by
from gpu_recovery.domain.escalation import (
    EscalationPolicy,
    NodeFaultRecord,
    fault_summary,
    stored_history_with,
)
from gpu_recovery.domain.fault_vocabulary import Action
from gpu_recovery.domain.models import GPU_RESET_TASK, Instance, container_instance_id
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.domain.validation import Repair
from gpu_recovery.events.ecs import EcsTaskDetail
from gpu_recovery.recovery import node_tasks
from gpu_recovery.recovery.node_tasks import NodeTasks
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.recovery.ports import MetricsPort, Outcome, StopsTasks, after_commit
from gpu_recovery.recovery.reboots import Reboots
from gpu_recovery.repository.gpu_resets import GpuResetRepository
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)


def gpu_reset_started_by(instance: Instance) -> str:
    """Deterministic per node and decision (its reboot request): the same claim finds its task."""
    return task_started_by.node_task(task_started_by.GPU_RESET, instance.container_inst_id,
                                     instance.reboot_requested_at)


def resetting(instance: Instance | None) -> bool:
    """A REBOOTING node whose GPU reset has not ended yet (this stage's, not the reboot's)."""
    return instance is not None and instance.state is InstanceState.REBOOTING and instance.reset_pending


class GpuResetData(Protocol):
    """The node the GPU reset reads."""

    def get_instance(self, container_inst_id: str) -> Instance | None: ...
    def get_instance_item(self, container_inst_id: str) -> dict[str, Any] | None: ...


@dataclass(eq=False, repr=False)
class GpuResets:
    data: GpuResetData
    records: GpuResetRepository
    ecs: StopsTasks
    tasks: NodeTasks
    reboots: Reboots
    notices: Notices
    _: KW_ONLY
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    settings: Settings
    escalation: EscalationPolicy

    def deadline(self, instance: Instance) -> float:
        """The reset's time limit from its decision: then the reboot instead."""
        return (instance.reboot_requested_at or clock.now()) + self.settings.gpu_reset_timeout_seconds

    # -------------------------------------------------------------------- start
    def start(self, instance: Instance) -> str:
        """Start the reset task once the node's GPUs are free; finish a dead claim."""
        if not resetting(instance):
            return "not_resetting"
        return self.tasks.claim_and_start(node_tasks.GPU_RESET, self, instance)

    @staticmethod
    def new_started_by(instance: Instance) -> str:
        return gpu_reset_started_by(instance)

    def start_task(self, instance: Instance, started_by: str) -> str:
        placed = self.tasks.start_claimed(node_tasks.GPU_RESET, self, instance, started_by)
        if placed.task_arn is not None:
            return "gpu_reset_started"
        why = f"the GPU reset task could not be placed ({placed.reasons})"
        now = clock.now()
        if now + RETRY_INTERVAL_SECONDS < self.deadline(instance):
            # ECS placed nothing (its GPUs not released yet, the agent away: the failures in
            # its 200): tried again as a refused call is, a reboot only once time is up.
            self.tasks.release(node_tasks.GPU_RESET, instance, started_by, now + RETRY_INTERVAL_SECONDS)
            logger.warning("GPU reset task not placed; tried again", extra={
                "instance": instance.container_inst_id, "why": why})
            return "gpu_reset_not_placed"
        return self.fall_back(instance, why)

    # ------------------------------------------------------------------- result
    def on_stopped(self, detail: EcsTaskDetail) -> Outcome:
        """The reset task stopped: its exit code is the result (0: reset and diag passed)."""
        if not self.tasks.runs_our_definition(node_tasks.GPU_RESET, detail):
            return Outcome(node_tasks.FOREIGN_TASK, detail={"task": detail.taskArn})
        inst_id = container_instance_id(detail.containerInstanceArn or "")
        instance = self.data.get_instance(inst_id) if inst_id else None
        if instance is None:
            return Outcome("ignored", detail={"why": "untracked instance"})
        claimed = instance.task(GPU_RESET_TASK).started_by
        if not resetting(instance) or not claimed or detail.startedBy != claimed:
            return Outcome("duplicate", detail={"instance": inst_id, "state": instance.state.value})
        exit_code = detail.exit_code()
        result = {"task_arn": detail.taskArn, "exit_code": exit_code, "at": clock.now(),
                  "stopped_reason": (detail.stoppedReason or "")[:300]}
        if exit_code == 0:
            return Outcome(self._passed(instance, result), detail={"instance": inst_id})
        why = (f"the GPU reset task exited {exit_code}" if exit_code is not None
               else "the GPU reset task stopped without an exit code "
                    f"({detail.stoppedReason or 'no reason'})")
        return Outcome(self.fall_back(instance, why, result=result), detail={"instance": inst_id})

    def _passed(self, instance: Instance, result: dict[str, Any]) -> str:
        """The node is back, as after a reboot: validated first (``Reboots.node_back``)."""
        back = self.reboots.node_back(instance, Repair.GPU_RESET, "GPU reset and its diag passed",
                                      reset_result={**result, "result": "passed"})
        if back.action == "duplicate":
            return "duplicate"
        self.metrics.add_metric("GpuResets", "Count", 1)
        logger.info("GPU reset passed", extra={"instance": instance.container_inst_id, "next": back.action})
        return "gpu_reset_passed"

    def fall_back(self, instance: Instance, why: str, *, result: dict[str, Any] | None = None) -> str:
        """Today's reboot instead, with its e-mail, in one conditional write; then issue it."""
        repo = self.data
        inst_id = instance.container_inst_id
        now = clock.now()
        raw = repo.get_instance_item(inst_id) or {}
        plan = dict((raw.get("last_fault") or {}).get("plan") or {})
        cause = str((plan.get("decision") or {}).get("rule_id") or "gpu-reset-failed")
        record = NodeFaultRecord(at=now, cause=cause, action=Action.REBOOT, executed=True,
                                 evidence=fault_summary(None, note=f"GPU reset failed: {why}"))
        history = stored_history_with(raw.get("fault_history"), record, now, self.escalation)
        notice = self.notices.for_node(
            NotificationKind.GPU_RESET_FAILED, f"GPU reset failed on {inst_id}: rebooting it instead",
            container_inst_id=inst_id, instance_id=instance.ec2_instance_id,
            what_happened=f"The GPU reset of instance {inst_id} failed: {why}",
            what_was_done="The node is rebooted instead (the usual reboot flow); the jobs waiting for it "
                          "restart once it is back",
            operator_action="None if the reboot brings it back. Read the reset task's log (nvidia-smi -r, "
                            "dcgmi diag) for why the reset failed; a node whose resets keep failing is "
                            "rebooted, then replaced, by escalation.")
        reason = f"reboot: GPU reset failed ({why})"
        if not self.records.fall_back_to_reboot(
                instance, result={**(result or {}), "result": "failed", "why": why[:300], "at": now},
                reason=reason, fault_history=history, now=now, deadline_at=now + RETRY_INTERVAL_SECONDS,
                also=self.notices.owe([notice], now)):
            return "raced"
        self.notices.send([notice])
        self.metrics.add_metric("GpuResetFallbacks", "Count", 1)
        logger.warning("GPU reset failed: rebooting instead", extra={"instance": inst_id, "why": why})
        fresh = repo.get_instance(inst_id)
        if fresh is not None and fresh.state is InstanceState.REBOOTING and not fresh.reset_pending:
            after_commit("reboot after failed reset", self.reboots.issue, fresh)
        return "gpu_reset_failed"

    # -------------------------------------------------------------------- sweep
    def sweep(self, instance: Instance, now: float) -> str:
        """Scheduled while the reset is pending: start what never started, read a result
        whose event was lost, and fall back to the reboot once out of time."""
        if now < self.deadline(instance):
            return self.tasks.follow(node_tasks.GPU_RESET, self, instance, now)
        if task_arn := instance.task(GPU_RESET_TASK).task_arn:
            # ECS asked first (a DescribeTasks failing raises: decided on the next visit): a
            # reset that ended, its STOPPED event lost, is judged by its exit code, so one that
            # passed is no reboot (a reboot in the node's history counts toward its replacement).
            task = self.tasks.look(task_arn)
            if task is not None and task.get("lastStatus") == "STOPPED":
                return self.on_stopped(EcsTaskDetail.model_validate(task)).action
            if task is not None:
                self.ecs.stop_task(task_arn, system_stop_reason("GPU reset timed out"))
        return self.fall_back(instance, "the GPU reset did not finish in time")

    def gone(self, instance: Instance) -> str:
        return self.fall_back(instance, "the GPU reset task is gone (ECS no longer knows it)")
