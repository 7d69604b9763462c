"""The recovery loop, one module per stage over shared rank operations and ports.

* ``task_events`` — training task state changes: rank records, job outcomes, fault detection
* ``health_checks`` — the DCGM health check of each suspect instance and its verdict
* ``reboots`` — reboot or quarantine a node, and notice it coming back
* ``gang_restart`` — restart every rank of a job once its nodes are back
* ``sweep`` — the scheduled converge step: retries, dead claims, lost events, timeouts
* ``remediation`` — what a node needs (fault catalog, escalation, breaker, observe mode),
  committed with every waiting job's outcome, then carried out
* ``breaker`` — the blast-radius breaker's metrics, operator reset and released backlog
* ``service`` — ``RecoveryService``, the thin façade handlers call
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_recovery.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from gpu_recovery.recovery.ports import Invocation, MetricsPort, NullMetrics, Outcome
    from gpu_recovery.recovery.ranks import RankRegistration, registration_from_tags, restart_started_by
    from gpu_recovery.recovery.service import RecoveryService
    from gpu_recovery.recovery.task_refusals import NotProtected

# Each name is imported when first asked for: a module that needs only ``ports`` (the
# job-control API's ``Outcome``) does not load every stage with the service.
_HOMES = {
    "Invocation": "ports", "MetricsPort": "ports", "NullMetrics": "ports", "Outcome": "ports",
    "NotProtected": "task_refusals", "RankRegistration": "ranks", "registration_from_tags": "ranks",
    "restart_started_by": "ranks", "RecoveryService": "service",
}

__getattr__ = lazy_exports(__name__, _HOMES)


__all__ = [
    "Invocation",
    "MetricsPort",
    "NotProtected",
    "NullMetrics",
    "Outcome",
    "RankRegistration",
    "RecoveryService",
    "registration_from_tags",
    "restart_started_by",
]
