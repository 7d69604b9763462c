"""A container instance: reads, registration and intents (its fault history; its way back
from a repair is ``nodes_back``, its health check's ``health_checks``, its reboot's
``reboots``).

Every intent is a conditional write on the instance's state and on the attribute of the
step it records (``hc_started_by``, ``reboot_requested_at``...): a step whose intent is
committed first and whose result is confirmed after, so a delivery that dies in between
is finished, not repeated, by the next one (or the sweep).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import INSTANCE_PK
from gpu_recovery.domain.models import Instance
from gpu_recovery.repository.base import Update, from_ddb, to_ddb
from gpu_recovery.repository.tables import RecoveryTables

#: What a reboot request forgets of the agent's last outage (``record_agent_disconnected``).
AGENT_OUTAGE_ATTRIBUTES = ("disconnected_at", "disconnected_version", "disconnected_agent", "reconnected_at",
                           "reconnected_version", "reconnected_agent")
#: A reboot's claim (``repository.reboots``): when, and its claimer's token.
REBOOT_CLAIM_TOKEN = "reboot_claim_token"
REBOOT_CLAIM_ATTRIBUTES = ("reboot_claimed_at", REBOOT_CLAIM_TOKEN)
#: A replacement's termination claim's claimer token (``repository.reboots``).
TERMINATE_CLAIM_TOKEN = "terminate_claim_token"
#: What a new reboot request forgets of the last reboot: its claim, its answer, its outage.
PAST_REBOOT_ATTRIBUTES = (*REBOOT_CLAIM_ATTRIBUTES, "reboot_issued_at", *AGENT_OUTAGE_ATTRIBUTES)


class Instances(RecoveryTables):
    """Reads and intents of container instances."""

    # ==================================================================== reads
    def get_instance(self, container_inst_id: str) -> Instance | None:
        item = self.db.get(self.instance_table_name, {INSTANCE_PK: container_inst_id})
        return self.instance_from_item(item) if item else None

    def get_instances(self, ids: Iterable[str]) -> dict[str, Instance]:
        keys = [{INSTANCE_PK: i} for i in sorted(set(ids))]
        found = (self.instance_from_item(i) for i in self.db.batch_get(self.instance_table_name, keys))
        return {inst.container_inst_id: inst for inst in found}

    def get_instance_item(self, container_inst_id: str) -> dict[str, Any] | None:
        """The raw instance item (the node agent's XIDs and telemetry, the fault history)."""
        item = self.db.get(self.instance_table_name, {INSTANCE_PK: container_inst_id})
        return from_ddb(item) if item else None

    # ============================================================ registration
    def record_ec2_instance_id(self, inst_id: str, ec2_instance_id: str) -> bool:
        """The node's EC2 (or managed) instance id, once known (registration leaves it out
        when no item had it: no DescribeContainerInstances per rank of a starting job)."""
        return self.db.apply(Update(
            table=self.instance_table_name, key={INSTANCE_PK: inst_id},
            set_fields={"ec2_instance_id": ec2_instance_id},
            condition="attribute_exists(#k) AND (attribute_not_exists(#e) OR #e = :empty)",
            condition_names={"#k": INSTANCE_PK, "#e": "ec2_instance_id"}, condition_values={":empty": ""}))

    def put_instance_if_absent(self, instance: Instance) -> bool:
        item = to_ddb(
            {
                INSTANCE_PK: instance.container_inst_id,
                "instance_state": instance.state.value,
                "container_instance_arn": instance.container_instance_arn,
                "ec2_instance_id": instance.ec2_instance_id,
                "registered_at": clock.now(),
            }
        )
        item = {k: v for k, v in item.items() if v != ""}
        return self.db.put_if_absent(self.instance_table_name, item, INSTANCE_PK)

    def commit_leaving_check(self, instance: Instance, updates: list[Update], *,
                             leaving: bool = True) -> bool:
        """A way out of HEALTH_CHECKING committed, then (``leaving``) its slots given back
        (plain writes, best effort: the sweep's reaper frees what a lost one leaves)."""
        if not self.db.transact(updates):
            return False
        if leaving:
            self.slots.give_back(instance)
        return True

    # ======================================================= the fault history
    def record_node_fault(self, inst_id: str, *, fault_history: list[dict[str, Any]],
                          last_fault: dict[str, Any] | None, read_version: int) -> bool:
        """A fault that changed nothing on the node (a restart in place, an application
        error) joins its history, only if no other such write landed since the history was
        read (``fault_history_version``; a lost race re-reads and appends again)."""
        fields: dict[str, Any] = {"fault_history": fault_history}
        if last_fault is not None:
            fields["last_fault"] = last_fault
        return self.db.apply(self.instance_update(
            inst_id, set_fields=fields, increments={"fault_history_version": 1},
            extra_condition="attribute_exists(#k) AND (attribute_not_exists(#fv) OR #fv = :fv)",
            extra_values={":fv": read_version},
            extra_names={"#k": INSTANCE_PK, "#fv": "fault_history_version"}))

    def record_observed_fault(self, inst_id: str, *, fault_history: list[dict[str, Any]] | None,
                              last_fault: dict[str, Any]) -> bool:
        """Observe mode: what would have been done, on the node (its state untouched)."""
        [update] = self.observed_fault_updates(inst_id, fault_history=fault_history, last_fault=last_fault)
        return self.db.apply(update)

    def observed_fault_updates(self, inst_id: str, *, fault_history: list[dict[str, Any]] | None,
                               last_fault: dict[str, Any], cordon: Mapping[str, Any] | None = None,
                               version: float = 0.0) -> list[Update]:
        """:meth:`record_observed_fault` as updates for the transaction of the decision that
        observed it, with the node's ``cordon`` (intent ``version``) and its worklist member when
        it is found bad: one write leaves it recorded and cordoned, or neither. Only a node the
        loop knows (no item is created)."""
        fields: dict[str, Any] = {"last_fault": last_fault}
        if fault_history is not None:
            fields["fault_history"] = fault_history
        sync = []
        if cordon is not None:
            fields.update(self.cordons.cordon_fields(cordon, version))
            sync.append(self.cordons.sync_update(inst_id, version))
        return [self.instance_update(inst_id, set_fields=fields, extra_condition="attribute_exists(#k)",
                                     extra_names={"#k": INSTANCE_PK}), *sync]
