"""Where each kind of node task keeps its claim on the instance item (:class:`ClaimFields`),
declared once: the domain sees every kind's claim in one shape (``Instance.tasks``, a
``TaskClaim`` by kind), the item keeps each where it always did (the health check's ``hc_*``
attributes, the GPU reset's ``reset_*``, keys of the ``validation`` map), so a task started
before an upgrade is found after it. ``records.instance_from_item`` reads them through here;
``node_task_claims`` writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpu_recovery.domain.models import (
    GPU_RESET_TASK,
    HEALTH_CHECK_TASK,
    NO_CLAIM,
    VALIDATION_TASK,
    Instance,
    TaskClaim,
)
from gpu_recovery.domain.states import InstanceState

# A condition with its values and names, as ``instance_update`` takes them.
Condition = tuple[str, dict[str, Any], dict[str, str]]


@dataclass(frozen=True)
class ClaimFields:
    """Where one kind of node task keeps its claim: attribute paths of the instance item
    (``map.key``: a key of a map attribute), and the condition naming what it serves."""

    kind: str  # its key in ``Instance.tasks``
    started_by: str
    claimed_at: str
    task_arn: str
    # The token of the claim's last claimer (or taker), random per try: its condition passes
    # again for that try alone, so a write whose answer was lost is not read as raced.
    token: str
    scope: Callable[[Instance], Condition]
    attempts: str = ""  # a task that ended without a verdict is counted here ("": not counted)
    state: InstanceState = InstanceState.REBOOTING  # the node's state while the claim is held
    also_states: tuple[InstanceState, ...] = ()  # ... or one of these (its scope tells them apart)
    # Where the lease's end is kept ("": it runs from ``claimed_at``, which a take-over moves;
    # declared: ``claimed_at`` stays when the claim is taken over, the task's time runs from it).
    lease_until: str = ""

    @property
    def paths(self) -> tuple[str, str, str, str]:
        """The claim's attribute paths (what a new claim or decision clears)."""
        return self.started_by, self.claimed_at, self.task_arn, self.token

    def from_item(self, item: Mapping[str, Any]) -> TaskClaim:
        """The claim as the (plain, ``from_ddb``) item stores it."""
        def get(path: str) -> Any:
            attribute, _, key = path.partition(".")
            value = item.get(attribute)
            return (value or {}).get(key) if key else value

        return TaskClaim(started_by=str(get(self.started_by) or ""), claimed_at=get(self.claimed_at),
                         task_arn=str(get(self.task_arn) or ""),
                         lease_until=get(self.lease_until) if self.lease_until else None,
                         attempts=int(get(self.attempts) or 0) if self.attempts else 0)

    def read(self, instance: Instance) -> TaskClaim:
        return instance.task(self.kind)

    def held(self, instance: Instance, tag: str = "sb") -> Condition:
        """The claim as ``instance`` holds it: its startedBy, or none (names tagged ``tag``)."""
        path, names = names_of(self.started_by, tag)
        started_by = self.read(instance).started_by
        if started_by:
            return f"{path} = :{tag}", {f":{tag}": started_by}, names
        return f"attribute_not_exists({path})", {}, names

    def serving(self, instance: Instance, tag: str = "sb") -> Condition:
        """What the claim serves (``scope``) and the claim as read (``held``), both."""
        return both(self.scope(instance), self.held(instance, tag))

    def claimed(self, instance: Instance, started_by: str, claimed_at: float) -> Instance:
        """``instance`` as a claim wrote it."""
        return self.with_claim(instance, started_by=started_by, claimed_at=claimed_at)

    def with_claim(self, instance: Instance, **changes: Any) -> Instance:
        """``instance`` with its claim of this kind changed."""
        return replace(instance, tasks={**instance.tasks, self.kind: replace(self.read(instance), **changes)})

    def lease_ends_at(self, instance: Instance, lease_seconds: float) -> float:
        """When no claimer may still be starting the task: the lease kept apart, or
        ``lease_seconds`` after the claim (or its last take-over)."""
        claim = self.read(instance)
        if self.lease_until:
            return float(claim.lease_until or 0.0)
        return float(claim.claimed_at or 0.0) + lease_seconds

    def lease_ended(self, instance: Instance, now: float, lease_seconds: float) -> bool:
        return self.lease_ends_at(instance, lease_seconds) <= now

    def taken_over(self, instance: Instance, now: float, lease_until: float) -> Instance:
        """``instance`` as a take-over wrote it (``NodeTaskClaims.take_over``)."""
        if self.lease_until:
            return self.with_claim(instance, lease_until=lease_until)
        return self.with_claim(instance, claimed_at=now)


def both(first: Condition, second: Condition) -> Condition:
    """Two conditions that must both hold (either may be "": none; one with an OR is
    parenthesized beside the other, which DynamoDB's AND would otherwise bind first)."""
    parts = [part for part in (first[0], second[0]) if part]
    if len(parts) > 1:
        parts = [f"({part})" if " OR " in part else part for part in parts]
    return " AND ".join(parts), {**first[1], **second[1]}, {**first[2], **second[2]}


def names_of(path: str, tag: str) -> tuple[str, dict[str, str]]:
    """``path`` as a condition names it (``#<tag>0.#<tag>1`` for a map's key)."""
    names = {f"#{tag}{i}": part for i, part in enumerate(path.split("."))}
    return ".".join(names), names


def _decision(instance: Instance) -> Condition:
    """A GPU reset serves the node's decision (its ``reboot_requested_at``) while pending."""
    return ("#rq = :rq AND attribute_exists(#rp)", {":rq": instance.reboot_requested_at},
            {"#rq": "reboot_requested_at", "#rp": "reset_pending"})


def _validation(instance: Instance) -> Condition:
    """A validation's task serves that validation (its ``since``)."""
    return "#v.#si = :si", {":si": instance.validation.get("since")}, {"#v": "validation", "#si": "since"}


def _check(instance: Instance) -> Condition:
    """A health check's claim serves the check the node is in (its state, HEALTH_CHECKING,
    which the verdict or the claim's release ends): no condition besides."""
    return "", {}, {}


GPU_RESET = ClaimFields(GPU_RESET_TASK, "reset_started_by", "reset_claimed_at", "reset_task_arn",
                        "reset_claim_token", _decision)
# A validation after repair (REBOOTING), or a lost node's check once its ECS agent reconnected
# (SUSPECT, ``recovery.lost_node_checks``): the same task and claim, on its ``validation``.
VALIDATION = ClaimFields(VALIDATION_TASK, "validation.started_by", "validation.claimed_at",
                         "validation.task_arn", "validation.claim_token", _validation,
                         attempts="validation.attempts", also_states=(InstanceState.SUSPECT,))
# Its time runs from its claim (``hc_claimed_at``), its lease is kept apart.
HEALTH_CHECK = ClaimFields(HEALTH_CHECK_TASK, "hc_started_by", "hc_claimed_at", "hc_task_arn",
                           "hc_claim_token", _check, attempts="hc_start_attempts",
                           state=InstanceState.HEALTH_CHECKING,
                           lease_until="hc_lease_until")
KINDS = (HEALTH_CHECK, GPU_RESET, VALIDATION)


def claims_of(item: Mapping[str, Any]) -> dict[str, TaskClaim]:
    """Every kind's claim the (plain) instance item holds, by kind (``Instance.tasks``)."""
    return {fields.kind: claim for fields in KINDS if (claim := fields.from_item(item)) != NO_CLAIM}
