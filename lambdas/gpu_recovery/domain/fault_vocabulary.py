"""Words the fault catalog, the evidence and the remediation policies share.

Pure data: what can be observed about a fault (triggers, GPU signals, DCGM severities
and categories), what can be done about it (actions) and whose budget pays for it.
"""

from __future__ import annotations

from enum import Enum


class Action(str, Enum):
    """What the catalog says a fault needs, mildest first (see ``ACTION_SEVERITY``)."""

    NONE = "none"  # informational: record it, do nothing
    APPLICATION_ERROR = "application_error"  # the job's own fault: restart it, no node action
    RESTART_JOB = "restart_job"  # transient: restart the gang, no node action
    HEALTH_CHECK = "health_check"  # not sure yet: run the DCGM diag on the node first
    OPERATOR_ACTION = "operator_action"  # configuration problem: drain + notify, never reboot
    # The evidence says a GPU reset suffices (the driver's recovery action, a pending row remap,
    # NVIDIA's RESET_GPU bucket): reset the node's GPUs instead of rebooting it. Until a stage
    # carries it out, the planner turns it into today's reboot (RemediationPolicy.gpu_reset_enabled).
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    REPLACE = "replace"  # per deployment: quarantine (drain + notify) or terminate in its ASG


# When several catalog rules match, the most severe action wins (then priority, then order).
ACTION_SEVERITY: dict[Action, int] = {action: rank for rank, action in enumerate(Action)}

# Actions that change the node itself (the blast-radius breaker and escalation count them).
NODE_ACTIONS = frozenset({Action.OPERATOR_ACTION, Action.RESET_GPU, Action.REBOOT, Action.REPLACE})
# Actions a catalog rule may take without running the DCGM diag first.
SKIPPABLE_ACTIONS = NODE_ACTIONS


class Budget(str, Enum):
    """Which of a job's two budgets a fault spends."""

    APPLICATION = "application"  # application-error restarts (default 0 = fail as before)
    INFRASTRUCTURE = "infrastructure"  # node faults fixed by a reboot or a move (default 3)
    NONE = "none"  # nothing to spend (informational, or decided after the diag)


DEFAULT_BUDGET: dict[Action, Budget] = {
    Action.NONE: Budget.NONE,
    Action.APPLICATION_ERROR: Budget.APPLICATION,
    Action.RESTART_JOB: Budget.INFRASTRUCTURE,
    Action.HEALTH_CHECK: Budget.NONE,
    Action.OPERATOR_ACTION: Budget.INFRASTRUCTURE,
    Action.RESET_GPU: Budget.INFRASTRUCTURE,
    Action.REBOOT: Budget.INFRASTRUCTURE,
    Action.REPLACE: Budget.INFRASTRUCTURE,
}


# A catalog rule with a ``warning`` acts on telemetry alone (docs/driver-warnings.md): how sure
# it is, and what happens to a job running on the node.
ANNOUNCED = "announced"  # the driver says what it needs (its recovery action, a pending remap)
PREDICTED = "predicted"  # a counter rising faster than a rate: a failure may follow
WARNING_CONFIDENCES = (ANNOUNCED, PREDICTED)
MOVE_JOB = "move"  # ask the job to checkpoint and stop, restart it elsewhere, repair the node
CORDON_NODE = "cordon"  # nothing new on the node; repair it once its jobs leave
BUSY_NODE_POLICIES = (MOVE_JOB, CORDON_NODE)
# The actions a warning may repair an idle node with (definitive: no DCGM diag first).
WARNING_ACTIONS = frozenset({Action.RESET_GPU, Action.REBOOT, Action.REPLACE})


class Trigger(str, Enum):
    """How the fault was noticed."""

    TASK_EXIT = "task_exit"  # an ECS task of the job stopped on its own
    NODE_LOST = "node_lost"  # the heartbeat service lost the node for too long
    HUNG = "hung"  # a rank stopped making progress
    TELEMETRY = "telemetry"  # GPU telemetry alone (no job fault)
    # A repaired node failed its validation under load (domain.validation): no job fault
    VALIDATION = "validation"
    PREFLIGHT = "preflight"  # the job's gang preflight pinned the node (a slow or failing all-reduce)


class GpuSignalKind(str, Enum):
    """GPU state read from nvidia-smi (node agent telemetry or the health check)."""

    REMAP_PENDING = "remap_pending"  # row remap waits for a GPU reset
    REMAP_FAILURE = "remap_failure"  # no spare rows left
    ECC_UNCORRECTED_VOLATILE = "ecc_uncorrected_volatile"  # uncorrected ECC since the last reset
    FALLEN_OFF_BUS = "fallen_off_bus"  # nvidia-smi exit 15 or "Unable to determine the device handle"
    INFOROM_CORRUPTED = "inforom_corrupted"  # nvidia-smi exit 14
    DRIVER_NOT_LOADED = "driver_not_loaded"  # nvidia-smi exit 9
    GPU_QUERY_FAILED = "gpu_query_failed"  # nvidia-smi failed otherwise
    # The driver's own recovery action (nvidia-smi -q "GPU Recovery Action", NVML
    # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, drivers R565+), as the health check reports it:
    RESET_REQUESTED = "reset_requested"  # Reset or Drain and Reset: a GPU reset clears the fault
    REBOOT_REQUESTED = "reboot_requested"  # Reboot, or Drain P2P (not doable by a task): never reset
    RETIREMENT_PENDING = "retirement_pending"  # pages retired "on the next reboot" (pre-Ampere)


# The health check's per-GPU "recovery_action" values (health_check/README.md); "unknown" when
# the driver does not say (before R565, N/A, nvidia-smi -q failed, an unlisted value).
RESET_RECOVERY_ACTIONS = frozenset({"gpu_reset", "drain_and_reset"})
REBOOT_RECOVERY_ACTIONS = frozenset({"node_reboot", "drain_p2p"})
RECOVERY_ACTIONS = RESET_RECOVERY_ACTIONS | REBOOT_RECOVERY_ACTIONS | {"none", "unknown"}


# dcgmErrorSeverity_t (NVIDIA/DCGM dcgmlib/dcgm_errors.h): the "error_severity" numbers.
DCGM_SEVERITY_NAMES: dict[int, str] = {
    0: "none", 1: "monitor", 2: "isolate", 3: "unknown", 4: "triage", 5: "config", 6: "reset",
}
# dcgmErrorCategory_t (same header): the "error_category" numbers.
DCGM_CATEGORY_NAMES: dict[int, str] = {
    0: "none", 1: "performance_threshold", 2: "performance_violation", 3: "software_config",
    4: "software_library", 5: "software_xid", 6: "software_cuda", 7: "software_eud",
    8: "software_other", 9: "hardware_thermal", 10: "hardware_memory", 11: "hardware_nvlink",
    12: "hardware_nvswitch", 13: "hardware_pcie", 14: "hardware_power", 15: "hardware_other",
    16: "internal_other",
}

# The health check's verdict names, indexed by its exit code (health_check/dcgm_health_check.sh,
# constants.DcgmVerdict).
DCGM_VERDICT_NAMES = ("healthy", "reboot", "replace", "operator_action", "reset")
# A verdict no catalog rule matched still means this.
DCGM_VERDICT_FALLBACK: dict[str, Action] = {
    "healthy": Action.APPLICATION_ERROR,
    "reboot": Action.REBOOT,
    "replace": Action.REPLACE,
    "operator_action": Action.OPERATOR_ACTION,
    "reset": Action.RESET_GPU,
}


def severity_name(severity: int | None) -> str:
    if severity is None:
        return "unknown"
    return DCGM_SEVERITY_NAMES.get(severity, f"severity-{severity}")


def category_name(category: int | None) -> str:
    if category is None:
        return "unknown"
    return DCGM_CATEGORY_NAMES.get(category, f"category-{category}")
