"""A repaired node's validation (``recovery.validations``): its intents on the instance item.

The node is back from its repair and stays REBOOTING with a ``validation`` map (written by
``mark_instance_back``, the same write that used to make it AVAILABLE): every job waiting for
it keeps waiting and nothing places on it. Every write here is conditional on that validation
(its ``since``) and on the claim of its task (``started_by``, deterministic per node,
validation and attempt, committed before StartTask): a delivery that died between two of them
is finished by the next one, or by the sweep, never repeated.

* claim -> StartTask -> record the task (a claim whose answer was lost is taken over after its
  lease and the task looked up by its startedBy first);
* the task's result: passed (REBOOTING -> AVAILABLE, the cordon cleared, as a node back from
  its reboot used to be), no verdict (the claim given back, tried again), failed (a node
  decision: ``repository.node_decisions``, conditional on the same claim).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import (
    DEADLINE_BUCKET,
    DEADLINE_PK,
    DEADLINE_SK,
    INSTANCE_PK,
    JOB_PK,
    job_item_key,
)
from gpu_recovery.domain.models import LOST_NODE_ORIGIN, Instance, Job
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.claim_fields import VALIDATION as CLAIM
from gpu_recovery.repository.instances import Instances
from gpu_recovery.repository.nodes_back import NodeBackRepository

# The node's validation: set when it is back from its repair, removed by its result.
VALIDATION = "validation"
# A lost node's SUSPECT flag with no check open (``recovery.lost_node_checks``).
_LOST_NODE_UNCHECKED: dict[str, Any] = {
    "extra_condition": "#so = :so AND attribute_not_exists(#val)", "extra_values": {":so": LOST_NODE_ORIGIN},
    "extra_names": {"#so": "suspect_origin", "#val": VALIDATION}}

# When a lost node's container instance was found deregistered: its look ended for good.
DEREGISTERED_AT = "deregistered_at"
# ... and not deregistered: looked at by the sweep (a rearm racing the look's end writes nothing).
_LOST_NODE_LOOKED_AT: dict[str, Any] = {
    "extra_condition": f"{_LOST_NODE_UNCHECKED['extra_condition']} AND attribute_not_exists(#gone)",
    "extra_values": _LOST_NODE_UNCHECKED["extra_values"],
    "extra_names": {**_LOST_NODE_UNCHECKED["extra_names"], "#gone": DEREGISTERED_AT}}


# A node an operator may return: no check open, not being replaced (``RebootRepository``'s
# termination, or its replacement awaited), no node action of its held back by the breaker.
_RETURNABLE: dict[str, Any] = {
    "extra_condition": "attribute_not_exists(#val) AND attribute_not_exists(#tp) "
                       "AND attribute_not_exists(#rw) AND attribute_not_exists(#bb)",
    "extra_names": {"#val": VALIDATION, "#tp": "terminate_pending", "#rw": "replacement_watch",
                    "#bb": "breaker_blocked"}}
# The states an operator returns a node from (``gpu-recovery-admin return-node``).
RETURNABLE_STATES = (InstanceState.SUSPECT, InstanceState.QUARANTINED)
# What a quarantine left on the node: gone once it is returned.
_QUARANTINE_FIELDS = ("quarantine_reason", "drain_pending")
# On a returned node until the return's ECS step (ACTIVE if DRAINING) is confirmed: what a rerun
# of the command finishes, and nothing else (a drain made after it is not undone).
ACTIVATION_PENDING = "ecs_activation_pending"


class ValidationRepository:
    """Intents of a repaired node's validation (``repo.validations``)."""

    def __init__(self, instances: Instances, nodes_back: NodeBackRepository) -> None:
        self.instances, self.nodes_back = instances, nodes_back
        self.db, self.cordons, self.node_tasks = instances.db, instances.cordons, instances.node_tasks
        self.job_table_name = instances.job_table_name
        self.instance_table_name = instances.instance_table_name

    def pass_validation(self, instance: Instance, result: dict[str, Any], now: float) -> bool:
        """The validation passed: REBOOTING -> AVAILABLE, its cordon cleared, as a node back
        from its reboot used to be; the jobs waiting for it are released next (a deadline
        lets the sweep finish that if this delivery dies). On its task's claim as read: with
        none read, nothing ran and nothing is written."""
        if not CLAIM.read(instance).started_by:
            return False
        condition, values, names = CLAIM.serving(instance)
        result_fields = {"last_validation": result, "validated_at": now}
        gone = [VALIDATION, "suspect_fence"]
        if instance.state is InstanceState.SUSPECT:  # a lost node's check: no longer a suspect
            gone += ["suspect_since", "suspect_reason"]
        return self.nodes_back.back_to_available(instance, now, result_fields, gone, condition, values, names,
                                                 from_state=instance.state)

    # ------------------------------------------------ a lost node reconnected
    def open_reconnect_check(self, instance: Instance, validation: dict[str, Any], now: float,
                             cordon: dict[str, Any] | None) -> bool:
        """A lost node SUSPECT on a missing answer whose ECS agent reconnected: the stack's own
        check (``validation``, ``domain.validation.new_validation`` with ``Repair.RECONNECT``)
        on the node, which stays SUSPECT, due at once (the sweep starts it if this delivery
        dies), under ``cordon`` (``domain.cordon.check_cordon``; None: the one it has stays)
        with its worklist member. Once per flag: only while no check is open and the flag is
        the lost node's (a redelivered or late event writes nothing)."""
        update = self.instances.instance_update(
            instance.container_inst_id, from_states=[InstanceState.SUSPECT],
            set_fields={VALIDATION: validation}, deadline_at=now, **_LOST_NODE_UNCHECKED)
        return self.db.transact(self._under(update, cordon))

    def rearm_lost_node(self, instance: Instance, look_at: float) -> bool:
        """A lost node still SUSPECT with no check open (its agent still away), not deregistered:
        looked at again."""
        return self.db.apply(self.instances.instance_update(
            instance.container_inst_id, from_states=[InstanceState.SUSPECT], deadline_at=look_at,
            **_LOST_NODE_LOOKED_AT))

    def end_lost_node_look(self, instance: Instance, now: float) -> bool:
        """A lost node still SUSPECT with no check open whose container instance was deregistered:
        it can never reconnect, so its look ends (no deadline); it stays SUSPECT, the record for a
        person, with ``deregistered_at``. Once (a redelivered event writes nothing)."""
        return self.db.apply(self.instances.instance_update(
            instance.container_inst_id, from_states=[InstanceState.SUSPECT],
            set_fields={DEREGISTERED_AT: now}, clear_deadline=True, **_LOST_NODE_LOOKED_AT))

    def fail_suspect_check(self, instance: Instance, result: dict[str, Any], findings: dict[str, Any],
                           reason: str, origin: str, cordon: dict[str, Any] | None,
                           also: Sequence[Update] = ()) -> bool:
        """A check no repair preceded (``domain.validation.SUSPECT_CHECKS``: a lost node's, an
        operator's return) found a fault: no failed repair (none was made) and no node decision.
        It stays SUSPECT for a person, now for its check's evidence (``last_validation``,
        ``last_verdict``; ``origin`` says which check failed), the check closed, known bad: its
        cordon ``cordon`` (``domain.cordon.failed_check_cordon``; None: the one it has stays)
        with its worklist member; with ``also`` (its e-mail, owed). On the claim as read."""
        condition, values, names = CLAIM.serving(instance)
        update = self.instances.instance_update(
            instance.container_inst_id, from_states=[InstanceState.SUSPECT],
            set_fields={"last_validation": result, "last_verdict": findings, "suspect_reason": reason[:500],
                        "suspect_origin": origin},
            remove_fields=[VALIDATION], clear_deadline=True, extra_condition=condition, extra_values=values,
            extra_names=names)
        return self.db.transact([*self._under(update, cordon), *also])

    # ------------------------------------------------- an operator's return
    def open_operator_check(self, instance: Instance, validation: dict[str, Any], now: float, *,
                            origin: str, history: dict[str, Any], cordon: dict[str, Any] | None) -> bool:
        """An operator returns a SUSPECT (any origin) or QUARANTINED node (``gpu-recovery-admin
        return-node``): the stack's own check (``validation``, ``Repair.OPERATOR``) on the node,
        which is SUSPECT (``origin``) while it runs, due at once (the sweep starts it), under
        ``cordon`` (``domain.cordon.check_cordon``; None: the one it has stays) with its worklist
        member. One conditional write on the state as read and ``_RETURNABLE`` (with the
        worklist's unconditional ADD: one transaction); a QUARANTINED node leaves its quarantine
        (the operator sets it ACTIVE in ECS after this write); ``history``: its line in the
        node's history."""
        if instance.state not in RETURNABLE_STATES:
            return False
        fields: dict[str, Any] = {VALIDATION: validation, "suspect_origin": origin, ACTIVATION_PENDING: True}
        remove: list[str] = []
        if instance.state is InstanceState.QUARANTINED:
            fields.update(suspect_since=now, suspect_reason=str(history.get("reason") or "")[:500])
            remove = list(_QUARANTINE_FIELDS)
        return self.db.transact(self._under(self._returned(self.instances.instance_update(
            instance.container_inst_id, from_states=[instance.state], to=InstanceState.SUSPECT,
            set_fields=fields, remove_fields=remove, deadline_at=now, **_RETURNABLE), history), cordon))

    def return_without_check(self, instance: Instance, now: float, history: dict[str, Any]) -> bool:
        """The operator vouches for the node (``return-node --without-check``): SUSPECT or
        QUARANTINED (as read, and ``_RETURNABLE``) -> AVAILABLE, its quarantine and suspect
        fields cleared, its cordon too (not an AWS notice's: the node still goes away; the ECS
        attribute follows through the sweep's worklist), its deadline cleared; ``history``: its
        line in the node's history."""
        if instance.state not in RETURNABLE_STATES:
            return False
        fields: dict[str, Any] = {}
        remove = [*_QUARANTINE_FIELDS, "suspect_since", "suspect_reason", "suspect_fence"]
        sync: list[Update] = []
        if instance.cordoned and not instance.cordon.get("notice"):
            more, gone, update = self.cordons.uncordon_updates(instance.container_inst_id, now)
            fields, remove = more, [*remove, *gone]
            sync.append(update)
        fields[ACTIVATION_PENDING] = True
        return self.db.transact([self._returned(self.instances.instance_update(
            instance.container_inst_id, from_states=[instance.state], to=InstanceState.AVAILABLE,
            set_fields=fields, remove_fields=remove, clear_deadline=True, **_RETURNABLE), history), *sync])

    def activation_done(self, container_inst_id: str) -> bool:
        """The return's ECS step is confirmed (the node ACTIVE, or found not DRAINING): a rerun of
        the command has nothing left to finish."""
        return self.db.apply(Update(
            table=self.instance_table_name, key={INSTANCE_PK: container_inst_id},
            remove_fields=[ACTIVATION_PENDING], condition="attribute_exists(#ap)",
            condition_names={"#ap": ACTIVATION_PENDING}))

    @staticmethod
    def _returned(update: Update, history: dict[str, Any]) -> Update:
        return replace(update, history_entry=history)

    def _under(self, update: Update, cordon: dict[str, Any] | None) -> list[Update]:
        """``update`` that also sets the node's ``cordon`` (None: nothing about it), its version
        the cordon's time, with the attribute worklist's member of that intent (the sweep syncs
        it if the caller's sync does not)."""
        if cordon is None:
            return [update]
        version = float(cordon["at"])
        update.set_fields = {**(update.set_fields or {}), **self.cordons.cordon_fields(cordon, version)}
        return [update, self.cordons.sync_update(update.key[INSTANCE_PK], version)]

    def validation_condition(self, instance: Instance) -> tuple[str, dict[str, Any], dict[str, str]]:
        """The condition a failed validation's node decision is written on: this validation,
        this claim (none: a validation that timed out before any task was claimed)
        (``repository.node_decisions.NodeDecision.validation``)."""
        return CLAIM.serving(instance, "vsb")

    def job_history_note(self, job: Job, note: str) -> Update:
        """A line in a waiting job's history (no state change: its node was repaired again),
        only while the job is still in this recovery."""
        now = clock.now()
        return Update(
            table=self.job_table_name, key={JOB_PK: job_item_key(job.job_id)}, set_fields={"updated_at": now},
            history_entry={"at": now, "to": job.state.value, "from": job.state.value, "reason": note[:500],
                           "actor": "recovery"},
            condition="#js = :js AND #att = :att",
            condition_values={":js": job.state.value, ":att": job.attempt},
            condition_names={"#js": "job_state", "#att": "attempt"})

    # ------------------------------------------------------------- a new node
    def adopt_replacement(self, watcher: Instance, container_inst_id: str, *, arn: str, ec2_instance_id: str,
                          validation: dict[str, Any], cordon: dict[str, Any], now: float) -> bool:
        """A node the Auto Scaling group launched in place of ``watcher`` (terminated by the
        stack), seen for the first time: its item written in validation (REBOOTING, no reboot
        of its own), cordoned ``validating``, due at once (the sweep starts its task if this
        delivery dies), and the watch closed, in one transaction. Only if the stack has no item
        of the node yet and the watch is still open (a node one watch took, another skips)."""
        fields = {"instance_state": InstanceState.REBOOTING.value, "container_instance_arn": arn,
                  "ec2_instance_id": ec2_instance_id, "registered_at": now, "returned_at": now,
                  VALIDATION: validation, **self.cordons.cordon_fields(cordon, now), "updated_at": now,
                  DEADLINE_PK: DEADLINE_BUCKET, DEADLINE_SK: now}
        adopt = Update(
            table=self.instance_table_name, key={INSTANCE_PK: container_inst_id},
            set_fields={k: v for k, v in fields.items() if v != ""},
            condition="attribute_not_exists(#k)", condition_names={"#k": INSTANCE_PK})
        return self.db.transact([adopt, self._close_watch(watcher, found=container_inst_id),
                                 self.cordons.sync_update(container_inst_id, now)])

    def close_replacement_watch(self, watcher: Instance) -> bool:
        """No replacement registered within the watch: nothing more to look for."""
        return self.db.apply(self._close_watch(watcher, found=""))

    def rearm_replacement_watch(self, watcher: Instance, deadline_at: float) -> bool:
        return self.db.apply(self.instances.instance_update(
            watcher.container_inst_id, from_states=[InstanceState.QUARANTINED], deadline_at=deadline_at,
            extra_condition="#w.#si = :si", extra_values={":si": watcher.replacement_watch.get("since")},
            extra_names={"#w": "replacement_watch", "#si": "since"}))

    def _close_watch(self, watcher: Instance, *, found: str) -> Update:
        return self.instances.instance_update(
            watcher.container_inst_id, from_states=[InstanceState.QUARANTINED],
            set_fields={"replaced_by": found} if found else None, remove_fields=["replacement_watch"],
            clear_deadline=True, extra_condition="#w.#si = :si",
            extra_values={":si": watcher.replacement_watch.get("since")},
            extra_names={"#w": "replacement_watch", "#si": "since"})

    def stall_validation(self, instance: Instance, now: float, until: float,
                         also: list[Update] | tuple[Update, ...] = (), *, uncordon: bool = False) -> bool:
        """A validation that could not run (never placed, or every attempt ended without a
        verdict): no failed repair. The node stays validating (out of service as it was), its
        attempts start again until ``until``; ``stalled_at`` (set once) says an operator was
        told (``also``: that e-mail, owed in the same write). ``uncordon``: its ``validating``
        cordon goes (only while it is that one), with the worklist member of its removal."""
        condition, values, names = CLAIM.held(instance)
        fields: dict[str, Any] = {f"{VALIDATION}.attempts": 0, f"{VALIDATION}.until": until}
        remove = list(CLAIM.paths)
        sync: list[Update] = []
        if not instance.validation.get("stalled_at"):
            fields[f"{VALIDATION}.stalled_at"] = now
        if uncordon:
            more, gone, member = self.cordons.uncordon_updates(instance.container_inst_id, now)
            fields, remove, sync = {**fields, **more}, [*remove, *gone], [member]
            condition = f"({condition}) AND #c.#cvd = :cvd"
            values, names = {**values, ":cvd": True}, {**names, "#c": "cordon", "#cvd": "validating"}
        update = self.node_tasks.claim_update(CLAIM, instance, condition, values, names, set_fields=fields,
                                              remove_fields=remove, deadline_at=now + 60)
        return self.db.transact([update, *sync, *also])
