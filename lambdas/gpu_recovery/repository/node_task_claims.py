"""The claim of a node task (a health check, a GPU reset, a validation after repair): its
intents, written the one way for every kind (:class:`NodeTaskClaims`) over where each kind
keeps it on the instance item (``claim_fields``).

A claim is four attributes: its ``startedBy`` (committed before StartTask, deterministic
per claim), when it was claimed (its lease runs from there), the task's ARN (recorded
after StartTask answered) and its claimer's token (random per try: a claim or take-over
whose answer was lost passes again for that try alone). Each write is conditional on the
claim's scope (the node decision or the validation the task serves: a claim of a decision
since replaced never moves) and on the claim itself, so a delivery that died between two
writes is finished by the next one or by the sweep, never repeated; a write that must hold
only on the claim as read (a failed validation's decision, its stall) takes its condition
from the declaration (``held``).

The health check's claim is declared too (``HEALTH_CHECK``): its task is recorded, a dead
claim taken over and a claim given back by the same intents (its release, ``release_update``,
also moves the node back to HEALTH_CHECK_PENDING and drops its slots' attributes, in
``health_checks``). Making it is its own (``HealthCheckRepository.claim``): it takes a slot of
the cluster's and of its job's share, then moves the node to HEALTH_CHECKING.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpu_recovery.domain.models import Instance
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.claim_fields import ClaimFields, both, names_of


class NodeTaskClaims:
    """A node task's claim, for every kind declared by :class:`ClaimFields` (``repo.node_tasks``)."""

    def __init__(self, tables: Any) -> None:  # the RecoveryTables that carry it
        self.tables = tables
        self.db = tables.db

    def claim_update(self, fields: ClaimFields, instance: Instance, claim: str, values: dict[str, Any],
                     names: dict[str, str], **changes: Any) -> Update:
        """A write on the node while its kind's claim is held (its state), on what the claim
        serves (its scope) and on ``claim`` (a condition on the claim itself, "": none)."""
        condition, values, names = both(fields.scope(instance), (claim, values, names))
        return self.tables.instance_update(
            instance.container_inst_id, from_states=[fields.state, *fields.also_states],
            extra_condition=condition or None, extra_values=values, extra_names=names, **changes)

    def claim(self, fields: ClaimFields, instance: Instance, started_by: str, now: float,
              lease_until: float, token: str) -> bool:
        """The intent to start the task (one claimer), committed before StartTask; the sweep
        looks at it at ``lease_until`` (its claimer may have died). The claimer's ``token``
        passes again: a claim written whose answer was lost is the claimer's on its next try."""
        sb, names = names_of(fields.started_by, "sb")
        return self.db.apply(self.claim_update(
            fields, instance, *self._or_own(fields, f"attribute_not_exists({sb})", {}, names, token),
            set_fields={fields.started_by: started_by, fields.claimed_at: now, fields.token: token},
            deadline_at=lease_until))

    @staticmethod
    def _or_own(fields: ClaimFields, claim: str, values: dict[str, Any], names: dict[str, str],
                token: str) -> tuple[str, dict[str, Any], dict[str, str]]:
        """``claim``, or the claim already this try's (its ``token``)."""
        tk, tk_names = names_of(fields.token, "tk")
        return f"({claim}) OR {tk} = :tk", {**values, ":tk": token}, {**names, **tk_names}

    def take_over(self, fields: ClaimFields, instance: Instance, now: float,
                  lease_until: float, token: str) -> bool:
        """A claim whose task was never recorded (its claimer died, or StartTask's answer was
        lost) and whose lease has ended: the taker looks the task up by its startedBy before
        starting one. One taker wins: the lease, as read, is the condition (or the taker's
        own ``token``, as :meth:`claim`'s)."""
        sb, sb_names = names_of(fields.started_by, "sb")
        ta, ta_names = names_of(fields.task_arn, "ta")
        lease_values: dict[str, Any]
        if fields.lease_until:
            lease, lease_names = names_of(fields.lease_until, "lu")
            ended = f"(attribute_not_exists({lease}) OR {lease} < :now)"
            lease_values, renewed = {":now": now}, {fields.lease_until: lease_until}
        else:
            lease, lease_names = names_of(fields.claimed_at, "ca")
            ended = f"{lease} = :ca"
            lease_values, renewed = {":ca": fields.read(instance).claimed_at}, {fields.claimed_at: now}
        return self.db.apply(self.claim_update(
            fields, instance, *self._or_own(
                fields, f"{sb} = :sb AND attribute_not_exists({ta}) AND {ended}",
                {":sb": fields.read(instance).started_by, **lease_values},
                {**sb_names, **ta_names, **lease_names}, token),
            set_fields={**renewed, fields.token: token}, deadline_at=lease_until))

    def release(self, fields: ClaimFields, instance: Instance, started_by: str, retry_at: float, *,
                attempt_used: bool = False) -> bool:
        """Nothing runs: StartTask refused or placed nothing (no task recorded), or the task
        ended without a verdict (``attempt_used``: counted, the next start is a new attempt
        with its own startedBy). The next try claims it again at ``retry_at``."""
        return self.db.apply(self.release_update(fields, instance, started_by, retry_at,
                                                 attempt_used=attempt_used))

    def release_update(self, fields: ClaimFields, instance: Instance, started_by: str, retry_at: float, *,
                       attempt_used: bool = False, counted: bool | None = None,
                       also_removed: Sequence[str] = (), **changes: Any) -> Update:
        """``release``'s write, for a kind whose release does more in it (the health
        check's: back to HEALTH_CHECK_PENDING, its slots' attributes removed). ``counted``:
        the attempt is counted (by default when it was used)."""
        sb, names = names_of(fields.started_by, "sb")
        claim = f"{sb} = :sb"
        if not attempt_used:
            ta, ta_names = names_of(fields.task_arn, "ta")
            claim, names = f"{claim} AND attribute_not_exists({ta})", {**names, **ta_names}
        counted = attempt_used if counted is None else counted
        # (No task recorded when the attempt was not used: its ARN's removal does nothing.)
        removed = [*fields.paths, *([fields.lease_until] if fields.lease_until else []), *also_removed]
        return self.claim_update(
            fields, instance, claim, {":sb": started_by}, names, remove_fields=removed,
            increments={fields.attempts: 1} if counted and fields.attempts else None, deadline_at=retry_at,
            **changes)

    def record(self, fields: ClaimFields, instance: Instance, started_by: str, task_arn: str,
               deadline_at: float) -> bool:
        """StartTask answered (or the task's STOPPED event came first): the task to wait for
        (its STOPPED event, or the sweep's look); a lease kept apart ends with it."""
        sb, names = names_of(fields.started_by, "sb")
        return self.db.apply(self.claim_update(
            fields, instance, f"{sb} = :sb", {":sb": started_by}, names,
            set_fields={fields.task_arn: task_arn}, deadline_at=deadline_at,
            remove_fields=[fields.lease_until] if fields.lease_until else None))

    def rearm(self, fields: ClaimFields, instance: Instance, deadline_at: float) -> bool:
        """Still waiting (GPUs busy, a claim in flight, the task running): looked at again then."""
        return self.db.apply(self.claim_update(fields, instance, "", {}, {}, deadline_at=deadline_at))
