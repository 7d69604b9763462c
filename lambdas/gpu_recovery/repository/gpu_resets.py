"""A node's GPU reset (``recovery.gpu_resets``): its intents on the instance item.

A node whose decision is ``reset_gpu`` is REBOOTING with ``reset_pending``: the jobs wait for
it exactly as for a reboot, and the reboot is issued only if the reset fails. The claim
(``reset_started_by``, deterministic per node and decision) is committed before StartTask;
the task's ARN after it; the result from the task's STOPPED event: passed (REBOOTING ->
AVAILABLE, the same write as a node back from its reboot) or failed (``reset_pending``
goes, a new reboot request takes its place: today's reboot flow). Every write is
conditional on the decision it belongs to (``reboot_requested_at``) and on the claim.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.instances import AGENT_OUTAGE_ATTRIBUTES, Instances

# The reset attributes a new decision (or a fallback) clears.
RESET_ATTRIBUTES = ("reset_pending", "reset_started_by", "reset_claimed_at", "reset_task_arn")

_NAMES = {"#rq": "reboot_requested_at", "#rp": "reset_pending", "#sb": "reset_started_by",
          "#rc": "reset_claimed_at", "#rt": "reset_task_arn"}


def _names(*keys: str) -> dict[str, str]:
    return {k: _NAMES[k] for k in keys}


class GpuResets(Instances):
    """Intents of a node's GPU reset."""

    def claim_gpu_reset(self, instance: Instance, started_by: str, now: float, deadline_at: float) -> bool:
        """The intent to start the reset task, committed before StartTask (one claimer; a
        claim whose task was never recorded is taken over by :meth:`take_over_gpu_reset_claim`).
        ``deadline_at``: the sweep looks at a claimer that died."""
        return self.db.apply(self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING],
            set_fields={"reset_started_by": started_by, "reset_claimed_at": now}, deadline_at=deadline_at,
            extra_condition="#rq = :rq AND attribute_exists(#rp) AND attribute_not_exists(#sb)",
            extra_values={":rq": instance.reboot_requested_at}, extra_names=_names("#rq", "#rp", "#sb"),
        ))

    def take_over_gpu_reset_claim(self, instance: Instance, now: float, deadline_at: float) -> bool:
        """A claim whose task was never recorded (its claimer died, or StartTask's answer was
        lost): the taker looks the task up by its startedBy before starting one."""
        return self.db.apply(self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING],
            set_fields={"reset_claimed_at": now}, deadline_at=deadline_at,
            extra_condition="#rq = :rq AND attribute_exists(#rp) AND #sb = :sb AND #rc = :rc "
                            "AND attribute_not_exists(#rt)",
            extra_values={":rq": instance.reboot_requested_at, ":sb": instance.reset_started_by,
                          ":rc": instance.reset_claimed_at},
            extra_names=_names("#rq", "#rp", "#sb", "#rc", "#rt"),
        ))

    def release_gpu_reset_claim(self, instance: Instance, started_by: str, retry_at: float) -> bool:
        """StartTask refused the call (nothing started): the next try claims it again."""
        return self.db.apply(self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING],
            remove_fields=["reset_started_by", "reset_claimed_at"], deadline_at=retry_at,
            extra_condition="#rq = :rq AND #sb = :sb AND attribute_not_exists(#rt)",
            extra_values={":rq": instance.reboot_requested_at, ":sb": started_by},
            extra_names=_names("#rq", "#sb", "#rt"),
        ))

    def record_gpu_reset_started(self, instance: Instance, started_by: str, task_arn: str,
                                 deadline_at: float) -> bool:
        """StartTask answered: the task to wait for (its STOPPED event, or the sweep's look)."""
        return self.db.apply(self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING],
            set_fields={"reset_task_arn": task_arn}, deadline_at=deadline_at,
            extra_condition="#rq = :rq AND attribute_exists(#rp) AND #sb = :sb",
            extra_values={":rq": instance.reboot_requested_at, ":sb": started_by},
            extra_names=_names("#rq", "#rp", "#sb"),
        ))

    def rearm_gpu_reset(self, instance: Instance, deadline_at: float) -> bool:
        """Still waiting (GPUs busy, task running): the sweep looks again at ``deadline_at``."""
        return self.db.apply(self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING], deadline_at=deadline_at,
            extra_condition="#rq = :rq AND attribute_exists(#rp)",
            extra_values={":rq": instance.reboot_requested_at}, extra_names=_names("#rq", "#rp"),
        ))

    def record_gpu_reset_passed(self, instance: Instance, result: dict[str, Any], now: float, *,
                                validation: dict[str, Any] | None = None,
                                validating_cordon: dict[str, Any] | None = None) -> bool:
        """The reset and its diag passed: REBOOTING -> AVAILABLE, as a node back from its
        reboot (its waiting jobs are then released the same way); with ``validation`` the
        node validates first, as after a reboot (``mark_instance_back``)."""
        return self.mark_instance_back(instance, now, reset_started_by=instance.reset_started_by,
                                       last_reset=result, validation=validation,
                                       validating_cordon=validating_cordon)

    def fall_back_to_reboot(self, instance: Instance, *, started_by: str, result: dict[str, Any],
                            reason: str, fault_history: list[dict[str, Any]] | None, now: float,
                            deadline_at: float, also: Sequence[Update] = ()) -> bool:
        """The reset failed (or could not run, or its result never came): the node's decision
        becomes today's reboot (a new request: its own timeout), with the e-mail owed
        (``also``) in the same transaction. ``started_by`` "": no task was ever claimed."""
        claim = "#sb = :sb" if started_by else "attribute_not_exists(#sb)"
        values: dict[str, Any] = {":rq": instance.reboot_requested_at}
        if started_by:
            values[":sb"] = started_by
        fields: dict[str, Any] = {"last_reset": result, "reboot_requested_at": now,
                                  "reboot_reason": reason[:300]}
        if fault_history is not None:
            fields["fault_history"] = fault_history
        return self.db.transact([self.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING], set_fields=fields,
            remove_fields=[*RESET_ATTRIBUTES, "reboot_claimed_at", "reboot_issued_at",
                           *AGENT_OUTAGE_ATTRIBUTES],
            deadline_at=deadline_at,
            extra_condition=f"#rq = :rq AND attribute_exists(#rp) AND {claim}",
            extra_values=values, extra_names=_names("#rq", "#rp", "#sb"),
        ), *also])
