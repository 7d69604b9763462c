"""The recovery loop's repository: the aggregates of its two tables, one container the
composition root hands each stage the aggregates it uses from."""

from __future__ import annotations

from typing import Any

from gpu_recovery.repository.aws_notices import AwsNoticeRepository
from gpu_recovery.repository.breaker import BreakerRepository
from gpu_recovery.repository.gang_fanouts import GangFanoutRepository
from gpu_recovery.repository.gpu_resets import GpuResetRepository
from gpu_recovery.repository.health_checks import HealthCheckRepository
from gpu_recovery.repository.instances import Instances
from gpu_recovery.repository.jobs_and_ranks import JobsAndRanks
from gpu_recovery.repository.node_decisions import NodeDecisionRepository
from gpu_recovery.repository.nodes_back import NodeBackRepository
from gpu_recovery.repository.rank_events import RankEventRepository
from gpu_recovery.repository.reboots import RebootRepository
from gpu_recovery.repository.registrations import RegistrationRepository
from gpu_recovery.repository.restarts import RestartRepository
from gpu_recovery.repository.tables import RecoveryTables
from gpu_recovery.repository.validations import ValidationRepository
from gpu_recovery.repository.verdict_leases import VerdictLeaseRepository
from gpu_recovery.repository.warnings import WarningRepository


class Repository:
    """The aggregates of the recovery loop's tables, and nothing of its own (no read, no
    intent): ``jobs`` (a job and its ranks), ``instances`` (a container instance), ``tables``
    (the gateway and the update builders the others are built with), and the aggregates a
    stage is handed on its own, each built over the narrowest of those three it needs."""

    def __init__(self, dynamodb: Any, job_table: str, instance_table: str, *,
                 deadline_shards: int = 1) -> None:
        self.tables = tables = RecoveryTables(dynamodb, job_table, instance_table,
                                              deadline_shards=deadline_shards)
        # One state: the aggregates share the tables' gateway and sub-repositories.
        self.jobs = jobs = JobsAndRanks.over(tables)  # a job and its ranks: reads, intents
        self.instances = instances = Instances.over(tables)  # a node: reads, registration, faults
        # The tables' own aggregates.
        self.latches = tables.latches  # rank counts of an attempt
        self.faults = tables.faults  # suspect items, tallies, placements
        self.slots = tables.slots  # health checks running: the cluster's, each job's
        self.cordons = tables.cordons  # known-bad nodes and their ECS attribute syncs
        self.notices = tables.notices  # e-mails owed (the outbox)
        self.preflight = tables.preflight  # gang preflights and the fleet's baselines
        self.tenant_evidence = tables.tenant_evidence  # suspects the stack's check cleared
        self.node_tasks = tables.node_tasks  # a node task's claim, every kind's
        self.deadlines = tables.deadlines  # the deadline index's reads
        self.decisions = NodeDecisionRepository(jobs, instances)  # a node decided with its waiting jobs
        self.breaker = BreakerRepository(tables)  # the blast-radius breaker, the jobs it holds
        self.verdict_leases = VerdictLeaseRepository(tables)  # one delivery works a check's verdict
        self.warnings = WarningRepository(tables)  # the driver's warnings on a node
        self.aws_notices = AwsNoticeRepository(jobs)  # AWS's notices on a node
        self.nodes_back = NodeBackRepository(instances)  # a node back from its repair, its jobs released
        self.validations = ValidationRepository(instances, self.nodes_back)  # a repaired node's validation
        self.gpu_resets = GpuResetRepository(instances)  # a node's GPU reset fallen back to a reboot
        self.health_checks = HealthCheckRepository(instances)  # a node's health check: opened, claimed...
        self.reboots = RebootRepository(instances)  # a node's reboot, quarantine, termination
        self.registrations = RegistrationRepository(jobs)  # a rank's registration, its task looked up
        self.fanouts = GangFanoutRepository(tables)  # a gang's fan-outs sent once, each rank's launch lease
        self.restarts = RestartRepository(jobs)  # a job's gang restart: claimed, waiting, requeued
        self.rank_events = RankEventRepository(jobs)  # a rank running or stopped, the fault it opens
