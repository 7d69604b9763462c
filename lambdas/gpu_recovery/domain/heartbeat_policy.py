"""Heartbeat rules, pure: staleness, hangs, clock skew and GPU hardware signals.

No I/O here; :mod:`gpu_recovery.heartbeat` applies these decisions with conditional
writes. Thresholds come from :class:`HeartbeatSettings` (environment, see constants).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_recovery import constants as c

# --------------------------------------------------------------------------- XIDs
# NVIDIA Xid catalog (design notes): these need a GPU reset / reboot, and a
# replacement when they recur. 48 double-bit ECC, 64 ECC page retirement / row-remap
# failure, 74 NVLink, 79 fell off the bus, 94/95 contained / uncontained ECC,
# 119/120 GSP errors.
REBOOT_OR_REPLACE_XIDS = frozenset({48, 64, 74, 79, 94, 95, 119, 120})
# Usually the application's fault: reported in telemetry, never a SUSPECT signal.
APPLICATION_XIDS = frozenset({13, 31, 43, 45})
# Row remap recorded: no immediate action.
INFORMATIONAL_XIDS = frozenset({63})

HANG_ACTIONS = ("notify", "recover")

DEFAULT_STALE_SECONDS = 180
DEFAULT_NODE_LOST_FAIL_SECONDS = 1800
DEFAULT_HANG_SECONDS = 0
DEFAULT_MAX_SKEW_SECONDS = 300


class HeartbeatSettingsError(ValueError):
    """A malformed heartbeat environment variable; names the variable."""


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError as error:
        raise HeartbeatSettingsError(f"{name} must be an integer, got {raw!r}") from error
    if value < minimum:
        raise HeartbeatSettingsError(f"{name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class HeartbeatSettings:
    stale_seconds: int = DEFAULT_STALE_SECONDS
    node_lost_fail_seconds: int = DEFAULT_NODE_LOST_FAIL_SECONDS  # 0 disables
    hang_seconds: int = DEFAULT_HANG_SECONDS  # 0 disables hang detection
    hang_action: str = "notify"  # notify | recover
    max_skew_seconds: int = DEFAULT_MAX_SKEW_SECONDS
    node_token_table: str = c.DEFAULT_NODE_TOKEN_TABLE_NAME

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HeartbeatSettings:
        env = os.environ if env is None else env
        action = (env.get(c.ENV_HANG_ACTION) or "notify").strip().lower()
        if action not in HANG_ACTIONS:
            raise HeartbeatSettingsError(
                f"{c.ENV_HANG_ACTION} must be one of {', '.join(HANG_ACTIONS)}, got {action!r}"
            )
        return cls(
            stale_seconds=_int(env, c.ENV_HEARTBEAT_STALE_SECONDS, DEFAULT_STALE_SECONDS, 1),
            node_lost_fail_seconds=_int(
                env, c.ENV_NODE_LOST_FAIL_SECONDS, DEFAULT_NODE_LOST_FAIL_SECONDS
            ),
            hang_seconds=_int(env, c.ENV_HANG_SECONDS, DEFAULT_HANG_SECONDS),
            hang_action=action,
            max_skew_seconds=_int(env, c.ENV_HEARTBEAT_MAX_SKEW_SECONDS, DEFAULT_MAX_SKEW_SECONDS, 1),
            node_token_table=env.get(c.ENV_NODE_TOKEN_TABLE) or c.DEFAULT_NODE_TOKEN_TABLE_NAME,
        )


# ------------------------------------------------------------------ reports
@dataclass(frozen=True)
class ReportedTask:
    """One task of a node report (validated by the API layer)."""

    task_arn: str | None = None
    running_log_id: str | None = None
    remote_pid: int | None = None
    remote_pgid: int | None = None
    step: int | None = None

    @property
    def key(self) -> str:
        return self.task_arn or f"log:{self.running_log_id}"


def skew_seconds(reported_at: float, now: float) -> float:
    return abs(now - reported_at)


def timestamp_acceptable(reported_at: float, now: float, max_skew: float) -> bool:
    """A report must carry a finite epoch timestamp within ``max_skew`` of our clock."""
    return math.isfinite(reported_at) and skew_seconds(reported_at, now) <= max_skew


# ----------------------------------------------------------------- staleness
def stale_cutoff(now: float, stale_seconds: float) -> float:
    """Ranks whose last heartbeat is strictly older than this are stale."""
    return now - stale_seconds


def is_stale(last_heartbeat_at: float | None, now: float, stale_seconds: float) -> bool:
    """Only a rank that has had a heartbeat can go stale (seed: upgrade safety)."""
    return last_heartbeat_at is not None and last_heartbeat_at < stale_cutoff(now, stale_seconds)


def node_lost_expired(node_lost_at: float | None, now: float, fail_seconds: float) -> bool:
    """NODE_LOST for longer than ``fail_seconds`` (0 disables) becomes a suspected fault."""
    return fail_seconds > 0 and node_lost_at is not None and now - node_lost_at > fail_seconds


# ---------------------------------------------------------------------- hangs
@dataclass(frozen=True)
class StepVerdict:
    advanced: bool  # record the new step and restart the hang clock
    hung: bool  # no progress for longer than hang_seconds


def step_verdict(
    previous_step: int | None,
    step_changed_at: float | None,
    reported_step: int | None,
    now: float,
    hang_seconds: float,
) -> StepVerdict:
    """Progress of one rank from its reported training step.

    Any change counts as progress (a restart from a checkpoint goes backwards). A
    report without ``step`` says nothing: no progress, never a hang.
    """
    if reported_step is None:
        return StepVerdict(advanced=False, hung=False)
    if previous_step is None or reported_step != previous_step or step_changed_at is None:
        return StepVerdict(advanced=True, hung=False)
    hung = hang_seconds > 0 and now - step_changed_at > hang_seconds
    return StepVerdict(advanced=False, hung=hung)


# --------------------------------------------------------- hardware signals
@dataclass(frozen=True)
class HardwareSignal:
    """One reason to suspect a node; ``fingerprint`` identifies it across reports."""

    fingerprint: str
    kind: str  # xid | unmapped_xid | ecc_uncorrected | remap_pending | remap_failure
    gpu: str  # GPU uuid (or index / PCI bus id when unknown)
    detail: str
    action: str  # reboot | replace

    def describe(self) -> str:
        return f"{self.detail} (GPU {self.gpu}; needs {self.action})"


def _gpu_name(gpu: Mapping[str, Any]) -> str:
    return str(gpu.get("uuid") or f"index-{gpu.get('index')}")


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def hardware_signals(
    gpus: Iterable[Mapping[str, Any]], unmapped_xids: Iterable[Mapping[str, Any]] = ()
) -> list[HardwareSignal]:
    """Signals that make a node SUSPECT, deduplicated by fingerprint, sorted.

    An uncorrected volatile ECC count is keyed by its value: it only grows until the
    next reset, so a growing count is a new signal while the same count is not.
    """
    found: dict[str, HardwareSignal] = {}

    def add(signal: HardwareSignal) -> None:
        found.setdefault(signal.fingerprint, signal)

    for gpu in gpus:
        name = _gpu_name(gpu)
        if gpu.get("remapped_rows_failure") is True or _positive(gpu.get("remapped_rows_failure")):
            add(HardwareSignal(f"remap_failure:{name}", "remap_failure", name,
                               "row remapping failed", "replace"))
        if gpu.get("remapped_rows_pending") is True or _positive(gpu.get("remapped_rows_pending")):
            add(HardwareSignal(f"remap_pending:{name}", "remap_pending", name,
                               "row remap pending", "reboot"))
        ecc = gpu.get("ecc_uncorrected_volatile")
        if ecc is not None and _positive(ecc):
            add(HardwareSignal(f"ecc:{name}:{int(ecc)}", "ecc_uncorrected", name,
                               f"{int(ecc)} uncorrected volatile ECC errors", "reboot"))
        for xid in gpu.get("xids") or []:
            if isinstance(xid, int) and xid in REBOOT_OR_REPLACE_XIDS:
                add(HardwareSignal(f"xid:{xid}:{name}", "xid", name, f"Xid {xid}",
                                   "replace" if xid in (74, 79) else "reboot"))
    for entry in unmapped_xids:
        xid = entry.get("xid")
        bus = str(entry.get("pci_bus_id") or "?")
        if isinstance(xid, int) and xid in REBOOT_OR_REPLACE_XIDS:
            add(HardwareSignal(f"xid:{xid}:pci-{bus}", "unmapped_xid", f"pci-{bus}",
                               f"Xid {xid} on a GPU missing from nvidia-smi", "replace"))
    return [found[k] for k in sorted(found)]


def new_signals(signals: Iterable[HardwareSignal], known: Iterable[str]) -> list[HardwareSignal]:
    seen = set(known)
    return [s for s in signals if s.fingerprint not in seen]


# Every XID reported, with when it arrived, kept on the node's item for the fault evidence
# (domain.evidence): the telemetry only holds the latest report and ``hw_signals`` has no time.
GPU_EVENTS_RETENTION_SECONDS = 72 * 3600
MAX_GPU_EVENTS = 100


def xid_events(gpus: Iterable[Mapping[str, Any]], unmapped_xids: Iterable[Mapping[str, Any]],
               at: float) -> list[dict[str, Any]]:
    """This report's XIDs as compact events {"t": at, "g": GPU, "x": xid}."""
    events = []
    for gpu in gpus:
        for xid in gpu.get("xids") or []:
            if isinstance(xid, int) and not isinstance(xid, bool):
                events.append({"t": at, "g": _gpu_name(gpu), "x": xid})
    for entry in unmapped_xids:
        xid = entry.get("xid")
        if isinstance(xid, int) and not isinstance(xid, bool):
            events.append({"t": at, "g": f"pci-{entry.get('pci_bus_id') or '?'}", "x": xid})
    return events


def merge_gpu_events(existing: Iterable[Mapping[str, Any]], new: Iterable[Mapping[str, Any]], now: float,
                     retention_seconds: float = GPU_EVENTS_RETENTION_SECONDS,
                     max_events: int = MAX_GPU_EVENTS) -> list[dict[str, Any]]:
    """The kept events plus ``new``: older than the retention dropped, newest ``max_events`` kept."""
    kept = [dict(e) for e in existing if now - float(e.get("t", 0)) < retention_seconds]
    return (kept + [dict(e) for e in new])[-max_events:]


_TELEMETRY_FIELDS = (
    ("index", "i"),
    ("uuid", "u"),
    ("utilization_gpu", "util"),
    ("memory_used_mib", "mem"),
    ("memory_total_mib", "memt"),
    ("temperature_c", "temp"),
    ("ecc_uncorrected_volatile", "ecc"),
    ("remapped_rows_pending", "rp"),
    ("remapped_rows_failure", "rf"),
    ("xids", "x"),
)


def compact_telemetry(gpus: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Short keys, nulls and empty Xid lists dropped: the item stays near 1 KB for 8 GPUs
    (every report rewrites it, and DynamoDB bills writes per KB of item size)."""
    rows = []
    for gpu in gpus:
        row = {}
        for name, short in _TELEMETRY_FIELDS:
            value = gpu.get(name)
            if value is None or value == []:
                continue
            row[short] = value
        rows.append(row)
    return rows
