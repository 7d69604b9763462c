"""The claim of a node task (a health check, a GPU reset, a validation after repair): where
each kind keeps it on the instance item, declared once (:class:`ClaimFields`), and its
intents, written the one way for every kind (:class:`NodeTaskClaims`).

A claim is three attributes: its ``startedBy`` (committed before StartTask, deterministic
per claim), when it was claimed (its lease runs from there) and the task's ARN (recorded
after StartTask answered). Each write is conditional on the claim's scope (the node decision
or the validation the task serves: a claim of a decision since replaced never moves) and on
the claim itself, so a delivery that died between two writes is finished by the next one or
by the sweep, never repeated; a write that must hold only on the claim as read (a failed
validation's decision, its stall) takes its condition from the declaration (``held``).

The health check's claim is declared too (``HEALTH_CHECK``): its task is recorded, a dead
claim taken over and a claim given back by the same intents (its release, ``release_update``,
also moves the node back to HEALTH_CHECK_PENDING and drops its slots' attributes, in
``instances``). Making it is its own (``instances.claim_health_check``): it takes a slot of
the cluster's and of its job's share, then moves the node to HEALTH_CHECKING.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.tables import RecoveryTables

# A condition with its values and names, as ``instance_update`` takes them.
Condition = tuple[str, dict[str, Any], dict[str, str]]


@dataclass(frozen=True)
class TaskClaim:
    """A node task's claim as the instance item holds it."""

    started_by: str  # "": not claimed
    claimed_at: float
    task_arn: str  # "": not recorded (not started, or its answer lost)


@dataclass(frozen=True)
class ClaimFields:
    """Where one kind of node task keeps its claim: attribute paths of the instance item
    (``map.key``: a key of a map attribute), and the condition naming what it serves."""

    started_by: str
    claimed_at: str
    task_arn: str
    scope: Callable[[Instance], Condition]
    attempts: str = ""  # a task that ended without a verdict is counted here ("": not counted)
    state: InstanceState = InstanceState.REBOOTING  # the node's state while the claim is held
    # Where the lease's end is kept ("": it runs from ``claimed_at``, which a take-over moves;
    # declared: ``claimed_at`` stays when the claim is taken over, the task's time runs from it).
    lease_until: str = ""

    @property
    def paths(self) -> tuple[str, str, str]:
        """The claim's three attribute paths (what a new claim or decision clears)."""
        return self.started_by, self.claimed_at, self.task_arn

    def read(self, instance: Instance) -> TaskClaim:
        started_by, claimed_at, task_arn = (_get(instance, path) for path in self.paths)
        return TaskClaim(str(started_by or ""), float(claimed_at or 0.0), str(task_arn or ""))

    def held(self, instance: Instance, tag: str = "sb") -> Condition:
        """The claim as ``instance`` holds it: its startedBy, or none (names tagged ``tag``)."""
        path, names = _names(self.started_by, tag)
        started_by = self.read(instance).started_by
        if started_by:
            return f"{path} = :{tag}", {f":{tag}": started_by}, names
        return f"attribute_not_exists({path})", {}, names

    def serving(self, instance: Instance, tag: str = "sb") -> Condition:
        """What the claim serves (``scope``) and the claim as read (``held``), both."""
        return _both(self.scope(instance), self.held(instance, tag))

    def claimed(self, instance: Instance, started_by: str, claimed_at: float) -> Instance:
        """``instance`` as a claim wrote it."""
        return _set(_set(instance, self.started_by, started_by), self.claimed_at, claimed_at)

    def lease_ends_at(self, instance: Instance, lease_seconds: float) -> float:
        """When no claimer may still be starting the task: the lease kept apart, or
        ``lease_seconds`` after the claim (or its last take-over)."""
        if self.lease_until:
            return float(_get(instance, self.lease_until) or 0.0)
        return self.read(instance).claimed_at + lease_seconds

    def lease_ended(self, instance: Instance, now: float, lease_seconds: float) -> bool:
        return self.lease_ends_at(instance, lease_seconds) <= now

    def taken_over(self, instance: Instance, now: float, lease_until: float) -> Instance:
        """``instance`` as a take-over wrote it (``NodeTaskClaims.take_over_node_task``)."""
        if self.lease_until:
            return _set(instance, self.lease_until, lease_until)
        return _set(instance, self.claimed_at, now)


def _get(instance: Instance, path: str) -> Any:
    attribute, _, key = path.partition(".")
    value = getattr(instance, attribute)
    return (value or {}).get(key) if key else value


def _set(instance: Instance, path: str, value: Any) -> Instance:
    attribute, _, key = path.partition(".")
    if key:
        value = {**(getattr(instance, attribute) or {}), key: value}
    return replace(instance, **{attribute: value})


def _both(first: Condition, second: Condition) -> Condition:
    """Two conditions that must both hold (either may be "": none)."""
    return (" AND ".join(part for part in (first[0], second[0]) if part), {**first[1], **second[1]},
            {**first[2], **second[2]})


def _names(path: str, tag: str) -> tuple[str, dict[str, str]]:
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


GPU_RESET = ClaimFields("reset_started_by", "reset_claimed_at", "reset_task_arn", _decision)
VALIDATION = ClaimFields("validation.started_by", "validation.claimed_at", "validation.task_arn", _validation,
                         attempts="validation.attempts")
# Its time runs from its claim (``hc_claimed_at``), its lease is kept apart.
HEALTH_CHECK = ClaimFields("hc_started_by", "hc_claimed_at", "hc_task_arn", _check,
                           attempts="hc_start_attempts", state=InstanceState.HEALTH_CHECKING,
                           lease_until="hc_lease_until")


class NodeTaskClaims(RecoveryTables):
    """A node task's claim, for every kind declared by :class:`ClaimFields`."""

    def claim_update(self, fields: ClaimFields, instance: Instance, claim: str, values: dict[str, Any],
                     names: dict[str, str], **changes: Any) -> Update:
        """A write on the node while its kind's claim is held (its state), on what the claim
        serves (its scope) and on ``claim`` (a condition on the claim itself, "": none)."""
        condition, values, names = _both(fields.scope(instance), (claim, values, names))
        return self.instance_update(
            instance.container_inst_id, from_states=[fields.state], extra_condition=condition or None,
            extra_values=values, extra_names=names, **changes)

    def claim_node_task(self, fields: ClaimFields, instance: Instance, started_by: str, now: float,
                        lease_until: float) -> bool:
        """The intent to start the task (one claimer), committed before StartTask; the sweep
        looks at it at ``lease_until`` (its claimer may have died)."""
        sb, names = _names(fields.started_by, "sb")
        return self.db.apply(self.claim_update(
            fields, instance, f"attribute_not_exists({sb})", {}, names,
            set_fields={fields.started_by: started_by, fields.claimed_at: now}, deadline_at=lease_until))

    def take_over_node_task(self, fields: ClaimFields, instance: Instance, now: float,
                            lease_until: float) -> bool:
        """A claim whose task was never recorded (its claimer died, or StartTask's answer was
        lost) and whose lease has ended: the taker looks the task up by its startedBy before
        starting one. One taker wins: the lease, as read, is the condition."""
        sb, sb_names = _names(fields.started_by, "sb")
        ta, ta_names = _names(fields.task_arn, "ta")
        if fields.lease_until:
            lease, lease_names = _names(fields.lease_until, "lu")
            ended = f"(attribute_not_exists({lease}) OR {lease} < :now)"
            lease_values, renewed = {":now": now}, {fields.lease_until: lease_until}
        else:
            lease, lease_names = _names(fields.claimed_at, "ca")
            ended = f"{lease} = :ca"
            lease_values, renewed = {":ca": _get(instance, fields.claimed_at)}, {fields.claimed_at: now}
        return self.db.apply(self.claim_update(
            fields, instance, f"{sb} = :sb AND attribute_not_exists({ta}) AND {ended}",
            {":sb": fields.read(instance).started_by, **lease_values},
            {**sb_names, **ta_names, **lease_names}, set_fields=renewed, deadline_at=lease_until))

    def release_node_task(self, fields: ClaimFields, instance: Instance, started_by: str, retry_at: float, *,
                          attempt_used: bool = False) -> bool:
        """Nothing runs: StartTask refused or placed nothing (no task recorded), or the task
        ended without a verdict (``attempt_used``: counted, the next start is a new attempt
        with its own startedBy). The next try claims it again at ``retry_at``."""
        return self.db.apply(self.release_update(fields, instance, started_by, retry_at,
                                                 attempt_used=attempt_used))

    def release_update(self, fields: ClaimFields, instance: Instance, started_by: str, retry_at: float, *,
                       attempt_used: bool = False, counted: bool | None = None,
                       also_removed: Sequence[str] = (), **changes: Any) -> Update:
        """``release_node_task``'s write, for a kind whose release does more in it (the health
        check's: back to HEALTH_CHECK_PENDING, its slots' attributes removed). ``counted``:
        the attempt is counted (by default when it was used)."""
        sb, names = _names(fields.started_by, "sb")
        claim = f"{sb} = :sb"
        if not attempt_used:
            ta, ta_names = _names(fields.task_arn, "ta")
            claim, names = f"{claim} AND attribute_not_exists({ta})", {**names, **ta_names}
        counted = attempt_used if counted is None else counted
        removed = [*(fields.paths if attempt_used else fields.paths[:2]),
                   *([fields.lease_until] if fields.lease_until else []), *also_removed]
        return self.claim_update(
            fields, instance, claim, {":sb": started_by}, names, remove_fields=removed,
            increments={fields.attempts: 1} if counted and fields.attempts else None, deadline_at=retry_at,
            **changes)

    def record_node_task(self, fields: ClaimFields, instance: Instance, started_by: str, task_arn: str,
                         deadline_at: float) -> bool:
        """StartTask answered (or the task's STOPPED event came first): the task to wait for
        (its STOPPED event, or the sweep's look); a lease kept apart ends with it."""
        sb, names = _names(fields.started_by, "sb")
        return self.db.apply(self.claim_update(
            fields, instance, f"{sb} = :sb", {":sb": started_by}, names,
            set_fields={fields.task_arn: task_arn}, deadline_at=deadline_at,
            remove_fields=[fields.lease_until] if fields.lease_until else None))

    def rearm_node_task(self, fields: ClaimFields, instance: Instance, deadline_at: float) -> bool:
        """Still waiting (GPUs busy, a claim in flight, the task running): looked at again then."""
        return self.db.apply(self.claim_update(fields, instance, "", {}, {}, deadline_at=deadline_at))
