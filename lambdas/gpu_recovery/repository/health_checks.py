"""A node's health check (``recovery.health_checks``): its intents on the instance item.

A check is opened for the jobs that suspect the node (HEALTH_CHECK_PENDING, the jobs in
``hc_jobs``), claimed with a slot of the cluster's and of its owner's share (HEALTH_CHECKING,
its claim in the ``hc_*`` attributes, ``claim_fields.HEALTH_CHECK``), or left waiting in its
owner's queue for a slot; a claim StartTask did not place, and a check that ended without a
verdict, go back to HEALTH_CHECK_PENDING with their slots given back after the commit. Its
verdict is a node decision (``node_decisions``).
"""

from __future__ import annotations

from dataclasses import replace

from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.states import HEALTH_CHECK_STATES, InstanceState
from gpu_recovery.repository.claim_fields import HEALTH_CHECK as CHECK_CLAIM
from gpu_recovery.repository.health_check_slots import (
    WAIT_SWEEP_SECONDS,
    Claim,
    HealthCheckClaim,
    HealthCheckSlots,
)
from gpu_recovery.repository.instances import Instances


class HealthCheckRepository:
    """Intents of a node's health check (``repo.health_checks``)."""

    def __init__(self, instances: Instances) -> None:
        self.instances = instances
        self.db, self.slots, self.node_tasks = instances.db, instances.slots, instances.node_tasks

    def open(self, inst_id: str, job_id: str, *, now: float, retry_at: float,
             grouped: bool = False) -> bool:
        """AVAILABLE / SUSPECT (or unknown) -> HEALTH_CHECK_PENDING with this job waiting.
        ``grouped``: the check waits for others of its job to start with it (``hc_grouped``)."""
        return self.db.apply(self.instances.instance_update(
            inst_id, from_states=[InstanceState.AVAILABLE, InstanceState.SUSPECT], allow_missing=True,
            to=InstanceState.HEALTH_CHECK_PENDING,
            set_fields={"hc_requested_at": now, "hc_start_attempts": 0,
                        **({"hc_grouped": True} if grouped else {})},
            add_to_sets={"hc_jobs": {job_id}},
            # A lost node's own check (SUSPECT, ``validation``) gives way to the job's.
            remove_fields=["hc_task_arn", "hc_started_by", "hc_lease_until", CHECK_CLAIM.token,
                           "waiting_jobs", "validation", *([] if grouped else ["hc_grouped"])],
            deadline_at=retry_at,
        ))

    def join(self, inst_id: str, job_id: str) -> bool:
        return self.db.apply(self.instances.instance_update(
            inst_id, from_states=HEALTH_CHECK_STATES, add_to_sets={"hc_jobs": {job_id}}))

    def claim(self, instance: Instance, started_by: str, lease_until: float, *, owner: str,
              per_job: int, cluster: int, now: float) -> HealthCheckClaim:
        """HEALTH_CHECK_PENDING -> HEALTH_CHECKING with a slot of the cluster's and one of
        ``owner``'s: the claim is committed before StartTask, and its startedBy finds the
        task again if the answer to StartTask is lost. A job's share as large as the
        cluster's can never be the limit that binds: no share is counted then (one hot
        item less in every claim and verdict), and the instance says so for the release.
        CLAIMED comes with the instance as the claim wrote it (its shard, its job slot)."""
        job_slot = HealthCheckSlots.keeps_job_share(per_job=per_job, cluster=cluster)
        claim = self.instances.instance_update(
            instance.container_inst_id, from_states=[InstanceState.HEALTH_CHECK_PENDING],
            to=InstanceState.HEALTH_CHECKING,
            set_fields={"hc_started_by": started_by, "hc_lease_until": lease_until, "hc_owner": owner,
                        "hc_claimed_at": now, "hc_job_slot": job_slot},
            remove_fields=HealthCheckSlots.wait_attributes(), deadline_at=lease_until,
            extra_condition="#att = :att", extra_values={":att": instance.check.attempts},
            extra_names={"#att": "hc_start_attempts"},
        )
        taken = self.slots.claim(claim, owner, per_job=per_job if job_slot else None, cluster=cluster,
                                 now=now)
        if taken.outcome is not Claim.CLAIMED:
            return HealthCheckClaim(taken.outcome)
        claimed = CHECK_CLAIM.with_claim(instance, started_by=started_by, claimed_at=now,
                                         lease_until=lease_until)
        return HealthCheckClaim(Claim.CLAIMED, replace(
            claimed, state=InstanceState.HEALTH_CHECKING, hc_owner=owner, hc_job_slot=job_slot,
            hc_slot_shard=taken.shard, hc_slot_token=taken.token, hc_waiting_for_slot=False,
            deadline_at=lease_until))

    def wait_for_slot(self, instance: Instance, owner: str, now: float) -> bool:
        """No slot free: the pending check waits in its owner's queue (no time limit while it
        waits; the sweep looks at it every ten minutes)."""
        return self.db.apply(self.instances.instance_update(
            instance.container_inst_id, from_states=[InstanceState.HEALTH_CHECK_PENDING],
            set_fields=HealthCheckSlots.wait_fields(owner), deadline_at=now + WAIT_SWEEP_SECONDS,
            extra_condition="#att = :att", extra_values={":att": instance.check.attempts},
            extra_names={"#att": "hc_start_attempts"}))

    def abandon(self, instance: Instance, reason: str) -> bool:
        """A pending check no job waits for any more (they all moved on): the node is
        AVAILABLE again, as it was before it was suspected."""
        return self.db.apply(self.instances.instance_update(
            instance.container_inst_id, from_states=[InstanceState.HEALTH_CHECK_PENDING],
            to=InstanceState.AVAILABLE, set_fields={"hc_abandoned": reason[:300]},
            remove_fields=["hc_jobs", "hc_left", "hc_started_by", "hc_lease_until",
                           *HealthCheckSlots.wait_attributes()],
            clear_deadline=True, extra_condition="#att = :att",
            extra_values={":att": instance.check.attempts}, extra_names={"#att": "hc_start_attempts"}))

    def release_claim(self, instance: Instance, started_by: str, *, placement_failed: bool,
                      retry_at: float) -> bool:
        """StartTask answered and started nothing: back to HEALTH_CHECK_PENDING, its slot
        given back (after the commit); a placement that failed counts as an attempt."""
        return self.instances.commit_leaving_check(instance, [self.node_tasks.release_update(
            CHECK_CLAIM, instance, started_by, retry_at, counted=placement_failed,
            to=InstanceState.HEALTH_CHECK_PENDING, also_removed=HealthCheckSlots.held_attributes()),
            *self.slots.release(instance)])

    def retry(self, instance: Instance, started_by: str, retry_at: float) -> bool:
        """The check ended without a verdict (image pull, OOM...): run it again (its slot
        given back after the commit; it takes one again when it starts)."""
        return self.instances.commit_leaving_check(instance, [self.node_tasks.release_update(
            CHECK_CLAIM, instance, started_by, retry_at, attempt_used=True,
            to=InstanceState.HEALTH_CHECK_PENDING, also_removed=HealthCheckSlots.held_attributes()),
            *self.slots.release(instance)])
