"""The deployment's preflight settings (one JSON object, ``PREFLIGHT_SETTINGS``), validated.

* ``min_nodes`` (8): queue jobs of at least this many nodes run the preflight after a
  recovery restart unless their spec says otherwise (``auto``); 0: only jobs that ask;
* ``round_seconds`` (120): the bound of each round after the first (a group that has not
  reported by then hung); the first round, which waits for every rank to start, gets twice;
* ``slow_fraction`` (0.8), ``min_samples`` (3), ``first_runs_fraction`` (0.2), ``min_users``
  (3: the distinct users whose runs judge everyone): the baseline rule (``baseline``);
* ``floors`` ({}): operator floors in GB/s per node class (``{"p5.48xlarge": 250}``).

Pure: the stack validates the context keys with the same function at synth, the functions
at cold start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery.domain.preflight.baseline import (
    DEFAULT_FIRST_RUNS_FRACTION,
    DEFAULT_MIN_SAMPLES,
    DEFAULT_MIN_USERS,
    DEFAULT_SLOW_FRACTION,
    MAX_SAMPLES,
    MAX_USERS,
    BaselinePolicy,
)
from gpu_recovery.domain.preflight.nccl_output import DEFAULT_LARGE_BYTES
from gpu_recovery.domain.tenant_evidence import (
    DEFAULT_LIMIT,
    DEFAULT_WINDOW_SECONDS,
    MAX_ENTRIES,
    TenantEvidenceLimit,
)

DEFAULT_MIN_NODES = 8
DEFAULT_ROUND_SECONDS = 120
MIN_ROUND_SECONDS, MAX_ROUND_SECONDS = 30, 1800
MAX_MIN_NODES = 1024
#: the message sizes the preflight's all-reduce runs (factor 2): large sizes only, so a run
#: takes seconds, not the minutes of a full 8 B..8 GB sweep
SWEEP_MIN_BYTES = DEFAULT_LARGE_BYTES
SWEEP_MAX_BYTES = 1024 * 1024 * 1024
KEYS = ("min_nodes", "round_seconds", "slow_fraction", "min_samples", "first_runs_fraction", "min_users",
        "floors", "cleared_limit", "cleared_window_hours")


@dataclass(frozen=True)
class PreflightPolicy:
    min_nodes: int = DEFAULT_MIN_NODES
    round_seconds: int = DEFAULT_ROUND_SECONDS
    baseline: BaselinePolicy = field(default_factory=BaselinePolicy)
    # A job or user whose evidence named this many suspects the stack's check cleared within
    # the window: its preflights pin nothing more (domain.tenant_evidence).
    tenant_limit: TenantEvidenceLimit = field(default_factory=TenantEvidenceLimit)

    @property
    def first_round_seconds(self) -> int:
        return 2 * self.round_seconds

    def to_dict(self) -> dict[str, Any]:
        return {"min_nodes": self.min_nodes, "round_seconds": self.round_seconds,
                "slow_fraction": self.baseline.slow_fraction, "min_samples": self.baseline.min_samples,
                "first_runs_fraction": self.baseline.first_runs_fraction,
                "min_users": self.baseline.min_users, "floors": dict(self.baseline.floors),
                "cleared_limit": self.tenant_limit.limit,
                "cleared_window_hours": self.tenant_limit.window_seconds / 3600}


def _integer(raw: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"preflight setting {key} must be an integer {low}..{high}, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"preflight setting {key} must be an integer {low}..{high}, got {value!r}") from None
    if not low <= number <= high:
        raise ValueError(f"preflight setting {key} must be {low}..{high}, got {number}")
    return number


def _fraction(raw: Mapping[str, Any], key: str, default: float) -> float:
    value = raw.get(key, default)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"preflight setting {key} must be a number in (0, 1], got {value!r}") from None
    if isinstance(value, bool) or not 0 < number <= 1:
        raise ValueError(f"preflight setting {key} must be in (0, 1], got {value!r}")
    return number


def parse_floors(value: Any) -> dict[str, float]:
    """``{"p5.48xlarge": 250}``: GB/s per node class (instance type, or ``<n>gpu``)."""
    if value in (None, ""):
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"preflight floors must be an object {{node class: GB/s}}, got {value!r}")
    floors: dict[str, float] = {}
    for name, gbps in value.items():
        try:
            number = float(gbps)
        except (TypeError, ValueError):
            raise ValueError(f"preflight floor of {name!r} must be a number of GB/s, got {gbps!r}") from None
        if isinstance(gbps, bool) or not 0 < number <= 10_000 or not str(name).strip():
            raise ValueError(f"preflight floor of {name!r} must be in (0, 10000] GB/s, got {gbps!r}")
        floors[str(name).strip()] = number
    return floors


def parse_preflight_settings(raw: Mapping[str, Any] | None) -> PreflightPolicy:
    """The settings object, every key optional; ValueError names the key at fault."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown preflight setting(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
    baseline = BaselinePolicy(
        slow_fraction=_fraction(raw, "slow_fraction", DEFAULT_SLOW_FRACTION),
        min_samples=_integer(raw, "min_samples", DEFAULT_MIN_SAMPLES, 1, MAX_SAMPLES),
        first_runs_fraction=_fraction(raw, "first_runs_fraction", DEFAULT_FIRST_RUNS_FRACTION),
        min_users=_integer(raw, "min_users", DEFAULT_MIN_USERS, 1, MAX_USERS),
        floors=parse_floors(raw.get("floors")))
    return PreflightPolicy(
        min_nodes=_integer(raw, "min_nodes", DEFAULT_MIN_NODES, 0, MAX_MIN_NODES),
        round_seconds=_integer(raw, "round_seconds", DEFAULT_ROUND_SECONDS, MIN_ROUND_SECONDS,
                               MAX_ROUND_SECONDS),
        baseline=baseline,
        tenant_limit=TenantEvidenceLimit(
            limit=_integer(raw, "cleared_limit", DEFAULT_LIMIT, 1, MAX_ENTRIES),
            window_seconds=3600 * _hours(raw, "cleared_window_hours", DEFAULT_WINDOW_SECONDS / 3600)))


def _hours(raw: Mapping[str, Any], key: str, default: float) -> float:
    value = raw.get(key, default)
    try:
        hours = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"preflight setting {key} must be a number of hours, got {value!r}") from None
    if isinstance(value, bool) or not 1 <= hours <= 720:
        raise ValueError(f"preflight setting {key} must be 1..720 hours, got {value!r}")
    return hours
