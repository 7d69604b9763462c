"""The recovery loop's repository: the aggregates of its two tables, one object the
composition root builds the stages' data from."""

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
from gpu_recovery.repository.validations import ValidationRepository
from gpu_recovery.repository.verdict_leases import VerdictLeaseRepository
from gpu_recovery.repository.warnings import WarningRepository


class Repository(JobsAndRanks, Instances):
    """The reads of jobs, ranks and instances and the intents several stages share (a job's
    end, a rank's stop asked, a node's fault history: its own members, each in the module of its
    aggregate, see the package docstring), and the aggregates a stage is handed on its own:
    ``decisions``, ``registrations``, ``rank_events``, ``fanouts``, ``restarts``,
    ``nodes_back``, ``health_checks``, ``reboots``, ``validations``, ``gpu_resets``,
    ``breaker``, ``verdict_leases``, ``warnings``, ``aws_notices`` (built here: they use the
    jobs' or the instances' builders), beside the tables' own (``node_tasks``, ``deadlines``,
    ``faults``, ``latches``, ``slots``, ``cordons``...)."""

    def __init__(self, dynamodb: Any, job_table: str, instance_table: str, *,
                 deadline_shards: int = 1) -> None:
        super().__init__(dynamodb, job_table, instance_table, deadline_shards=deadline_shards)
        self.decisions = NodeDecisionRepository(self, self)  # a node decided with its waiting jobs
        self.breaker = BreakerRepository(self)  # the blast-radius breaker, the jobs it holds
        self.verdict_leases = VerdictLeaseRepository(self)  # one delivery works a check's verdict
        self.warnings = WarningRepository(self)  # the driver's warnings on a node
        self.aws_notices = AwsNoticeRepository(self)  # AWS's notices on a node
        self.nodes_back = NodeBackRepository(self)  # a node back from its repair, its jobs released
        self.validations = ValidationRepository(self, self.nodes_back)  # a repaired node's validation
        self.gpu_resets = GpuResetRepository(self)  # a node's GPU reset fallen back to a reboot
        self.health_checks = HealthCheckRepository(self)  # a node's health check: opened, claimed...
        self.reboots = RebootRepository(self)  # a node's reboot, quarantine, termination
        self.registrations = RegistrationRepository(self)  # a rank's registration, its task looked up
        self.fanouts = GangFanoutRepository(self)  # a gang's fan-outs sent once, each rank's launch lease
        self.restarts = RestartRepository(self)  # a job's gang restart: claimed, waiting, requeued
        self.rank_events = RankEventRepository(self)  # a rank running or stopped, the fault it opens
