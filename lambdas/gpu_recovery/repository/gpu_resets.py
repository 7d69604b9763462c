"""A node's GPU reset (``recovery.gpu_resets``): its intents on the instance item.

A node whose decision is ``reset_gpu`` is REBOOTING with ``reset_pending``: the jobs wait for
it exactly as for a reboot, and the reboot is issued only if the reset fails. The claim
(``reset_started_by``, deterministic per node and decision) is committed before StartTask;
the task's ARN after it; the result from the task's STOPPED event: passed (REBOOTING ->
AVAILABLE, the same write as a node back from its reboot, in ``instances``) or failed
(``reset_pending`` goes, a new reboot request takes its place: today's reboot flow). Every
write is conditional on the decision it belongs to (``reboot_requested_at``) and on the claim.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpu_recovery.domain.models import Instance
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.claim_fields import GPU_RESET as CLAIM
from gpu_recovery.repository.instances import PAST_REBOOT_ATTRIBUTES, Instances

# The reset attributes a new decision (or a fallback) clears.
RESET_ATTRIBUTES = ("reset_pending", *CLAIM.paths)


class GpuResetRepository:
    """Intents of a node's GPU reset (``repo.gpu_resets``; its claim's are ``node_task_claims``'s,
    ``GPU_RESET``, and its pass is a node back: ``nodes_back.record_gpu_reset_passed``)."""

    def __init__(self, instances: Instances) -> None:
        self.db, self.node_tasks = instances.db, instances.node_tasks

    def fall_back_to_reboot(self, instance: Instance, *, result: dict[str, Any], reason: str,
                            fault_history: list[dict[str, Any]] | None, now: float, deadline_at: float,
                            also: Sequence[Update] = ()) -> bool:
        """The reset failed (or could not run, or its result never came): the node's decision
        becomes today's reboot (a new request: its own timeout), with the e-mail owed
        (``also``) in the same transaction. On the reset's claim as read (none: no task was
        ever claimed)."""
        fields: dict[str, Any] = {"last_reset": result, "reboot_requested_at": now,
                                  "reboot_reason": reason[:300]}
        if fault_history is not None:
            fields["fault_history"] = fault_history
        condition, values, names = CLAIM.held(instance)
        removed = [*RESET_ATTRIBUTES, *PAST_REBOOT_ATTRIBUTES]
        update = self.node_tasks.claim_update(CLAIM, instance, condition, values, names, set_fields=fields,
                                              remove_fields=removed, deadline_at=deadline_at)
        return self.db.transact([update, *also])
