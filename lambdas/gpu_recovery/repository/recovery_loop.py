"""The recovery loop's repository, one class over the modules of its aggregates."""

from __future__ import annotations

from gpu_recovery.repository.aws_notices import AwsNoticeRecords
from gpu_recovery.repository.breaker import BreakerState
from gpu_recovery.repository.gpu_resets import GpuResets
from gpu_recovery.repository.node_decisions import NodeDecisions
from gpu_recovery.repository.validations import Validations
from gpu_recovery.repository.verdict_leases import VerdictLeases
from gpu_recovery.repository.warnings import DriverWarnings


class Repository(NodeDecisions, GpuResets, Validations, BreakerState, VerdictLeases, DriverWarnings,
                 AwsNoticeRecords):
    """The recovery loop's repository: the intents of every aggregate of its two tables
    (jobs and ranks, instances, node decisions, the breaker), one object the stages share.
    Each method lives in the module of its aggregate (see the package docstring)."""
