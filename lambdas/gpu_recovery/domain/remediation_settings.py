"""The remediation policies from plain setting values, validated once (at cold start or synth).

Pure: the caller passes the values (e.g. its environment mapped to these keys); every error
names the key and says what is allowed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from gpu_recovery.domain.breaker.breaker import BreakerPolicy
from gpu_recovery.domain.cordon import CordonPolicy
from gpu_recovery.domain.escalation import DAY, HOUR, EscalationPolicy
from gpu_recovery.domain.fault_catalog import FaultCatalog
from gpu_recovery.domain.job_budgets import (
    DEFAULT_MAX_APP_RESTARTS,
    DEFAULT_MAX_INFRA_RECOVERIES,
    validate_limits,
)
from gpu_recovery.domain.remediation_mode import (
    REPLACE_ACTIONS,
    RemediationModes,
    combination_errors,
    parse_remediation_mode,
)
from gpu_recovery.domain.remediation_plan import RemediationPolicy

# A job asked to move off a node with a driver warning (docs/driver-warnings.md) checkpoints
# within this long, or keeps running: long enough for a large model's checkpoint, short enough
# that a warned GPU does not run on for long.
DEFAULT_WARNING_CHECKPOINT_SECONDS = 600
MAX_WARNING_CHECKPOINT_SECONDS = 6 * 3600


def _percent(share: float) -> str:
    return f"{share * 100:g}"


# key -> (default, what it is)
SETTINGS: dict[str, tuple[str, str]] = {
    "remediation_mode": ("enforce", "enforce | observe, per-effect exceptions: enforce,reboot=observe"),
    "replace_action": ("quarantine", "quarantine | terminate_in_asg"),
    "reboots_before_replace": ("2", "reboots for one cause before the next fault replaces the node"),
    "reboot_window_hours": ("72", "window of those reboots"),
    "max_remediations": ("5", "remediations after which a node is quarantined and an operator paged"),
    "remediation_window_days": ("7", "window of those remediations"),
    "breaker_enabled": ("true", "true | false"),
    "breaker_max_percent": ("20", "share of the cluster's GPU nodes acted on per window, 1..100"),
    "breaker_max_nodes": ("", "absolute cap on nodes acted on per window (empty: none)"),
    "breaker_window_minutes": ("10", "the breaker's sliding window"),
    "breaker_auto_close": ("true", "true | false: the breaker closes by itself once the nodes it acted on "
                           "are back healthy"),
    "cordon_max_percent": (_percent(CordonPolicy().max_share),
                           "share of the cluster's GPU nodes given the placement attribute (known bad) "
                           "per 5-minute window before the cordon limit trips, 1..100"),
    "max_infra_recoveries": (str(DEFAULT_MAX_INFRA_RECOVERIES), "a job's infrastructure recoveries"),
    "gpu_reset": ("true", "true | false: reset a node's GPUs (a privileged ECS task) where the evidence "
                  "says a reset suffices; false: reboot the node instead"),
    "max_app_restarts": (str(DEFAULT_MAX_APP_RESTARTS), "a job's application-error restarts"),
    "warning_checkpoint_seconds": (str(DEFAULT_WARNING_CHECKPOINT_SECONDS),
                                   "a queue job on a node with a driver warning has this long to "
                                   "checkpoint and stop (it then moves); past it, it keeps running on its "
                                   "cordoned node, repaired once it leaves; 0: never asked"),
}


@dataclass(frozen=True)
class RemediationSettings:
    modes: RemediationModes = field(default_factory=RemediationModes)
    replace_action: str = "quarantine"
    escalation: EscalationPolicy = field(default_factory=EscalationPolicy)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    # Known-bad nodes' ECS attribute: its own, higher limit (``cordon_max_percent``).
    cordon: CordonPolicy = field(default_factory=CordonPolicy)
    max_infra_recoveries: int = DEFAULT_MAX_INFRA_RECOVERIES
    max_app_restarts: int = DEFAULT_MAX_APP_RESTARTS
    gpu_reset_enabled: bool = True
    warning_checkpoint_seconds: int = DEFAULT_WARNING_CHECKPOINT_SECONDS  # 0: jobs are not asked to move

    def policy(self, catalog: FaultCatalog, suspect_exit_codes: Collection[int]) -> RemediationPolicy:
        return RemediationPolicy(catalog=catalog, escalation=self.escalation, modes=self.modes,
                                 suspect_exit_codes=frozenset(suspect_exit_codes),
                                 replace_action=self.replace_action,
                                 gpu_reset_enabled=self.gpu_reset_enabled)


def _number(values: Mapping[str, str], key: str, errors: list[str], *, integer: bool,
            low: float, high: float) -> float | None:
    raw = (values.get(key) or SETTINGS[key][0]).strip()
    if raw == "":
        return None
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        errors.append(f"{key} must be {'an integer' if integer else 'a number'}, got {raw!r}")
        return None
    if not low <= value <= high:
        errors.append(f"{key} must be between {low:g} and {high:g}, got {raw}")
        return None
    return value


def parse_remediation_settings(values: Mapping[str, str]) -> RemediationSettings:
    """Raises ValueError listing every bad key (unknown keys are errors too: typos)."""
    errors = [f"unknown setting {k!r} (known: {', '.join(SETTINGS)})"
              for k in sorted(set(values) - set(SETTINGS))]
    modes = RemediationModes()
    try:
        modes = parse_remediation_mode(values.get("remediation_mode"))
    except ValueError as error:
        errors.append(str(error))
    replace_action = (values.get("replace_action") or "quarantine").strip()
    if replace_action not in REPLACE_ACTIONS:
        errors.append(f"replace_action must be one of {', '.join(REPLACE_ACTIONS)}, "
                      f"got {replace_action!r}")
    else:
        # What parse_remediation_mode cannot know alone (the modes it returned passed the
        # rest): with terminate_in_asg, termination needs the drain first.
        errors += combination_errors(modes, replace_action=replace_action)
    enabled = (values.get("breaker_enabled") or "true").strip().lower()
    if enabled not in ("true", "false"):
        errors.append(f"breaker_enabled must be true or false, got {enabled!r}")
    auto_close = (values.get("breaker_auto_close") or SETTINGS["breaker_auto_close"][0]).strip().lower()
    if auto_close not in ("true", "false"):
        errors.append(f"breaker_auto_close must be true or false, got {auto_close!r}")
    gpu_reset = (values.get("gpu_reset") or SETTINGS["gpu_reset"][0]).strip().lower()
    if gpu_reset not in ("true", "false"):
        errors.append(f"gpu_reset must be true or false, got {gpu_reset!r}")

    def num(key: str, low: float, high: float, integer: bool = True) -> float | None:
        return _number(values, key, errors, integer=integer, low=low, high=high)

    reboots = num("reboots_before_replace", 1, 100)
    reboot_hours = num("reboot_window_hours", 0.1, 24 * 90, False)
    remediations, days = num("max_remediations", 1, 1000), num("remediation_window_days", 0.1, 90, False)
    percent, cap = num("breaker_max_percent", 1, 100, False), num("breaker_max_nodes", 1, 100_000)
    cordon_percent = num("cordon_max_percent", 1, 100, False)
    minutes = num("breaker_window_minutes", 0.1, 24 * 60, False)
    infra, app = num("max_infra_recoveries", 0, 1000), num("max_app_restarts", 0, 1000)
    checkpoint = num("warning_checkpoint_seconds", 0, MAX_WARNING_CHECKPOINT_SECONDS)
    if infra is not None and app is not None:
        errors += validate_limits(int(infra), int(app))
    if errors:
        raise ValueError("remediation settings: " + "; ".join(errors))
    return RemediationSettings(
        modes=modes, replace_action=replace_action,
        escalation=EscalationPolicy(reboots_before_replace=int(reboots or 0),
                                    reboot_window_seconds=float(reboot_hours or 0) * HOUR,
                                    max_remediations=int(remediations or 0),
                                    remediation_window_seconds=float(days or 0) * DAY,
                                    flap_window_seconds=float(reboot_hours or 0) * HOUR,
                                    max_records=max(50, int(remediations or 0) + int(reboots or 0))),
        breaker=BreakerPolicy(enabled=enabled == "true", max_share=float(percent or 0) / 100,
                              max_nodes=int(cap) if cap is not None else None,
                              window_seconds=float(minutes or 0) * 60, auto_close=auto_close == "true"),
        cordon=CordonPolicy(max_share=float(cordon_percent or 0) / 100),
        max_infra_recoveries=int(infra or 0), max_app_restarts=int(app or 0),
        gpu_reset_enabled=gpu_reset == "true",
        warning_checkpoint_seconds=int(checkpoint or 0),
    )
