"""Fault evidence: what the node agent reported around the fault and the DCGM verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_recovery.domain.evidence import (
    DcgmFindings,
    Evidence,
    GpuSignal,
    XidEvent,
    build_evidence,
    node_reports,
    smi_failure_signals,
)
from gpu_recovery.domain.fault_catalog import load_catalog
from gpu_recovery.domain.fault_vocabulary import GpuSignalKind, Trigger

REAL = Path(__file__).resolve().parents[1] / "health_check" / "fixtures" / "real"
T = 1_734_220_000.0
HOUR = 3600.0


def item(events=(), telemetry=(), at=T, error=None) -> dict:
    out = {"gpu_events": [{"t": t, "g": g, "x": x} for t, g, x in events],
           "gpu_telemetry": list(telemetry), "last_gpu_report_at": at}
    if error:
        out["gpu_report_error"] = error
    return out


def test_xids_inside_the_window_are_the_faults_and_older_ones_history() -> None:
    """Given XIDs at -20 h, -10 min, +1 min and +10 min around a fault,
    When the evidence is built with a 15 min / 2 min window and a 24 h repeat lookback,
    Then the -10 min and +1 min ones are the fault's, -20 h is history, +10 min is ignored."""
    node = item(events=[(T - 20 * HOUR, "GPU-a", 31), (T - 600, "GPU-a", 31), (T + 60, "GPU-b", 79),
                        (T + 600, "GPU-a", 48)])
    ev = build_evidence(node_id="n", fault_at=T, trigger=Trigger.TASK_EXIT, instance_item=node,
                        lookback_seconds=900, lookahead_seconds=120, repeat_lookback_seconds=24 * HOUR)
    assert [(x.xid, x.gpu) for x in ev.xids] == [(31, "GPU-a"), (79, "GPU-b")]
    assert [(x.xid, x.at) for x in ev.xid_history] == [(31, T - 20 * HOUR)]


def test_an_xid_an_earlier_fault_was_decided_on_is_history_not_this_faults() -> None:
    """Given XID 13 at -5 min that decided a fault at -4 min (the node's history lists it) and
    XID 79 at -1 min nobody used, When a later fault's evidence is built (15 min look-back),
    Then only XID 79 is the fault's; XID 13 is history (the repeat rules still count it)."""
    node = {**item(events=[(T - 300, "GPU-a", 13), (T - 60, "GPU-b", 79)]),
            "fault_history": [{"at": T - 240, "cause": "xid-13", "action": "application_error",
                               "xids": [{"xid": 13, "gpu": "GPU-a", "at": T - 300}]}]}
    ev = build_evidence(node_id="n", fault_at=T, trigger=Trigger.TASK_EXIT, instance_item=node,
                        catalog=load_catalog())
    assert [(x.xid, x.gpu) for x in ev.xids] == [(79, "GPU-b")]
    assert [(x.xid, x.at) for x in ev.xid_history] == [(13, T - 300)]


def test_the_same_fault_decided_again_keeps_its_own_xids() -> None:
    """Given the node's record of this very fault (decided at or after it happened, e.g. its
    health check's verdict), When its evidence is rebuilt, Then its XID is still its own;
    a second XID 13 on the same GPU, after the decided one, is a new event and counts."""
    node = {**item(events=[(T - 300, "GPU-a", 13), (T - 30, "GPU-a", 13)]),
            "fault_history": [{"at": T + 5, "cause": "xid-13", "action": "application_error",
                               "xids": [{"xid": 13, "gpu": "GPU-a", "at": T - 300}]},
                              {"at": T - 200, "cause": "x", "action": "reboot", "xids": [{"bad": 1}]}]}
    ev = build_evidence(node_id="n", fault_at=T, trigger=Trigger.TASK_EXIT, instance_item=node,
                        catalog=load_catalog())
    assert [x.at for x in ev.xids] == [T - 300, T - 30] and ev.xid_history == ()


def test_catalog_windows_are_used_when_given() -> None:
    node = item(events=[(T - 20 * HOUR, "GPU-a", 31)])
    ev = build_evidence(node_id="n", fault_at=T, trigger=Trigger.TASK_EXIT, instance_item=node,
                        catalog=load_catalog())
    assert ev.xids == () and [x.xid for x in ev.xid_history] == [31]


def test_latest_telemetry_gives_signals_and_xids_when_recent() -> None:
    """Given the latest GPU report (compact keys) with a pending remap, uncorrected ECC and an
    XID, When it is 30 s old, Then they are evidence (the ECC errors of the GPU whose remap is
    pending are part of that signal); When it is 2 h old, Then they are not."""
    rows = [{"i": 0, "u": "GPU-a", "rp": True, "ecc": 2, "x": [79]}, {"i": 1, "u": "GPU-b", "rf": True}]
    fresh = build_evidence(node_id="n", fault_at=T, trigger=Trigger.TASK_EXIT,
                           instance_item=item(telemetry=rows, at=T - 30))
    assert {(s.kind, s.gpu) for s in fresh.gpu_signals} == {
        (GpuSignalKind.REMAP_PENDING, "GPU-a"), (GpuSignalKind.REMAP_FAILURE, "GPU-b")}
    assert "2 uncorrected volatile ECC errors" in next(
        s.detail for s in fresh.gpu_signals if s.kind is GpuSignalKind.REMAP_PENDING)
    assert [(x.xid, x.gpu, x.at) for x in fresh.xids] == [(79, "GPU-a", T - 30)]
    stale = build_evidence(node_id="n", fault_at=T, trigger=Trigger.TASK_EXIT,
                           instance_item=item(telemetry=rows, at=T - 2 * HOUR))
    assert stale.gpu_signals == () and stale.xids == ()


def test_same_xid_in_log_and_telemetry_is_one_event() -> None:
    node = item(events=[(T - 30, "GPU-a", 79)], telemetry=[{"i": 0, "u": "GPU-a", "x": [79]}], at=T - 30)
    events, _ = node_reports(node)
    assert events == [XidEvent(79, "GPU-a", T - 30)]


def test_agent_error_with_the_real_fallen_off_the_bus_line_is_a_signal() -> None:
    """Given the node agent's report error carrying nvidia-smi's real output for a GPU that
    fell off the bus (NVIDIA/nvidia-docker#1553), Then the evidence has fallen_off_bus on
    that PCI address, even without XID 79 (NVSentinel #155)."""
    line = (REAL / "smi_fell_off_bus.txt").read_text().strip()
    node = item(at=T - 10, error=f"nvidia-smi exited 255: {line}")
    ev = build_evidence(node_id="n", fault_at=T, trigger=Trigger.TASK_EXIT, instance_item=node)
    assert [(s.kind, s.gpu) for s in ev.gpu_signals] == [(GpuSignalKind.FALLEN_OFF_BUS, "pci-0000:09:00.0")]


@pytest.mark.parametrize(
    ("code", "lines", "kind"),
    [
        (14, (REAL / "smi_inforom_corrupted_p100.txt").read_text().splitlines(),
         GpuSignalKind.INFOROM_CORRUPTED),
        (15, [], GpuSignalKind.FALLEN_OFF_BUS),
        (9, ["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."],
         GpuSignalKind.DRIVER_NOT_LOADED),
        (9, [], GpuSignalKind.DRIVER_NOT_LOADED),
        (255, ["something else"], GpuSignalKind.GPU_QUERY_FAILED),
    ],
)
def test_nvidia_smi_failures(code: int, lines: list[str], kind: GpuSignalKind) -> None:
    assert [s.kind for s in smi_failure_signals(code, lines, at=T, source="x")] == [kind]


def test_nvidia_smi_success_is_no_signal() -> None:
    assert smi_failure_signals(0, [], at=T, source="x") == []
    assert smi_failure_signals(None, ["ok"], at=T, source="x") == []


REAL_PERSISTENCE_VERDICT = {
    "verdict": "operator_action", "exit_code": 3, "dcgm_level": 2, "dcgmi_exit_code": 226,
    "failed_tests": ["software"],
    "errors": [{"test": "software", "error_id": 29, "severity": 5, "category": 8,
                "message": "Persistence Mode: Persistence mode for GPU 0 is disabled."}],
    "gpus": [{"index": 0, "uuid": "GPU-a", "ecc_uncorrected_volatile": 0, "remap_pending": True,
              "remap_failure": False}],
    "smi_exit_code": 0, "smi_errors": [], "reasons": ["configuration"], "notes": [], "hostname": "h"}


def test_dcgm_findings_name_severity_and_category_and_add_signals() -> None:
    findings = DcgmFindings.from_verdict_json(REAL_PERSISTENCE_VERDICT, task_arn="arn:task/1")
    assert findings.verdict == "operator_action" and findings.dcgmi_exit_code == 226
    error = findings.errors[0]
    assert (error.error_id, error.severity_name, error.category_name) == (29, "config", "software_other")
    assert [(s.kind, s.source) for s in findings.signals(T)] == [
        (GpuSignalKind.REMAP_PENDING, "health_check")]
    assert findings.task_arn == "arn:task/1"


def test_an_older_verdict_line_or_none_still_gives_a_verdict() -> None:
    """Given a verdict line from a script without the new fields, or no line at all (log not
    readable), Then the verdict comes from what is there or from the task's exit code."""
    old = DcgmFindings.from_verdict_json({"verdict": "reboot", "exit_code": 1, "failed_tests": ["memory"]})
    assert old.verdict == "reboot" and old.errors == () and old.smi_exit_code is None
    assert DcgmFindings.from_verdict_json(None, exit_code=3).verdict == "operator_action"
    with pytest.raises(ValueError, match="not a health-check verdict"):
        DcgmFindings.from_verdict_json({}, exit_code=137)


def test_evidence_round_trips_through_a_dict() -> None:
    ev = Evidence(node_id="n", fault_at=T, trigger=Trigger.TASK_EXIT, job_id="j", attempt=2, rank=3,
                  exit_code=1, stop_code="EssentialContainerExited", stopped_reason="Essential container",
                  xids=(XidEvent(79, "GPU-a", T - 5),), xid_history=(XidEvent(31, "GPU-a", T - HOUR),),
                  gpu_signals=(GpuSignal(GpuSignalKind.REMAP_PENDING, "GPU-a", "pending", T - 5),))
    ev = ev.with_dcgm(DcgmFindings.from_verdict_json(REAL_PERSISTENCE_VERDICT), T + 100)
    assert Evidence.from_dict(ev.to_dict()) == ev
    assert len(ev.gpu_signals) == 2


def test_render_lines_tell_the_operator_what_was_seen() -> None:
    ev = Evidence(node_id="ci-1", fault_at=T, trigger=Trigger.TASK_EXIT, rank=3, exit_code=1,
                  stop_code="EssentialContainerExited", xids=(XidEvent(79, "GPU-a", T - 5),))
    ev = ev.with_dcgm(DcgmFindings.from_verdict_json(REAL_PERSISTENCE_VERDICT), T + 100)
    text = "\n".join(ev.render_lines())
    assert "task exit on ci-1" in text and "rank 3 exit code 1 (EssentialContainerExited)" in text
    assert "XIDs: 79 on GPU-a at 2024-12-14" in text
    assert "DCGM health check: operator_action (exit 3, dcgmi exit 226, level 2, nvidia-smi exit 0)" in text
    assert "DCGM error 29 in software (config, software_other): Persistence Mode" in text
    assert "remap_pending on GPU-a" in text
    quiet = Evidence(node_id="ci-1", fault_at=T, trigger=Trigger.NODE_LOST).render_lines()
    assert quiet[0].startswith("node lost on ci-1") and quiet[1] == "XIDs: none reported"
