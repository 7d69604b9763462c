"""The only DynamoDB user: one module per aggregate's records, over shared plumbing.

* ``recovery_loop`` — :class:`Repository`, the recovery loop's: a container of the aggregates
  below, with no read or intent of its own (``repo.jobs``, ``repo.instances``, ``repo.tables``
  and the sub-repositories).
* ``base`` — value mapping, :class:`Update`, transactions, batched reads.
* ``records`` — job, rank and instance items as the domain's objects, and back.
* ``tables`` — what the recovery loop's repositories share: the two tables, the builders
  of a job's, a rank's and an instance's conditional update, the deadline index
  (``repo.tables``).
* ``jobs_and_ranks`` — a job and its ranks: reads, intents (``repo.jobs``).
* ``registrations`` — a rank's registration: its job and rank items, its task looked up.
* ``instances`` — a container instance: reads, registration, its fault history
  (``repo.instances``).
* ``nodes_back`` — a node back from its repair: AVAILABLE (or validating), its jobs released.
* ``deadlines`` — the deadline index: what is due, every job item carrying one, one pushed or cleared.
* ``reboots`` — a node's reboot, quarantine and termination, its agent's outage.
* ``health_checks`` — a node's health check: opened, claimed with its slots, given back, retried.
* ``gpu_resets`` — a node's GPU reset fallen back to a reboot (its pass is a node back).
* ``warnings`` — the driver's warning on a node: its cordon, the jobs asked to move, its end.
* ``aws_notices`` — AWS's notice on a node: its cordon, the jobs asked to leave, its end.
* ``validations`` — a repaired node's validation: passed, stalled (a failure is a node decision).
* ``claim_fields`` — where each kind of node task (a check, a reset, a validation) keeps its claim.
* ``node_task_claims`` — a node task's claim: made, recorded, taken over, given back, for every kind.
* ``node_decisions`` — one transaction over a node and every job waiting for it.
* ``breaker`` — the blast-radius breaker's item and the jobs it holds.
* ``verdict_leases`` — the lease one delivery of a health check's STOPPED event takes on its verdict.
* ``node_decisions``, ``registrations``, ``rank_events``, ``gang_fanouts``, ``restarts``,
  ``nodes_back``, ``deadlines``, ``node_task_claims``, ``health_checks``, ``reboots``,
  ``validations``, ``gpu_resets``, ``breaker``, ``verdict_leases``, ``warnings``,
  ``aws_notices``, ``faults``, ``latches``, ``health_check_slots``, ``cordons``, ``notices`` —
  the sub-repositories a :class:`Repository` carries, each handed to the stages that use it
  (``repo.decisions``, ``repo.registrations``, ``repo.rank_events``, ``repo.fanouts``,
  ``repo.restarts``, ``repo.nodes_back``, ``repo.deadlines``, ``repo.node_tasks``,
  ``repo.health_checks``, ``repo.reboots``, ``repo.validations``, ``repo.gpu_resets``,
  ``repo.breaker``, ``repo.verdict_leases``, ``repo.warnings``, ``repo.aws_notices``,
  ``repo.faults``, ``repo.latches``, ``repo.slots``, ``repo.cordons``, ``repo.notices``).
* ``heartbeat``, ``scheduling``, ``time_sharing``, ``jobs_api``, ``rate_limit`` — the
  other services' records, on the same tables.

Services receive repositories from ``gpu_recovery.runtime`` and call their intents
(``jobs.finish_job``, ``rank_events.enter_recovery``, ``decisions.record``,
``health_checks.claim``...): a stage is handed the one aggregate it reads, or the container
when it needs several (its protocol names each one's operations apart); no
condition expression is written outside this package. An intent returns False when its
condition did not hold (a duplicate, a race lost, a state moved on); it raises on any other
error, having written nothing (single items and transactions are all-or-nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_recovery.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from gpu_recovery.repository.base import (
        MAX_HISTORY,
        DynamoGateway,
        Update,
        from_ddb,
        is_condition_failure,
        state_condition,
        to_ddb,
    )
    from gpu_recovery.repository.jobs_and_ranks import RankStop
    from gpu_recovery.repository.node_decisions import JobFailure, JobVerdict, NodeDecision
    from gpu_recovery.repository.recovery_loop import Repository
    from gpu_recovery.repository.verdict_leases import VerdictLease

# Each name is imported when first asked for: a function that reads one small table (the
# authorizers' token lookups) does not load every aggregate of the recovery loop's.
_HOMES = {
    **dict.fromkeys(("MAX_HISTORY", "DynamoGateway", "Update", "from_ddb", "is_condition_failure",
                     "state_condition", "to_ddb"), "base"),
    "RankStop": "jobs_and_ranks",
    **dict.fromkeys(("JobFailure", "JobVerdict", "NodeDecision"), "node_decisions"),
    "Repository": "recovery_loop",
    "VerdictLease": "verdict_leases",
}

__getattr__ = lazy_exports(__name__, _HOMES)


__all__ = [
    "MAX_HISTORY",
    "DynamoGateway",
    "JobFailure",
    "JobVerdict",
    "NodeDecision",
    "RankStop",
    "Repository",
    "Update",
    "VerdictLease",
    "from_ddb",
    "is_condition_failure",
    "state_condition",
    "to_ddb",
]
