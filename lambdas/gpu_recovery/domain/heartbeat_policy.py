"""Heartbeat rules, pure: staleness, hangs, clock skew and GPU hardware signals.

No I/O here; :mod:`gpu_recovery.heartbeat` applies these decisions with conditional
writes. Thresholds come from :class:`HeartbeatSettings` (environment, see constants).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_recovery.domain.classify import classify
from gpu_recovery.domain.evidence import Evidence, GpuSignal, XidEvent
from gpu_recovery.domain.fault_catalog import FaultCatalog
from gpu_recovery.domain.fault_vocabulary import ACTION_SEVERITY, NODE_ACTIONS, Action, GpuSignalKind, Trigger

HANG_ACTIONS = ("notify", "recover")

DEFAULT_STALE_SECONDS = 180
DEFAULT_NODE_LOST_FAIL_SECONDS = 1800
DEFAULT_HANG_SECONDS = 0
DEFAULT_MAX_SKEW_SECONDS = 300
DEFAULT_SIGNAL_NOTIFY_SECONDS = 3600  # one e-mail per node per signal kind per hour at most
DEFAULT_SIGNAL_RETENTION_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class HeartbeatSettings:
    stale_seconds: int = DEFAULT_STALE_SECONDS
    node_lost_fail_seconds: int = DEFAULT_NODE_LOST_FAIL_SECONDS  # 0 disables
    hang_seconds: int = DEFAULT_HANG_SECONDS  # 0 disables hang detection
    hang_action: str = "notify"  # notify | recover
    max_skew_seconds: int = DEFAULT_MAX_SKEW_SECONDS
    signal_notify_seconds: int = DEFAULT_SIGNAL_NOTIFY_SECONDS
    signal_retention_seconds: int = DEFAULT_SIGNAL_RETENTION_SECONDS


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


def heartbeat_shard(job_id: str, rank: int, shards: int) -> int:
    """The rank's shard of the heartbeat index: stable (CRC-32 of job and rank, not Python's
    salted ``hash``), so a rank's entry stays on one partition key."""
    return zlib.crc32(f"{job_id}#{rank}".encode()) % max(1, shards)


def heartbeat_slot_seconds(stale_seconds: float) -> int:
    """How wide the heartbeat index's time slots are: half the stale threshold. A rank
    reporting more often than every ``stale_seconds - slot`` seconds is never in a slot the
    sweep reads (its slot starts after the cutoff); a slower one is read and kept by its
    exact ``last_heartbeat_at``."""
    return max(1, int(stale_seconds) // 2)


def heartbeat_slot(at: float, slot_seconds: int, shard: int = 0, shards: int = 1) -> int:
    """The start of the slot ``at`` falls in: a heartbeat moves the rank's index entry only
    when this changes (once per slot, not once per report). Each shard's slots start
    ``shard / shards`` of a slot later than shard 0's, so the cluster's entries do not all
    move in the same seconds (the index writes stay as even as the reports)."""
    offset = (shard * slot_seconds) // max(1, shards)
    return int((at - offset) // slot_seconds) * slot_seconds + offset


def node_lost_expired(node_lost_at: float | None, now: float, fail_seconds: float) -> bool:
    """NODE_LOST for longer than ``fail_seconds`` (0 disables) becomes a suspected fault."""
    return fail_seconds > 0 and node_lost_at is not None and now - node_lost_at > fail_seconds


def stop_unconfirmed_since(node_lost_at: Any, heartbeat_at: Any, stale_seconds: float) -> float | None:
    """A suspension's rank asked to stop and still watched (its heartbeats no longer recorded): lost
    since it was NODE_LOST, if it was before the stop; else since the sweep would have marked it
    lost (its last heartbeat and the stale threshold), as a RUNNING rank silent as long would be.
    None: neither known (never escalated)."""
    if _number(node_lost_at):
        return float(node_lost_at)
    return float(heartbeat_at) + stale_seconds if _number(heartbeat_at) else None


# ------------------------------------------------------- a lost node's ECS agent
# A lost node's ECS agent read disconnected counts only when a later sweep visit, at least
# this long after (or heartbeat_stale_seconds, if longer), reads it disconnected again: an
# agent update or a network blip disconnects and reconnects it (agentConnected false then
# true proves nothing), and a host may be alive behind an agent that is not answering.
MIN_DISCONNECT_CONFIRM_SECONDS = 180


def disconnect_confirm_seconds(stale_seconds: float) -> int:
    """How long after its first disconnected reading a lost node's ECS agent must read
    disconnected again: as long as a node agent's silence must last, never under 3 minutes."""
    return max(int(stale_seconds), MIN_DISCONNECT_CONFIRM_SECONDS)


def first_disconnected_reading(readings: Iterable[tuple[Any, Any]]) -> float | None:
    """The earliest disconnected reading stored on a job's lost ranks of one node, each given
    as (its reading, its ``node_lost_at``): only a reading taken in the rank's current NODE_LOST
    spell counts (None: no reading yet)."""
    kept = [float(seen) for seen, lost_at in readings
            if _number(seen) and _number(lost_at) and float(seen) >= float(lost_at)]
    return min(kept) if kept else None


def disconnect_confirmed(first_seen_at: float, now: float, stale_seconds: float) -> bool:
    """The ECS agent read disconnected at ``first_seen_at`` and again now, long enough after."""
    return now - first_seen_at >= disconnect_confirm_seconds(stale_seconds)


def host_reporting(last_report_at: Any, first_seen_at: float, stale_seconds: float) -> bool:
    """The node agent on the host reported since (or within ``stale_seconds`` before) the first
    disconnected reading: the host is alive, only its ECS agent is not answering. False only
    when both were silent all along (the node unreachable)."""
    return _number(last_report_at) and float(last_report_at) >= first_seen_at - stale_seconds


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
# Bounds that keep the node's item small whatever a node sends (DynamoDB items are
# at most 400 KB and every report rewrites the telemetry).
MAX_STORED_SIGNALS = 256
MAX_UNMAPPED_SIGNALS = 32
MAX_XIDS_STORED_PER_GPU = 16
MAX_SIGNAL_NAME = 64
SIGNAL_KINDS = ("xid", "unmapped_xid", "ecc_uncorrected", "remap_pending", "remap_failure")


@dataclass(frozen=True)
class HardwareSignal:
    """One reason to suspect a node, identified by its kind and GPU (never by a counter
    value: a growing ECC count is the same signal, not a new one)."""

    kind: str  # one of SIGNAL_KINDS
    gpu: str  # GPU uuid (or index / PCI bus id when unknown)
    detail: str
    # what the catalog says it needs: health_check | operator_action | reset_gpu | reboot | replace
    action: str

    @property
    def fingerprint(self) -> str:
        return f"{self.kind}:{self.gpu}"

    def describe(self) -> str:
        needs = "a DCGM health check" if self.action == Action.HEALTH_CHECK.value else self.action
        return f"{self.detail} (GPU {self.gpu}; catalog: {needs})"


# The telemetry fields that are catalog GPU signals (the catalog's ``gpu_signal`` names).
_SIGNAL_KIND = {"remap_failure": GpuSignalKind.REMAP_FAILURE, "remap_pending": GpuSignalKind.REMAP_PENDING,
                "ecc_uncorrected": GpuSignalKind.ECC_UNCORRECTED_VOLATILE}


def catalog_action(catalog: FaultCatalog, *, xid: int | None = None,
                   signal: GpuSignalKind | None = None) -> Action | None:
    """What the fault catalog says one XID or GPU signal seen in telemetry needs, when that
    is a node action or the DCGM diag (a hardware signal); None when it is not one (the
    application's fault, informational, or no rule). The catalog is the one source of truth:
    a rule that only wants the diag first still names what it expects."""
    evidence = Evidence(node_id="", fault_at=0.0, trigger=Trigger.TELEMETRY,
                        xids=(XidEvent(xid, "", 0.0),) if xid is not None else (),
                        gpu_signals=(GpuSignal(signal, ""),) if signal is not None else ())
    decision = classify(evidence, catalog)
    action = decision.expected_action or decision.action
    return action if action in NODE_ACTIONS or action is Action.HEALTH_CHECK else None


# Signals of events (an XID the driver logged), not of the GPU's state.
EVENT_SIGNAL_KINDS = frozenset({"xid", "unmapped_xid"})


def gpu_name(gpu: Mapping[str, Any]) -> str:
    """How a reported GPU is named on the node's item: its uuid, else its index."""
    return _gpu_name(gpu)


def _gpu_name(gpu: Mapping[str, Any]) -> str:
    return str(gpu.get("uuid") or f"index-{gpu.get('index')}")[:MAX_SIGNAL_NAME]


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def hardware_signals(
    gpus: Iterable[Mapping[str, Any]], catalog: FaultCatalog,
    unmapped_xids: Iterable[Mapping[str, Any]] = (),
) -> list[HardwareSignal]:
    """Signals that make a node SUSPECT, one per (kind, GPU), sorted by fingerprint: the
    XIDs and GPU signals for which ``catalog`` names a node action or the DCGM diag, each
    with that action (an XID signal: the most severe of its GPU's XIDs).

    At most :data:`MAX_UNMAPPED_SIGNALS` Xids on GPUs missing from nvidia-smi are kept.
    """
    found: dict[str, HardwareSignal] = {}
    xids: dict[str, dict[int, Action]] = {}
    actions: dict[int, Action | None] = {}  # per distinct XID: a report may list hundreds

    def xid_action(xid: Any) -> Action | None:
        if not isinstance(xid, int) or isinstance(xid, bool):
            return None
        if xid not in actions:
            actions[xid] = catalog_action(catalog, xid=xid)
        return actions[xid]

    def add(signal: HardwareSignal) -> None:
        found.setdefault(signal.fingerprint, signal)

    def add_kind(kind: str, gpu: str, detail: str) -> None:
        action = catalog_action(catalog, signal=_SIGNAL_KIND[kind])
        if action is not None:
            add(HardwareSignal(kind, gpu, detail, action.value))

    for gpu in gpus:
        name = _gpu_name(gpu)
        if gpu.get("remapped_rows_failure") is True or _positive(gpu.get("remapped_rows_failure")):
            add_kind("remap_failure", name, "row remapping failed")
        if gpu.get("remapped_rows_pending") is True or _positive(gpu.get("remapped_rows_pending")):
            add_kind("remap_pending", name, "row remap pending")
        ecc = gpu.get("ecc_uncorrected_volatile")
        if ecc is not None and _positive(ecc):
            add_kind("ecc_uncorrected", name, f"{int(ecc)} uncorrected volatile ECC errors")
        for xid in gpu.get("xids") or []:
            action = xid_action(xid)
            if action is not None:
                xids.setdefault(name, {})[xid] = action
    for name, seen in xids.items():
        worst = max(seen.values(), key=ACTION_SEVERITY.__getitem__)
        add(HardwareSignal("xid", name, "Xid " + ", ".join(map(str, sorted(seen))), worst.value))
    unmapped = 0
    for entry in unmapped_xids:
        xid = entry.get("xid")
        bus = str(entry.get("pci_bus_id") or "?")[:MAX_SIGNAL_NAME]
        action = xid_action(xid)
        if action is not None:
            signal = HardwareSignal("unmapped_xid", f"pci-{bus}",
                                    f"Xid {xid} on a GPU missing from nvidia-smi", action.value)
            if signal.fingerprint not in found:
                if unmapped >= MAX_UNMAPPED_SIGNALS:
                    continue
                unmapped += 1
            add(signal)
    return [found[k] for k in sorted(found)]


@dataclass(frozen=True)
class SignalUpdate:
    """The node's stored signals after a report, and what the report brought."""

    stored: dict[str, dict[str, Any]]  # fingerprint -> {"k": kind, "f": first seen, "l": last seen}
    fresh: list[HardwareSignal]  # not stored before (or pruned since): may notify / flag SUSPECT
    notify: list[HardwareSignal]  # fresh signals whose kind may notify now
    suppressed: list[HardwareSignal]  # fresh signals held back by the per-kind rate limit
    notified: dict[str, float]  # kind -> last notification time, after this report


def stored_signals(raw: Any, now: float) -> dict[str, dict[str, Any]]:
    """The stored signals in their current form; an older string set (one fingerprint
    per counter value) reads as seen now, so it is pruned by the usual rules."""
    if isinstance(raw, Mapping):
        return {str(k): dict(v) for k, v in raw.items() if isinstance(v, Mapping)}
    if isinstance(raw, set | frozenset | list):
        return {str(fp): {"k": str(fp).split(":", 1)[0], "f": now, "l": now} for fp in raw}
    return {}


def update_signals(
    stored: Mapping[str, Mapping[str, Any]],
    signals: Iterable[HardwareSignal],
    notified: Mapping[str, Any],
    now: float,
    *,
    retention_seconds: float,
    notify_interval_seconds: float,
    repaired_at: float | None = None,
) -> SignalUpdate:
    """Merge a report's signals into the stored ones, pruned and bounded.

    * A stored signal not seen for ``retention_seconds``, or last seen before the node
      was repaired (``repaired_at``: its boot after a reboot), is forgotten.
    * At most :data:`MAX_STORED_SIGNALS` are kept (the most recently seen).
    * A fresh signal notifies only if no signal of its kind notified for this node in
      the last ``notify_interval_seconds``; otherwise it is suppressed (still stored,
      still flags the node SUSPECT).
    """
    kept: dict[str, dict[str, Any]] = {}
    for fingerprint, entry in stored.items():
        last = float(entry.get("l", 0) or 0)
        if now - last > retention_seconds:
            continue
        if repaired_at is not None and last < repaired_at <= now:
            continue
        kept[fingerprint] = {"k": str(entry.get("k", "")), "f": float(entry.get("f", last) or last),
                             "l": last}
    fresh: list[HardwareSignal] = []
    for signal in signals:
        known = kept.get(signal.fingerprint)
        if known is None:
            fresh.append(signal)
            kept[signal.fingerprint] = {"k": signal.kind, "f": now, "l": now}
        else:
            known["l"] = now
    if len(kept) > MAX_STORED_SIGNALS:
        newest = sorted(kept.items(), key=lambda kv: (kv[1]["l"], kv[0]), reverse=True)
        kept = dict(newest[:MAX_STORED_SIGNALS])
    last_notified = {str(k): float(v) for k, v in notified.items() if _number(v)}
    notify: list[HardwareSignal] = []
    suppressed: list[HardwareSignal] = []
    due: set[str] = set()
    for signal in fresh:
        previous = last_notified.get(signal.kind)
        if signal.kind in due or previous is None or now - previous >= notify_interval_seconds:
            due.add(signal.kind)
            notify.append(signal)
        else:
            suppressed.append(signal)
    for kind in due:
        last_notified[kind] = now
    return SignalUpdate(kept, fresh, notify, suppressed, last_notified)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


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
    ("ecc_corrected_volatile", "eccc"),
    ("remapped_rows_pending", "rp"),
    ("remapped_rows_failure", "rf"),
    ("recovery_action", "ra"),
    ("nvlink_crc_errors", "nvc"),
    ("nvlink_replay_errors", "nvr"),
    ("nvlink_recovery_errors", "nvq"),
    ("xids", "x"),
)


def _compact(value: Any) -> Any:
    if isinstance(value, float):
        # Two decimals are plenty for telemetry, and a tiny float (1e-300) would be
        # outside DynamoDB's number range.
        return round(value, 2)
    if isinstance(value, list):
        return sorted({v for v in value if isinstance(v, int)})[:MAX_XIDS_STORED_PER_GPU]
    return value


def compact_telemetry(gpus: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Short keys, nulls and empty Xid lists dropped, numbers rounded, Xids deduplicated
    and capped: the item stays near 1 KB for 8 GPUs (every report rewrites it, and
    DynamoDB bills writes per KB of item size)."""
    rows = []
    for gpu in gpus:
        row = {}
        for name, short in _TELEMETRY_FIELDS:
            value = gpu.get(name)
            if value is None or value == []:
                continue
            row[short] = _compact(value)
        rows.append(row)
    return rows


# The recovery sweep's backstop for a job the heartbeats moved out of RUNNING: it looks
# this long after the heartbeat sweep should have handed the job on (or, with nothing to
# hand on, this often) and does it itself if that never happened.
BACKSTOP_MARGIN_SECONDS = 300
BACKSTOP_RECHECK_SECONDS = 3600


def backstop_deadline(now: float, escalate_at: float | None) -> float:
    """When the recovery sweep looks at a NODE_LOST / HUNG job (docs/recovery-loop.md)."""
    if escalate_at is None:
        return now + BACKSTOP_RECHECK_SECONDS
    return max(escalate_at, now) + BACKSTOP_MARGIN_SECONDS
