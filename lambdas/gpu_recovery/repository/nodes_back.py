"""A node's way back from its repair (``recovery.reboots``, ``recovery.validations``): REBOOTING
-> AVAILABLE once per reboot or GPU reset (or REBOOTING with its validation first), its cordon
cleared with it, then each job waiting for it released (its suspect back, its tally one
rebooting node fewer), and the node's deadline cleared once none is left.

A deadline set with the node's return lets the sweep release what a delivery that died left
waiting.
"""

from __future__ import annotations

from typing import Any

from gpu_recovery import clock
from gpu_recovery.domain.models import Instance, Job
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.claim_fields import GPU_RESET as RESET_CLAIM
from gpu_recovery.repository.instances import Instances


class NodeBackRepository:
    """Intents of a node back from its repair (``repo.nodes_back``)."""

    def __init__(self, instances: Instances) -> None:
        self.instances = instances
        self.db, self.cordons, self.faults = instances.db, instances.cordons, instances.faults

    def mark_instance_back(self, instance: Instance, now: float, *, reset_started_by: str = "",
                           last_reset: dict[str, Any] | None = None,
                           validation: dict[str, Any] | None = None,
                           validating_cordon: dict[str, Any] | None = None) -> bool:
        """REBOOTING -> AVAILABLE, once per reboot. The jobs waiting for it stay listed until
        each is released (:meth:`release_waiting_job`); a deadline lets the sweep finish that
        if this delivery dies. ``reset_started_by``: back after that GPU reset (its claim), not
        a reboot. ``validation`` (domain.validation.new_validation): the node stays REBOOTING
        and validates first (the intent of ``recovery.validations``), its cordon becoming
        ``validating_cordon`` (the placement value ``validating``), its waiting jobs kept."""
        fields: dict[str, Any] = {"returned_at": now}
        remove: list[str] = ["suspect_fence"]  # back healthy: the suspect is answered
        condition = "#rq = :rq AND attribute_not_exists(#val)"
        values: dict[str, Any] = {":rq": instance.reboot_requested_at}
        names = {"#rq": "reboot_requested_at", "#val": "validation"}
        if reset_started_by:
            condition += " AND attribute_exists(#rp) AND #sb = :sb"
            values[":sb"] = reset_started_by
            names.update({"#rp": "reset_pending", "#sb": "reset_started_by"})
            remove += ["reset_pending", "reset_claimed_at"]
            fields["last_reset"] = last_reset or {}
        if validation is not None:
            sync: list[Update] = []
            fields["validation"] = validation
            if validating_cordon is not None:  # out of every placement until it passes
                fields.update(self.cordons.cordon_fields(validating_cordon, now))
                sync.append(self.cordons.sync_update(instance.container_inst_id, now))
            return self.db.transact([self.instances.instance_update(
                instance.container_inst_id, from_states=[InstanceState.REBOOTING], set_fields=fields,
                remove_fields=remove, deadline_at=now + 60, extra_condition=condition, extra_values=values,
                extra_names=names), *sync])
        # Healthy again: its cordon goes with the reboot (same transaction).
        return self.back_to_available(instance, now, fields, remove, condition, values, names)

    def record_gpu_reset_passed(self, instance: Instance, result: dict[str, Any], now: float, *,
                                validation: dict[str, Any] | None = None,
                                validating_cordon: dict[str, Any] | None = None) -> bool:
        """The reset and its diag passed: REBOOTING -> AVAILABLE, as a node back from its
        reboot (its waiting jobs are then released the same way); with ``validation`` the
        node validates first, as after a reboot (:meth:`mark_instance_back`)."""
        return self.mark_instance_back(instance, now, reset_started_by=RESET_CLAIM.read(instance).started_by,
                                       last_reset=result, validation=validation,
                                       validating_cordon=validating_cordon)

    def back_to_available(self, instance: Instance, now: float, fields: dict[str, Any], remove: list[str],
                          condition: str, values: dict[str, Any], names: dict[str, str], *,
                          from_state: InstanceState = InstanceState.REBOOTING) -> bool:
        """REBOOTING (or ``from_state``) -> AVAILABLE on ``condition``, its cordon cleared in
        the same transaction (healthy again); its waiting jobs keep a deadline so the sweep
        releases them if this delivery dies before it does."""
        waiting = bool(instance.waiting_jobs)
        sync: list[Update] = []
        # A cordon AWS's notice put (the node goes away: recovery.aws_notices) outlives a reboot.
        if instance.cordoned and not instance.cordon.get("notice"):
            more, gone, update = self.cordons.uncordon_updates(instance.container_inst_id, now)
            fields = {**fields, **more}
            remove = [*remove, *gone]
            sync.append(update)
        return self.db.transact([self.instances.instance_update(
            instance.container_inst_id, from_states=[from_state], to=InstanceState.AVAILABLE,
            set_fields=fields, remove_fields=remove, deadline_at=now + 60 if waiting else None,
            clear_deadline=not waiting,
            extra_condition=condition, extra_values=values, extra_names=names,
        ), *sync])

    def release_waiting_job(self, inst_id: str, job: Job | None, job_id: str, note: str = "",
                            validation: dict[str, Any] | None = None) -> bool:
        """The node is back: it no longer holds ``job_id``'s gang restart. The job's count of
        rebooting nodes goes down once (its suspect item's ``rebooting`` flag) in the same
        transaction as the instance lets the job go. ``note``: a line for the job's history
        (its node's validation after repair, or that it had none), ``validation`` its record
        on the job's suspect item (the restart's e-mail says it)."""
        leave = self.instances.instance_update(
            inst_id, delete_from_sets={"waiting_jobs": {job_id}}, extra_condition="contains(#wj, :j)",
            extra_values={":j": job_id}, extra_names={"#wj": "waiting_jobs"})
        if job is None or not job.in_fault:
            return self.db.apply(leave)
        faults = self.faults
        suspect = faults.get_suspect(job.job_id, job.attempt, inst_id)
        if suspect is None or not suspect.rebooting:
            return self.db.apply(leave)
        return self.db.transact([leave, *self.node_back_updates(job, inst_id, note, validation)])

    def node_back_updates(self, job: Job, inst_id: str, note: str = "",
                          validation: dict[str, Any] | None = None) -> list[Update]:
        """The job's suspect of ``inst_id`` back (no longer holding its restart) and its tally
        one rebooting node fewer, with ``note`` in the job's history (no state change)."""
        back = self.faults.node_back(job, inst_id)
        if validation:
            back.set_fields["validation"] = dict(validation)
        tally = self.faults.tally_back(job)
        if note:
            now = clock.now()
            tally.set_fields["updated_at"] = now
            tally.history_entry = {"at": now, "to": job.state.value, "from": job.state.value,
                                   "reason": note[:500], "actor": "recovery"}
        return [back, tally]

    def clear_waiting_deadline(self, inst_id: str) -> bool:
        """Every waiting job was released: the sweep has nothing left on the node."""
        return self.db.apply(self.instances.instance_update(
            inst_id, from_states=[InstanceState.AVAILABLE], clear_deadline=True,
            extra_condition="attribute_not_exists(#wj) OR size(#wj) = :zero",
            extra_values={":zero": 0}, extra_names={"#wj": "waiting_jobs"}))
