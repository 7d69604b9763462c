"""The CloudWatch namespace, metric and dimension names the functions emit and infra alarms on."""

from __future__ import annotations

METRICS_NAMESPACE = "GpuTrainingRecovery"
# Suspects the stack's own DCGM check cleared, per evidence source (issue 49: the dashboard).
METRIC_SUSPECTS_CLEARED = "SuspectsCleared"
DIMENSION_EVIDENCE_SOURCE = "EvidenceSource"
# A finished job's goodput ledger (docs/goodput.md): GPU-hours lost per cause, and its ETTR.
METRIC_GPU_HOURS_LOST = "GpuHoursLost"
DIMENSION_CAUSE = "Cause"
METRIC_JOB_ETTR = "JobEttr"
# The recovery sweep's, each run: jobs past their due time (domain.overdue; an alarm pages) and how
# late the oldest due job is (the dashboard only).
METRIC_OVERDUE_JOBS = "OverdueJobs"
METRIC_OLDEST_DUE_JOB_SECONDS = "OldestDueJobSeconds"
# The recovery sweep's, when it happens: an aborted launch's or an ended job's stops given up
# (recovery.gang; an alarm pages on each).
METRIC_ABORTED_LAUNCH_STOPS_GIVEN_UP = "AbortedLaunchStopsGivenUp"
METRIC_ENDED_JOB_STOPS_GIVEN_UP = "EndedJobStopsGivenUp"
