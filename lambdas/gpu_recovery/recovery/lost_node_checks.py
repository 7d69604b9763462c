"""A lost node flagged SUSPECT on a missing answer: the stack's own check once its ECS agent is back.

The heartbeat's lost-node escalation flags a node SUSPECT when its ECS agent stayed
disconnected while its node agent kept reporting (``recovery.remediation.node_unreachable``,
``suspect_origin`` LOST_NODE_ORIGIN): a missing answer, which may make the node a suspect for
the stack's own check, never hold it alone. The flag's write gives the sweep a deadline, and
after it the node carries the custom attribute ``gpu-recovery.lost-node`` (the
container-instance rule matches it: ``event_patterns.container_instance_pattern``).

When its ECS agent reconnects (the event: ``agentConnected`` and ACTIVE; or the sweep's
DescribeContainerInstances, which finds a reconnect whose event came before the mark or was
lost), the stack runs its own check: the validation task, with the lifecycle of a validation
after repair (``recovery.validations``: the claim, StartTask, the result), on the node, which
stays SUSPECT meanwhile (``Repair.RECONNECT``), cordoned ``validating`` by the write that opens
it (``domain.cordon.check_cordon``: every other scheduler keeps off it too). It runs even when
the host never stopped reporting: ECS's state recovered, the stack verifies the GPUs itself.
Once per flag: the check is opened by a write conditional on no check open and on the flag
being the lost node's, so a redelivered or late event starts nothing more.

* passed: AVAILABLE, its cordon cleared, as a passed validation;
* failed (a DCGM verdict): no failed repair (none was made) and no node decision: the node
  stays SUSPECT for a person, now for its check's evidence (``Validations``'
  ``_check_failed``), known bad (its cordon ``cordoned``), with one e-mail;
* no verdict: as a validation's, run again, never a failure; once its attempts are spent
  (stalled) its cordon goes: a missing answer holds no node.

A lost node whose container instance is deregistered (ECS's status INACTIVE, read by the sweep's
look or in its event) can never reconnect: its look ends, and it stays SUSPECT as its record.

SUSPECT nodes of any other origin (telemetry, the breaker's hold) keep their own paths.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.constants import LOST_NODE_ATTRIBUTE
from gpu_recovery.domain import ecs_instance_status as ecs_status
from gpu_recovery.domain import validation as policy
from gpu_recovery.domain.cordon import check_cordon
from gpu_recovery.domain.models import Instance, container_instance_id
from gpu_recovery.domain.validation import Repair
from gpu_recovery.events.ecs import EcsContainerInstanceDetail
from gpu_recovery.recovery.ports import MetricsPort, Outcome, after_commit
from gpu_recovery.recovery.reboots import unmark_quietly
from gpu_recovery.recovery.validations import Validations
from gpu_recovery.repository.deadlines import DeadlineIndex
from gpu_recovery.repository.validations import ValidationRepository
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

# A lost node's ECS agent is looked at this often by the sweep while it is away.
LOOK_SECONDS = 300
# Its check, declared with the others of its kind (its cause: the lost-node escalation's rule).
CHECK = policy.SUSPECT_CHECKS[Repair.RECONNECT]


class MarksNodes(Protocol):
    def put_attributes(self, container_instance: str, attributes: dict[str, str]) -> Any: ...
    def delete_attributes(self, container_instance: str, names: list[str]) -> Any: ...


class LostNodeEcs(MarksNodes, Protocol):
    def describe_container_instance(self, container_instance: str) -> dict[str, Any] | None: ...


class LostNodeData(Protocol):
    deadlines: DeadlineIndex

    def get_instance(self, container_inst_id: str) -> Instance | None: ...


def mark_quietly(ecs: MarksNodes, instance: Instance) -> str:
    """PutAttributes ``gpu-recovery.lost-node`` (idempotent): the node's events reach the
    instance monitor. A failure leaves it to the sweep's look (``LostNodeChecks.sweep``)."""
    try:
        ecs.put_attributes(instance.container_instance_arn or instance.container_inst_id,
                           {LOST_NODE_ATTRIBUTE: str(int(clock.now()))})
    except Exception as error:
        logger.warning("putting the lost-node mark failed; the sweep puts it", extra={
            "instance": instance.container_inst_id, "error": str(error)})
        return "mark_failed"
    return "marked"


def unmark_lost_node(ecs: MarksNodes, target: str) -> str:
    """DeleteAttributes of the mark (the check is open, or the node is no lost node's suspect)."""
    return unmark_quietly(ecs, target, LOST_NODE_ATTRIBUTE)


@dataclass(eq=False, repr=False)
class LostNodeChecks:
    data: LostNodeData
    records: ValidationRepository
    ecs: LostNodeEcs
    validations: Validations
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    settings: Settings

    def on_change(self, instance: Instance | None, detail: EcsContainerInstanceDetail) -> Outcome | None:
        """A container-instance state change of a node the stack is not rebooting: a lost
        node's reconnect opens its check, its deregistration ends its look; a mark left on
        another node is deleted. None: the event is none of this stage's."""
        inst_id = container_instance_id(detail.containerInstanceArn)
        marked = detail.attribute(LOST_NODE_ATTRIBUTE) is not None
        if instance is None or not instance.lost_node_suspect:
            if not marked:
                return None
            return Outcome(unmark_lost_node(self.ecs, detail.containerInstanceArn),
                           detail={"instance": inst_id, "why": "not a lost node's suspect"})
        if detail.status == ecs_status.INACTIVE:
            return Outcome(self.left_cluster(instance, clock.now()), detail={"instance": inst_id})
        if not (detail.agentConnected and detail.status == ecs_status.ACTIVE):
            return Outcome("ignored", detail={"instance": inst_id, "why": "its ECS agent is not back"})
        return Outcome(self.reconnected(instance), detail={"instance": inst_id})

    def reconnected(self, instance: Instance) -> str:
        """The lost node's ECS agent is back: its check opened (once per flag), then started."""
        inst_id = instance.container_inst_id
        if instance.validating:
            return "duplicate"
        now = clock.now()
        record = policy.new_validation(Repair.RECONNECT, cause=CHECK.cause, since=now,
                                       policy=self.settings.validation)
        cordon = check_cordon(instance.cordon, repair=Repair.RECONNECT.value, now=now,
                              reason=f"{CHECK.name}: validating ({self.settings.validation.describe()})")
        if not self.records.open_reconnect_check(instance, record, now, cordon):
            return "duplicate"
        self.metrics.add_metric(f"{CHECK.metric}Opened", "Count", 1)
        logger.info("lost node's ECS agent reconnected: the stack's own check runs on it", extra={
            "instance": inst_id, "validation": self.settings.validation.describe()})
        if cordon is not None:
            after_commit("validating attribute", self.validations.cordons.sync_quietly, inst_id)
        after_commit("lost-node unmark", unmark_lost_node, self.ecs,
                     instance.container_instance_arn or inst_id)
        fresh = self.data.get_instance(inst_id)
        if fresh is not None:
            after_commit("reconnect check start", self.validations.start, fresh)
        return "reconnect_check_opened"

    def sweep(self, instance: Instance, now: float) -> str:
        """Due while a lost node is SUSPECT with no check open: ECS's word on its agent
        (connected and ACTIVE: its check opens; deregistered: the look ends), its mark put if
        missing, looked at again."""
        inst_id = instance.container_inst_id
        described = self.ecs.describe_container_instance(instance.container_instance_arn or inst_id)
        if described is None:
            # ECS answered MISSING: no word on its agent this time (ECS is eventually consistent;
            # as the reboot watch reads it). Looked at again: clearing the look here lost the
            # node's only way back whenever its reconnect event was lost too; the rearm's
            # condition (the lost node's flag, no check open) leaves a check opened meanwhile.
            self.records.rearm_lost_node(instance, now + LOOK_SECONDS)
            return "lost_node_not_described"
        if described.get("status") == ecs_status.INACTIVE:
            return self.left_cluster(instance, now)
        if described.get("agentConnected") and described.get("status") == ecs_status.ACTIVE:
            return self.reconnected(instance)
        if not any(a.get("name") == LOST_NODE_ATTRIBUTE for a in described.get("attributes") or []):
            mark_quietly(self.ecs, instance)
        self.records.rearm_lost_node(instance, now + LOOK_SECONDS)
        return "lost_node_waiting"

    def left_cluster(self, instance: Instance, now: float) -> str:
        """The lost node's container instance was deregistered: it can never reconnect, so the
        sweep stops looking at it (before, every 5 minutes for good); it stays SUSPECT, its
        record for a person. Once: the write is conditional on the flag with no check open."""
        if not self.records.end_lost_node_look(instance, now):
            return "duplicate"
        self.metrics.add_metric("LostNodesDeregistered", "Count", 1)
        logger.warning("lost node deregistered from the cluster: no longer looked at", extra={
            "instance": instance.container_inst_id})
        return "lost_node_deregistered"
