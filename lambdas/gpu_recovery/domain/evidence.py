"""Evidence of one fault: how it was noticed, the XIDs and GPU signals the node agent
reported around it, and the DCGM verdict JSON once the health check ran.

Pure: built from what the caller read (the ECS event, the container-instance item the
heartbeat service writes, the verdict line of the health check); time is passed in.
Serializable with ``to_dict`` / ``from_dict`` for the job's and the node's history, and
rendered for the operator e-mail with ``render_lines``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from gpu_recovery.domain.fault_catalog import FaultCatalog
from gpu_recovery.domain.fault_vocabulary import (
    DCGM_VERDICT_NAMES,
    REBOOT_RECOVERY_ACTIONS,
    RECOVERY_ACTIONS,
    RESET_RECOVERY_ACTIONS,
    GpuSignalKind,
    Trigger,
    category_name,
    severity_name,
)
from gpu_recovery.domain.gpu_counters import CounterRate, rates_from_item

# Where the heartbeat service keeps the node agent's reports on the container-instance item.
ITEM_GPU_EVENTS = "gpu_events"  # [{"t": epoch, "g": gpu, "x": xid}], see heartbeat_policy
ITEM_TELEMETRY = "gpu_telemetry"  # latest report, compact keys (heartbeat_policy.compact_telemetry)
ITEM_TELEMETRY_AT = "last_gpu_report_at"
ITEM_REPORT_ERROR = "gpu_report_error"  # "nvidia-smi exited 255: <its lines joined by ' | '>"
# The node's decided faults (escalation.NodeFaultRecord.to_dict): each lists the XIDs it used.
ITEM_FAULT_HISTORY = "fault_history"
# The counters rising in the latest report (domain.gpu_counters.CounterRate.to_dict; only
# those that rose) and their anchors.
ITEM_COUNTER_RATES = "gpu_counter_rates"
ITEM_COUNTER_ANCHORS = "gpu_counters"

SOURCE_TELEMETRY = "telemetry"
SOURCE_HEALTH_CHECK = "health_check"
_PCI = re.compile(r"GPU\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f])?)")
_AGENT_EXIT = re.compile(r"nvidia-smi exited (\d+)")
_SMI_EXIT_SIGNAL = {15: GpuSignalKind.FALLEN_OFF_BUS, 14: GpuSignalKind.INFOROM_CORRUPTED,
                    9: GpuSignalKind.DRIVER_NOT_LOADED}


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _float_or_none(value: Any) -> float | None:
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def _utc(at: float | None) -> str:
    return "?" if at is None else datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


@dataclass(frozen=True)
class XidEvent:
    xid: int
    gpu: str  # GPU uuid, or "pci-<bus id>" for a GPU nvidia-smi no longer lists
    at: float  # when the heartbeat service received the report

    def to_dict(self) -> dict[str, Any]:
        return {"xid": self.xid, "gpu": self.gpu, "at": self.at}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> XidEvent:
        return cls(int(raw["xid"]), str(raw.get("gpu", "")), float(raw["at"]))


@dataclass(frozen=True)
class GpuSignal:
    kind: GpuSignalKind
    gpu: str
    detail: str = ""
    at: float | None = None
    source: str = SOURCE_TELEMETRY

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind.value, "gpu": self.gpu, "detail": self.detail,
                               "source": self.source}
        return out if self.at is None else {**out, "at": self.at}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> GpuSignal:
        return cls(GpuSignalKind(raw["kind"]), str(raw.get("gpu", "")), str(raw.get("detail", "")),
                   _float_or_none(raw.get("at")), str(raw.get("source", SOURCE_TELEMETRY)))


def gpu_state_signals(gpu: str, *, remap_failure: bool = False, remap_pending: bool = False,
                      ecc: int | None = None, recovery_action: str = "unknown",
                      retirement_pending: bool = False, at: float | None,
                      source: str) -> list[GpuSignal]:
    """The signals of one GPU's state (nvidia-smi, from the health check or the node agent).

    Uncorrected volatile ECC errors on a GPU whose pending row remap or whose driver's reset
    request accounts for them are part of that signal, not a reboot signal of their own: an
    uncorrectable memory error is what marks the row for remapping, the remap "will happen at
    the next GPU reset", and a reset clears the volatile counters (NVIDIA GPU memory error
    management; nvidia-smi man page, Remapped Rows and ECC Errors). The health check judges
    the same way (health_check/README.md, verdict reset).
    """
    out: list[GpuSignal] = []
    ecc_text = f"{ecc} uncorrected volatile ECC errors" if ecc else ""
    reset_requested = recovery_action in RESET_RECOVERY_ACTIONS
    if remap_failure:
        out.append(GpuSignal(GpuSignalKind.REMAP_FAILURE, gpu, "row remapping failed", at, source))
    if remap_pending:
        detail = "row remap pending" + (f" ({ecc_text}, cleared by the reset)" if ecc_text else "")
        out.append(GpuSignal(GpuSignalKind.REMAP_PENDING, gpu, detail, at, source))
    if reset_requested:
        detail = f"driver recovery action {recovery_action}"
        if ecc_text and not remap_pending:
            detail += f" ({ecc_text}, cleared by the reset)"
        out.append(GpuSignal(GpuSignalKind.RESET_REQUESTED, gpu, detail, at, source))
    elif recovery_action in REBOOT_RECOVERY_ACTIONS:
        out.append(GpuSignal(GpuSignalKind.REBOOT_REQUESTED, gpu, f"driver recovery action {recovery_action}",
                             at, source))
    if ecc_text and not (remap_pending or reset_requested):
        out.append(GpuSignal(GpuSignalKind.ECC_UNCORRECTED_VOLATILE, gpu, ecc_text, at, source))
    if retirement_pending:
        out.append(GpuSignal(GpuSignalKind.RETIREMENT_PENDING, gpu, "pages pending retirement", at, source))
    return out


def smi_failure_signals(exit_code: int | None, lines: Iterable[str], *, at: float | None,
                        source: str) -> list[GpuSignal]:
    """Signals in nvidia-smi's failure: its exit code (man page: 9 driver not loaded, 14
    infoROM corrupted, 15 fallen off the bus) and its messages, e.g. the real "Unable to
    determine the device handle for GPU 0000:09:00.0: Unknown Error"."""
    found: dict[tuple[GpuSignalKind, str], GpuSignal] = {}
    for line in lines:
        lower = line.lower()
        kind = None
        if "fallen off the bus" in lower or "unable to determine the device handle" in lower:
            kind = GpuSignalKind.FALLEN_OFF_BUS
        elif "inforom is corrupted" in lower:
            kind = GpuSignalKind.INFOROM_CORRUPTED
        elif "couldn't communicate with the nvidia driver" in lower:
            kind = GpuSignalKind.DRIVER_NOT_LOADED
        if kind is not None:
            pci = _PCI.search(line)
            gpu = f"pci-{pci.group(1).lower()}" if pci else "unknown"
            found.setdefault((kind, gpu), GpuSignal(kind, gpu, line.strip()[:300], at, source))
    if exit_code and not found:
        kind = _SMI_EXIT_SIGNAL.get(exit_code, GpuSignalKind.GPU_QUERY_FAILED)
        found[(kind, "unknown")] = GpuSignal(kind, "unknown", f"nvidia-smi exit code {exit_code}", at, source)
    return list(found.values())


@dataclass(frozen=True)
class DcgmError:
    test: str
    error_id: int | None
    severity: int | None
    category: int | None
    message: str = ""

    @property
    def severity_name(self) -> str:
        return severity_name(self.severity)

    @property
    def category_name(self) -> str:
        return category_name(self.category)

    def to_dict(self) -> dict[str, Any]:
        return {"test": self.test, "error_id": self.error_id, "severity": self.severity,
                "category": self.category, "message": self.message}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DcgmError:
        return cls(str(raw.get("test", "")), _int_or_none(raw.get("error_id")),
                   _int_or_none(raw.get("severity")), _int_or_none(raw.get("category")),
                   str(raw.get("message", "")))


@dataclass(frozen=True)
class DcgmFindings:
    """The health check's verdict line (health_check/README.md), tolerant of older scripts."""

    verdict: str
    exit_code: int | None = None
    dcgmi_exit_code: int | None = None
    dcgm_level: int | None = None
    failed_tests: tuple[str, ...] = ()
    errors: tuple[DcgmError, ...] = ()
    gpus: tuple[Mapping[str, Any], ...] = ()
    smi_exit_code: int | None = None
    smi_errors: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    task_arn: str = ""

    @classmethod
    def from_verdict_json(cls, data: Mapping[str, Any] | None, *, exit_code: int | None = None,
                          task_arn: str = "") -> DcgmFindings:
        """From the JSON line (may be missing: the log could not be read) and the task's exit code."""
        data = data or {}
        code = _int_or_none(data.get("exit_code"))
        code = exit_code if code is None else code
        verdict = data.get("verdict")
        if verdict not in DCGM_VERDICT_NAMES:
            if code is None or not 0 <= code < len(DCGM_VERDICT_NAMES):
                raise ValueError(f"not a health-check verdict: verdict {verdict!r}, exit code {code!r}")
            verdict = DCGM_VERDICT_NAMES[code]
        return cls(
            verdict=str(verdict), exit_code=code,
            dcgmi_exit_code=_int_or_none(data.get("dcgmi_exit_code")),
            dcgm_level=_int_or_none(data.get("dcgm_level")),
            failed_tests=tuple(str(t) for t in data.get("failed_tests") or ()),
            errors=tuple(DcgmError.from_dict(e) for e in data.get("errors") or () if isinstance(e, Mapping)),
            gpus=tuple(g for g in data.get("gpus") or () if isinstance(g, Mapping)),
            smi_exit_code=_int_or_none(data.get("smi_exit_code")),
            smi_errors=tuple(str(s) for s in data.get("smi_errors") or ()),
            reasons=tuple(str(r) for r in data.get("reasons") or ()),
            notes=tuple(str(n) for n in data.get("notes") or ()),
            task_arn=str(data.get("task_arn") or task_arn),
        )

    from_dict = from_verdict_json

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "exit_code": self.exit_code,
                "dcgmi_exit_code": self.dcgmi_exit_code, "dcgm_level": self.dcgm_level,
                "failed_tests": list(self.failed_tests), "errors": [e.to_dict() for e in self.errors],
                "gpus": [dict(g) for g in self.gpus], "smi_exit_code": self.smi_exit_code,
                "smi_errors": list(self.smi_errors), "reasons": list(self.reasons),
                "notes": list(self.notes), "task_arn": self.task_arn}

    def recovery_action(self, gpu: Mapping[str, Any]) -> str:
        """The driver's recovery action for one GPU of the verdict; "unknown" when not said
        (older scripts and drivers, N/A, an unlisted value)."""
        action = str(gpu.get("recovery_action") or "unknown")
        return action if action in RECOVERY_ACTIONS else "unknown"

    def signals(self, at: float | None) -> list[GpuSignal]:
        """GPU signals the health check's own nvidia-smi queries saw (see :func:`gpu_state_signals`)."""
        out: list[GpuSignal] = []
        for gpu in self.gpus:
            name = str(gpu.get("uuid") or f"index-{gpu.get('index')}")
            out += gpu_state_signals(
                name, remap_failure=gpu.get("remap_failure") is True,
                remap_pending=gpu.get("remap_pending") is True,
                ecc=_int_or_none(gpu.get("ecc_uncorrected_volatile")),
                recovery_action=self.recovery_action(gpu),
                retirement_pending=gpu.get("retired_pages_pending") is True, at=at,
                source=SOURCE_HEALTH_CHECK)
        return out + smi_failure_signals(self.smi_exit_code, self.smi_errors, at=at,
                                         source=SOURCE_HEALTH_CHECK)


@dataclass(frozen=True)
class Evidence:
    node_id: str
    fault_at: float
    trigger: Trigger
    job_id: str = ""
    attempt: int = 0
    rank: int | None = None
    exit_code: int | None = None
    stop_code: str = ""
    stopped_reason: str = ""
    xids: tuple[XidEvent, ...] = ()  # reported within the fault's window
    xid_history: tuple[XidEvent, ...] = ()  # earlier ones, for the catalog's repeat rules
    gpu_signals: tuple[GpuSignal, ...] = ()
    dcgm: DcgmFindings | None = None
    # The gang preflight's finding on this node (trigger preflight): why it was pinned, the
    # round, the group or loopback result that pinned it (busbw, threshold), the peer node.
    preflight: Mapping[str, Any] | None = None
    counter_rates: tuple[CounterRate, ...] = ()  # counters rising, per the node's reports

    def with_dcgm(self, findings: DcgmFindings, at: float) -> Evidence:
        """The same fault once its health check finished (adds what its nvidia-smi saw)."""
        return replace(self, dcgm=findings, gpu_signals=self.gpu_signals + tuple(findings.signals(at)))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node_id": self.node_id, "fault_at": self.fault_at, "trigger": self.trigger.value,
            "job_id": self.job_id, "attempt": self.attempt, "rank": self.rank,
            "exit_code": self.exit_code, "stop_code": self.stop_code,
            "stopped_reason": self.stopped_reason,
            "xids": [x.to_dict() for x in self.xids],
            "xid_history": [x.to_dict() for x in self.xid_history],
            "gpu_signals": [s.to_dict() for s in self.gpu_signals],
        }
        if self.counter_rates:
            out["counter_rates"] = [r.to_dict() for r in self.counter_rates]
        if self.dcgm is not None:
            out["dcgm"] = self.dcgm.to_dict()
        if self.preflight:
            out["preflight"] = dict(self.preflight)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Evidence:
        return cls(
            node_id=str(raw["node_id"]), fault_at=float(raw["fault_at"]), trigger=Trigger(raw["trigger"]),
            job_id=str(raw.get("job_id", "")), attempt=int(raw.get("attempt") or 0),
            rank=_int_or_none(raw.get("rank")), exit_code=_int_or_none(raw.get("exit_code")),
            stop_code=str(raw.get("stop_code", "")), stopped_reason=str(raw.get("stopped_reason", "")),
            xids=tuple(XidEvent.from_dict(x) for x in raw.get("xids") or ()),
            xid_history=tuple(XidEvent.from_dict(x) for x in raw.get("xid_history") or ()),
            gpu_signals=tuple(GpuSignal.from_dict(s) for s in raw.get("gpu_signals") or ()),
            dcgm=DcgmFindings.from_verdict_json(raw["dcgm"]) if raw.get("dcgm") else None,
            preflight=dict(raw["preflight"]) if isinstance(raw.get("preflight"), Mapping) else None,
            counter_rates=tuple(rates_from_item(raw.get("counter_rates"))),
        )

    def render_lines(self) -> list[str]:
        """Plain-text lines for the operator e-mail."""
        how = {Trigger.TASK_EXIT: "task exit", Trigger.NODE_LOST: "node lost", Trigger.HUNG: "rank hung",
               Trigger.TELEMETRY: "GPU telemetry", Trigger.VALIDATION: "validation after repair",
               Trigger.PREFLIGHT: "gang preflight"}[self.trigger]
        head = f"{how} on {self.node_id} at {_utc(self.fault_at)}"
        if self.trigger is Trigger.TASK_EXIT:
            code = "no exit code" if self.exit_code is None else f"exit code {self.exit_code}"
            rank = "" if self.rank is None else f"rank {self.rank} "
            stop = ", ".join(s for s in (self.stop_code, self.stopped_reason) if s)
            head += f": {rank}{code}" + (f" ({stop})" if stop else "")
        lines = [head]
        if self.preflight:
            p = self.preflight
            lines.append(f"Preflight (round {p.get('round', '?')}): {p.get('reason', '')}"
                         + (f"; {p['result']}" if p.get("result") else ""))
        lines.append("XIDs: " + ("; ".join(f"{x.xid} on {x.gpu} at {_utc(x.at)}" for x in self.xids)
                                 if self.xids else "none reported"))
        if self.gpu_signals:
            lines.append("GPU signals: " + "; ".join(
                f"{s.kind.value} on {s.gpu} ({s.detail}, from {s.source})" for s in self.gpu_signals))
        if self.counter_rates:
            lines.append("Counters: " + "; ".join(r.describe() for r in self.counter_rates))
        if self.dcgm is not None:
            d = self.dcgm
            known = [f"{name} {value}" for name, value in (
                ("exit", d.exit_code), ("dcgmi exit", d.dcgmi_exit_code), ("level", d.dcgm_level),
                ("nvidia-smi exit", d.smi_exit_code)) if value is not None]
            lines.append(f"DCGM health check: {d.verdict}" + (f" ({', '.join(known)})" if known else ""))
            if d.failed_tests:
                lines.append("  failed tests: " + ", ".join(d.failed_tests))
            for e in d.errors:
                lines.append(f"  DCGM error {e.error_id} in {e.test or '-'} ({e.severity_name}, "
                             f"{e.category_name}): {e.message}")
            lines += [f"  nvidia-smi: {e}" for e in d.smi_errors]
            lines += [f"  reason: {r}" for r in d.reasons] + [f"  note: {n}" for n in d.notes]
        return lines


# ------------------------------------------------------------------------ builders
def recovery_action_of(row: Mapping[str, Any]) -> str:
    """A compact telemetry row's recovery action ("unknown" when the driver did not say)."""
    action = str(row.get("ra") or "unknown")
    return action if action in RECOVERY_ACTIONS else "unknown"


def node_reports(instance_item: Mapping[str, Any] | None) -> tuple[list[XidEvent], list[GpuSignal]]:
    """Every XID the container-instance item remembers and the signals of its latest GPU report."""
    item = instance_item or {}
    events: dict[tuple[int, str, float], XidEvent] = {}
    for raw in item.get(ITEM_GPU_EVENTS) or ():
        xid, at = _int_or_none(raw.get("x")), _float_or_none(raw.get("t"))
        if xid is not None and at is not None:
            event = XidEvent(xid, str(raw.get("g", "")), at)
            events[(event.xid, event.gpu, event.at)] = event
    at = _float_or_none(item.get(ITEM_TELEMETRY_AT))
    signals: list[GpuSignal] = []
    for row in item.get(ITEM_TELEMETRY) or ():
        gpu = str(row.get("u") or f"index-{row.get('i')}")
        for xid in row.get("x") or ():
            if at is not None and _int_or_none(xid) is not None:
                events.setdefault((int(xid), gpu, at), XidEvent(int(xid), gpu, at))
        signals += gpu_state_signals(gpu, remap_failure=row.get("rf") is True,
                                     remap_pending=row.get("rp") is True, ecc=_int_or_none(row.get("ecc")),
                                     recovery_action=recovery_action_of(row), at=at, source=SOURCE_TELEMETRY)
    error = str(item.get(ITEM_REPORT_ERROR) or "")
    if error:
        code = _AGENT_EXIT.search(error)
        signals += smi_failure_signals(int(code.group(1)) if code else None, error.split(" | "),
                                       at=at, source=SOURCE_TELEMETRY)
    return sorted(events.values(), key=lambda e: (e.at, e.gpu, e.xid)), signals


def decided_xids(instance_item: Mapping[str, Any] | None, before: float) -> set[XidEvent]:
    """The XIDs an earlier fault on this node was decided on: those its record in the node's
    fault history (decided before ``before``) lists as its evidence."""
    used: set[XidEvent] = set()
    for record in (instance_item or {}).get(ITEM_FAULT_HISTORY) or ():
        at = _float_or_none(record.get("at")) if isinstance(record, Mapping) else None
        if at is None or at >= before:
            continue
        for raw in record.get("xids") or ():
            try:
                used.add(XidEvent.from_dict(raw))
            except (KeyError, TypeError, ValueError):
                continue
    return used


def build_evidence(*, node_id: str, fault_at: float, trigger: Trigger,
                   instance_item: Mapping[str, Any] | None = None, job_id: str = "", attempt: int = 0,
                   rank: int | None = None, exit_code: int | None = None, stop_code: str = "",
                   stopped_reason: str = "", catalog: FaultCatalog | None = None,
                   lookback_seconds: float = 900, lookahead_seconds: float = 120,
                   repeat_lookback_seconds: float = 0) -> Evidence:
    """The evidence of a fault on ``node_id`` at ``fault_at``.

    XIDs reported within [fault_at - lookback, fault_at + lookahead] are this fault's, except
    those an earlier fault on the node was already decided on (:func:`decided_xids`: an XID
    13 that restarted the job must not make the next fault on the node an application error
    too); those, and older ones within ``repeat_lookback_seconds``, go to ``xid_history``
    (the repeat rules still count them). GPU signals come from the node's latest report when
    it falls in the same window: they are the node's state now, not an event to use up.
    With ``catalog`` the three windows are the catalog's.
    """
    if catalog is not None:
        lookback_seconds, lookahead_seconds = catalog.lookback_seconds, catalog.lookahead_seconds
        repeat_lookback_seconds = catalog.repeat_lookback_seconds
    start, end = fault_at - lookback_seconds, fault_at + lookahead_seconds
    history_start = fault_at - max(repeat_lookback_seconds, lookback_seconds)
    events, signals = node_reports(instance_item)
    # Only faults decided before this one happened: re-deciding this same fault later (after
    # its health check, or its fast path re-read) must still see its own XIDs.
    used = decided_xids(instance_item, before=fault_at)
    current = [e for e in events if start <= e.at <= end and e not in used]
    report_at = _float_or_none((instance_item or {}).get(ITEM_TELEMETRY_AT))
    rates = rates_from_item((instance_item or {}).get(ITEM_COUNTER_RATES)) \
        if report_at is not None and start <= report_at <= end else []
    return Evidence(
        node_id=node_id, fault_at=fault_at, trigger=trigger, job_id=job_id, attempt=attempt, rank=rank,
        exit_code=exit_code, stop_code=stop_code, stopped_reason=stopped_reason,
        xids=tuple(current),
        xid_history=tuple(e for e in events if history_start <= e.at <= end and e not in current),
        gpu_signals=tuple(s for s in signals if s.at is not None and start <= s.at <= end),
        counter_rates=tuple(rates),
    )

