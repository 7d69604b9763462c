"""A node's reboot, its quarantine and termination, its agent's outage (``recovery.reboots``):
their intents on the instance item.

A reboot is claimed before the call (``reboot_claimed_at`` and the claimer's token, on the
decision it carries out: ``reboot_requested_at``), recorded issued after it, given back when
the call was refused, and taken over by the sweep when its claimer died; the agent's
disconnect and reconnect while the node is REBOOTING are its signs of life. A replacement's
termination is claimed and recorded the same way; a quarantine's drain is recorded once ECS
confirmed it.
"""

from __future__ import annotations

from typing import Any

from gpu_recovery import clock
from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.instances import (
    REBOOT_CLAIM_ATTRIBUTES,
    REBOOT_CLAIM_TOKEN,
    TERMINATE_CLAIM_TOKEN,
    Instances,
)


class RebootRepository:
    """Intents of a node's reboot, quarantine and termination (``repo.reboots``)."""

    def __init__(self, instances: Instances) -> None:
        self.instances = instances
        self.db, self.cordons = instances.db, instances.cordons

    # ================================================== quarantine, termination
    def record_drained(self, inst_id: str, *, terminate_next: bool = False, uncordon: bool = False) -> bool:
        """ECS confirmed the quarantine's DRAINING: nothing left for the sweep (unless the
        node is still to be terminated in its Auto Scaling group). DRAINING keeps every
        placement off the node from now on, so a cordon it had (``uncordon``) is cleared
        with it: an operator who sets the node ACTIVE again finds it placeable."""
        fields: dict[str, Any] = {}
        remove = ["drain_pending"]
        sync: list[Update] = []
        if uncordon:
            now = clock.now()
            fields, gone, update = self.cordons.uncordon_updates(inst_id, now)
            remove += gone
            sync.append(update)
        return self.db.transact([self.instances.instance_update(
            inst_id, from_states=[InstanceState.QUARANTINED], set_fields=fields, remove_fields=remove,
            clear_deadline=not terminate_next, extra_condition="attribute_exists(#dp)",
            extra_names={"#dp": "drain_pending"}), *sync])

    def claim_termination(self, instance: Instance, now: float, lease_seconds: float, token: str) -> bool:
        """The intent to call TerminateInstanceInAutoScalingGroup, committed before the call;
        a claim older than the lease (its holder died) may be taken over, and the taker
        looks the instance up before calling again. The claimer's ``token`` passes again: a
        claim written whose answer was lost is the claimer's on its next try."""
        return self.db.apply(self.instances.instance_update(
            instance.container_inst_id, from_states=[InstanceState.QUARANTINED],
            set_fields={"terminate_claimed_at": now, TERMINATE_CLAIM_TOKEN: token},
            extra_condition="attribute_exists(#tp) AND "
                            "(attribute_not_exists(#tc) OR #tc < :stale OR #tk = :tk)",
            extra_values={":stale": now - lease_seconds, ":tk": token},
            extra_names={"#tp": "terminate_pending", "#tc": "terminate_claimed_at",
                         "#tk": TERMINATE_CLAIM_TOKEN},
        ))

    def record_termination(self, inst_id: str, result: str, now: float,
                           watch: dict[str, Any] | None = None) -> bool:
        """The termination was requested (or found done / impossible): confirmed. ``watch``
        (domain.validation.replacement_watch): the node its group launches in its place is
        awaited, to validate it (the sweep looks for it every minute until then)."""
        return self.db.apply(self.instances.instance_update(
            inst_id, from_states=[InstanceState.QUARANTINED],
            set_fields={"terminate_result": result[:300], "terminated_at": now,
                        **({"replacement_watch": watch} if watch else {})},
            remove_fields=["terminate_pending", TERMINATE_CLAIM_TOKEN], clear_deadline=not watch,
            deadline_at=now + 60 if watch else None,
            extra_condition="attribute_exists(#tp)", extra_names={"#tp": "terminate_pending"},
        ))

    # =================================================================== reboot
    def claim(self, instance: Instance, now: float, token: str) -> bool:
        """The intent to call the reboot API, committed before the call (one caller at a
        time; a claim whose answer was never recorded is taken over only by
        :meth:`take_over_claim`). The claimer's ``token`` passes the condition again: a
        claim written but whose answer was lost is the claimer's on its next try."""
        return self._claim(instance, now, token, "attribute_not_exists(#rc)", {})

    def take_over_claim(self, instance: Instance, now: float, token: str) -> bool:
        return self._claim(instance, now, token, "#rc = :rc", {":rc": instance.reboot_claimed_at})

    def _claim(self, instance: Instance, now: float, token: str, held: str, values: dict[str, Any]) -> bool:
        return self.db.apply(self.instances.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING],
            set_fields={"reboot_claimed_at": now, REBOOT_CLAIM_TOKEN: token},
            extra_condition=f"#rq = :rq AND attribute_not_exists(#ri) AND ({held} OR #tk = :tk)",
            extra_values={":rq": instance.reboot_requested_at, ":tk": token, **values},
            extra_names={"#rq": "reboot_requested_at", "#rc": "reboot_claimed_at", "#ri": "reboot_issued_at",
                         "#tk": REBOOT_CLAIM_TOKEN},
        ))

    def record_issued(self, instance: Instance, path: str, now: float, deadline_at: float) -> bool:
        return self.db.apply(self.instances.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING],
            set_fields={"reboot_issued_at": now, "reboot_path": path}, deadline_at=deadline_at,
            extra_condition="#rq = :rq", extra_values={":rq": instance.reboot_requested_at},
            extra_names={"#rq": "reboot_requested_at"},
        ))

    def release_claim(self, instance: Instance, claimed_at: float, retry_at: float) -> bool:
        """The reboot API refused the call (nothing happened): let the next try issue it."""
        return self.db.apply(self.instances.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING],
            remove_fields=list(REBOOT_CLAIM_ATTRIBUTES), deadline_at=retry_at,
            extra_condition="#rq = :rq AND #rc = :rc AND attribute_not_exists(#ri)",
            extra_values={":rq": instance.reboot_requested_at, ":rc": claimed_at},
            extra_names={"#rq": "reboot_requested_at", "#rc": "reboot_claimed_at", "#ri": "reboot_issued_at"},
        ))

    def record_agent_disconnected(self, instance: Instance, at: float, version: int, agent: str) -> bool:
        """The agent seen disconnected after the reboot request: the first time, or again
        after the reconnect recorded as read (that outage was not the reboot: the new one
        replaces it)."""
        if instance.reconnected_at is None:
            condition, values = "attribute_not_exists(#dc)", {}
        else:
            condition, values = "#ra = :ra", {":ra": instance.reconnected_at}
        return self.db.apply(self.instances.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING],
            set_fields={"disconnected_at": at, "disconnected_version": version, "disconnected_agent": agent},
            remove_fields=["reconnected_at", "reconnected_version", "reconnected_agent"],
            extra_condition=f"#rq = :rq AND {condition}",
            extra_values={":rq": instance.reboot_requested_at, **values},
            extra_names={"#rq": "reboot_requested_at",
                         **({"#dc": "disconnected_at"} if instance.reconnected_at is None
                            else {"#ra": "reconnected_at"})},
        ))

    def record_agent_reconnected(self, instance: Instance, at: float, version: int, agent: str) -> bool:
        """The agent's first reconnect after the recorded disconnect, when it did not bring
        the node back (domain.policy: no proof of a reboot yet)."""
        return self.db.apply(self.instances.instance_update(
            instance.container_inst_id, from_states=[InstanceState.REBOOTING],
            set_fields={"reconnected_at": at, "reconnected_version": version, "reconnected_agent": agent},
            extra_condition="#rq = :rq AND #dc = :dc AND attribute_not_exists(#ra)",
            extra_values={":rq": instance.reboot_requested_at, ":dc": instance.disconnected_at},
            extra_names={"#rq": "reboot_requested_at", "#dc": "disconnected_at", "#ra": "reconnected_at"},
        ))
