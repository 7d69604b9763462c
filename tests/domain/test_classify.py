"""Classification: evidence + the default catalog (+ node history) -> decision."""

from __future__ import annotations

import pytest

from gpu_recovery.domain.classify import Decision, classify
from gpu_recovery.domain.escalation import NodeFaultRecord
from gpu_recovery.domain.evidence import DcgmFindings, Evidence, GpuSignal, XidEvent
from gpu_recovery.domain.fault_catalog import load_catalog
from gpu_recovery.domain.fault_vocabulary import Action, Budget, GpuSignalKind, Trigger

T = 1_734_220_000.0
HOUR = 3600.0
SUSPECT = {1}
CATALOG = load_catalog()


def fault(*, exit_code: int | None = 1, trigger: Trigger = Trigger.TASK_EXIT, xids=(), history=(),
          signals=(), stop_code: str = "EssentialContainerExited", reason: str = "") -> Evidence:
    return Evidence(node_id="ci-1", fault_at=T, trigger=trigger, job_id="j", exit_code=exit_code,
                    stop_code=stop_code, stopped_reason=reason,
                    xids=tuple(XidEvent(x, g, T - 10) for x, g in xids),
                    xid_history=tuple(XidEvent(x, g, at) for x, g, at in history),
                    gpu_signals=tuple(GpuSignal(k, "GPU-a", "", T - 10) for k in signals))


def decide(evidence: Evidence, history=(), *, reset_as_reboot: bool = False) -> Decision:
    return classify(evidence, CATALOG, history=history, suspect_exit_codes=SUSPECT,
                    reset_as_reboot=reset_as_reboot)


def after(evidence: Evidence, verdict: str, *, reset_as_reboot: bool = False, **extra) -> Decision:
    findings = DcgmFindings.from_verdict_json({"verdict": verdict, **extra})
    return decide(evidence.with_dcgm(findings, T + 150), reset_as_reboot=reset_as_reboot)


# --- before the health check ---------------------------------------------------------------


def test_suspect_exit_alone_runs_the_health_check() -> None:
    d = decide(fault())
    assert (d.action, d.rule_id, d.budget, d.skip_health_check) == (
        Action.HEALTH_CHECK, "exit-suspect", Budget.NONE, False)
    assert "exit code 1 (suspect)" in d.reason


def test_other_exit_alone_is_an_application_error() -> None:
    d = decide(fault(exit_code=2))
    assert (d.action, d.rule_id, d.budget) == (
        Action.APPLICATION_ERROR, "default:unmatched", Budget.APPLICATION)


@pytest.mark.parametrize(("xid", "action"), [(79, Action.REBOOT), (48, Action.RESET_GPU),
                                             (95, Action.RESET_GPU), (64, Action.REPLACE)])
def test_definitive_xid_acts_without_the_diag(xid: int, action: Action) -> None:
    """Given a suspect exit with XID 79/48/95/64 reported in the window, Then the fast path:
    the node action at once, no DCGM run, charged to the infrastructure budget (48 and 95: a
    GPU reset, NVIDIA's immediate action; 79: fallen off the bus, a reboot)."""
    d = decide(fault(xids=[(xid, "GPU-a")]))
    assert (d.action, d.rule_id, d.skip_health_check, d.budget) == (
        action, f"xid-{xid}", True, Budget.INFRASTRUCTURE)
    assert f"XID {xid} on GPU-a" in d.reason and d.cause == f"xid-{xid}"
    assert "exit-suspect" in d.matched_rules


def test_non_definitive_node_xid_asks_the_diag_and_says_what_it_expects() -> None:
    d = decide(fault(xids=[(74, "GPU-a")]))
    assert (d.action, d.expected_action, d.rule_id) == (Action.HEALTH_CHECK, Action.REBOOT, "xid-74")


def test_definitive_rule_wins_a_tie_with_a_diag_first_rule() -> None:
    d = decide(fault(xids=[(74, "GPU-a")], signals=[GpuSignalKind.FALLEN_OFF_BUS]))
    assert (d.action, d.rule_id, d.skip_health_check) == (Action.REBOOT, "gpu-fallen-off-bus", True)
    # A reset_gpu rule is milder than a rule expecting a reboot: the diag runs first.
    d = decide(fault(xids=[(74, "GPU-a")], signals=[GpuSignalKind.REMAP_PENDING]))
    assert (d.action, d.expected_action, d.rule_id) == (Action.HEALTH_CHECK, Action.REBOOT, "xid-74")


@pytest.mark.parametrize("xid", [13, 31, 43, 94])
def test_application_xid_once_is_an_application_error_even_with_a_suspect_exit(xid: int) -> None:
    d = decide(fault(xids=[(xid, "GPU-a")]))
    assert (d.action, d.rule_id, d.budget, d.repeated) == (
        Action.APPLICATION_ERROR, f"xid-{xid}", Budget.APPLICATION, False)


@pytest.mark.parametrize("xid", [13, 31, 43, 94])
def test_application_xid_repeated_on_the_same_gpu_within_24h_earns_a_health_check(xid: int) -> None:
    d = decide(fault(xids=[(xid, "GPU-a")], history=[(xid, "GPU-a", T - 23 * HOUR)]))
    assert (d.action, d.rule_id, d.repeated) == (Action.HEALTH_CHECK, f"xid-{xid}", True)
    assert f"XID {xid} 2 times on GPU-a within 24 h" in d.reason


def test_application_xid_repeat_must_be_on_the_same_gpu_and_within_the_window() -> None:
    other_gpu = decide(fault(xids=[(31, "GPU-a")], history=[(31, "GPU-b", T - HOUR)]))
    too_old = decide(fault(xids=[(31, "GPU-a")], history=[(31, "GPU-a", T - 25 * HOUR)]))
    other_xid = decide(fault(xids=[(31, "GPU-a")], history=[(13, "GPU-a", T - HOUR)]))
    assert {other_gpu.action, too_old.action, other_xid.action} == {Action.APPLICATION_ERROR}


def test_repeat_also_counts_xids_kept_in_the_node_fault_history() -> None:
    record = NodeFaultRecord(at=T - 5 * HOUR, cause="xid-13", action=Action.APPLICATION_ERROR,
                             xids=(XidEvent(13, "GPU-a", T - 5 * HOUR),))
    d = decide(fault(xids=[(13, "GPU-a")]), history=[record])
    assert d.action is Action.HEALTH_CHECK and d.repeated


def test_two_application_xids_in_the_same_report_count_as_a_repeat() -> None:
    evidence = fault()
    evidence = Evidence(**{**evidence.__dict__, "xids": (XidEvent(31, "GPU-a", T - 60),
                                                         XidEvent(31, "GPU-a", T - 10))})
    assert decide(evidence).action is Action.HEALTH_CHECK


def test_informational_xid_never_decides() -> None:
    """Given XID 63 (row remap recorded, NVIDIA IGNORE) with a suspect exit, Then the suspect
    exit decides (health check) and XID 63 is only noted; with a clean exit the usual default."""
    d = decide(fault(xids=[(63, "GPU-a")]))
    assert d.action is Action.HEALTH_CHECK and d.rule_id == "exit-suspect"
    assert any("informational: xid-63" in n for n in d.notes)
    assert decide(fault(exit_code=2, xids=[(92, "GPU-a")])).action is Action.APPLICATION_ERROR
    telemetry_only = decide(fault(exit_code=None, trigger=Trigger.TELEMETRY, xids=[(63, "GPU-a")]))
    assert telemetry_only.action is Action.NONE and telemetry_only.budget is Budget.NONE


def test_ec2_reclaim_restarts_the_job_whatever_the_exit_code() -> None:
    d = decide(fault(stop_code="SpotInterruption"))
    assert (d.action, d.rule_id, d.budget) == (Action.RESTART_JOB, "stop-ec2-reclaim", Budget.INFRASTRUCTURE)


def test_container_oom_is_the_applications() -> None:
    d = decide(fault(exit_code=137, reason="OutOfMemoryError: Container killed due to memory usage"))
    assert (d.action, d.rule_id) == (Action.APPLICATION_ERROR, "stop-container-oom")


@pytest.mark.parametrize("trigger", [Trigger.NODE_LOST, Trigger.HUNG])
def test_heartbeat_faults_run_the_health_check(trigger: Trigger) -> None:
    assert decide(fault(exit_code=None, trigger=trigger)).action is Action.HEALTH_CHECK


@pytest.mark.parametrize(("signal", "action"), [(GpuSignalKind.REMAP_FAILURE, Action.REPLACE),
                                                (GpuSignalKind.FALLEN_OFF_BUS, Action.REBOOT),
                                                (GpuSignalKind.INFOROM_CORRUPTED, Action.REPLACE),
                                                (GpuSignalKind.DRIVER_NOT_LOADED, Action.REBOOT)])
def test_definitive_gpu_signals(signal: GpuSignalKind, action: Action) -> None:
    d = decide(fault(signals=[signal]))
    assert d.action is action and d.skip_health_check


def test_xid_54_is_an_operator_action_without_the_diag() -> None:
    d = decide(fault(xids=[(54, "GPU-a")]))
    assert (d.action, d.skip_health_check) == (Action.OPERATOR_ACTION, True)


# --- after the health check -----------------------------------------------------------------


def test_healthy_diag_makes_it_an_application_error() -> None:
    d = after(fault(xids=[(74, "GPU-a")]), "healthy")
    assert (d.action, d.rule_id, d.budget, d.after_health_check) == (
        Action.APPLICATION_ERROR, "dcgm-verdict-healthy", Budget.APPLICATION, True)


@pytest.mark.parametrize("trigger", [Trigger.NODE_LOST, Trigger.HUNG])
def test_healthy_diag_after_a_silent_node_or_a_hang_is_transient(trigger: Trigger) -> None:
    d = after(fault(exit_code=None, trigger=trigger), "healthy")
    assert d.action is Action.RESTART_JOB and d.budget is Budget.INFRASTRUCTURE


def test_persistence_mode_failure_is_an_operator_action_not_a_reboot() -> None:
    d = after(fault(), "operator_action", errors=[
        {"test": "software", "error_id": 29, "severity": 5, "category": 8, "message": "Persistence"}])
    assert (d.action, d.rule_id) == (Action.OPERATOR_ACTION, "dcgm-error-29-persistence-mode")
    assert d.budget is Budget.INFRASTRUCTURE


@pytest.mark.parametrize(("verdict", "action"), [("reboot", Action.REBOOT), ("replace", Action.REPLACE),
                                                 ("operator_action", Action.OPERATOR_ACTION)])
def test_diag_verdicts(verdict: str, action: Action) -> None:
    d = after(fault(), verdict)
    assert (d.action, d.rule_id) == (action, f"dcgm-verdict-{verdict.replace('_', '-')}")


def test_isolate_error_names_its_rule() -> None:
    d = after(fault(), "replace", errors=[{"test": "memory", "error_id": 4, "severity": 2, "category": 10}])
    assert (d.action, d.rule_id) == (Action.REPLACE, "dcgm-severity-isolate")


def test_health_check_signals_are_evidence_too() -> None:
    """Given a reboot verdict whose own nvidia-smi saw a row-remapping failure, Then replace."""
    d = after(fault(), "replace", gpus=[{"index": 0, "uuid": "GPU-a", "remap_failure": True}])
    assert (d.action, d.rule_id) == (Action.REPLACE, "gpu-remap-failure")
    lost = after(fault(), "reboot", smi_exit_code=255,
                 smi_errors=["Unable to determine the device handle for GPU 0000:09:00.0: Unknown Error"])
    assert lost.rule_id == "gpu-fallen-off-bus" and lost.action is Action.REBOOT


def test_definitive_evidence_still_counts_after_the_diag() -> None:
    d = after(fault(xids=[(64, "GPU-a")]), "healthy")
    assert d.action is Action.REPLACE and d.rule_id == "xid-64"


def test_verdict_no_rule_matches_falls_back_to_the_verdict() -> None:
    document = {"schema_version": 1, "rules": [
        {"id": "only", "match": {"xid": [79]}, "action": "reboot", "description": "d", "source": "s"}]}
    catalog = load_catalog(document)
    evidence = fault().with_dcgm(DcgmFindings.from_verdict_json({"verdict": "replace"}), T + 1)
    d = classify(evidence, catalog, suspect_exit_codes=SUSPECT)
    assert (d.action, d.rule_id) == (Action.REPLACE, "builtin:dcgm-verdict-replace")


def test_priority_lets_a_deployment_downgrade() -> None:
    """Given an override that makes XID 79 with a NCCL reason a plain restart at priority 5,
    Then it beats the definitive reboot."""
    catalog = load_catalog(None, {"rules": [
        {"id": "site-79-nccl", "match": {"xid": [79], "stopped_reason_contains": ["nccl"]},
         "action": "restart_job", "priority": 5, "description": "d", "source": "site"}]})
    d = classify(fault(xids=[(79, "GPU-a")], reason="NCCL watchdog"), catalog, suspect_exit_codes=SUSPECT)
    assert d.action is Action.RESTART_JOB and d.rule_id == "site-79-nccl"


def test_unmatched_default_that_needs_a_node_action_is_checked_first() -> None:
    catalog = load_catalog(None, {"defaults": {"unmatched_action": "reboot"}})
    d = classify(fault(exit_code=2), catalog, suspect_exit_codes=SUSPECT)
    assert (d.action, d.expected_action) == (Action.HEALTH_CHECK, Action.REBOOT)


def test_decision_round_trips_through_a_dict() -> None:
    d = decide(fault(xids=[(74, "GPU-a"), (63, "GPU-a")]))
    assert Decision.from_dict(d.to_dict()) == d


# --- reset_gpu: the driver's recovery action, pending remaps, NVIDIA's RESET_GPU bucket --------

RESET_BUCKET_XIDS = [46, 48, 62, 95, 119, 120, 140, 143, 156, 158]


@pytest.mark.parametrize("xid", RESET_BUCKET_XIDS)
def test_reset_bucket_xids_reset_the_gpu_without_the_diag(xid: int) -> None:
    d = decide(fault(xids=[(xid, "GPU-a")]))
    assert (d.action, d.rule_id, d.skip_health_check, d.budget) == (
        Action.RESET_GPU, f"xid-{xid}", True, Budget.INFRASTRUCTURE)


@pytest.mark.parametrize("xid", [109, 110, 136, 155])
def test_reset_bucket_xids_the_diag_confirms_expect_a_reset(xid: int) -> None:
    d = decide(fault(xids=[(xid, "GPU-a")]))
    assert (d.action, d.expected_action, d.rule_id) == (Action.HEALTH_CHECK, Action.RESET_GPU, f"xid-{xid}")


@pytest.mark.parametrize(("signals", "action", "rule"), [
    ([GpuSignalKind.REMAP_PENDING], Action.RESET_GPU, "gpu-remap-pending"),
    ([GpuSignalKind.RESET_REQUESTED], Action.RESET_GPU, "gpu-recovery-action-reset"),
    ([GpuSignalKind.REBOOT_REQUESTED], Action.REBOOT, "gpu-recovery-action-reboot"),
    ([GpuSignalKind.RETIREMENT_PENDING], Action.REBOOT, "gpu-retirement-pending"),
    # never reset when the driver says node reboot, whatever else says reset
    ([GpuSignalKind.REMAP_PENDING, GpuSignalKind.RESET_REQUESTED, GpuSignalKind.REBOOT_REQUESTED],
     Action.REBOOT, "gpu-recovery-action-reboot"),
    ([GpuSignalKind.REMAP_PENDING, GpuSignalKind.REMAP_FAILURE], Action.REPLACE, "gpu-remap-failure"),
    # ECC errors no pending remap or reset request explains (the evidence builders fold a GPU's
    # own into its remap signal): a reboot, as before
    ([GpuSignalKind.REMAP_PENDING, GpuSignalKind.ECC_UNCORRECTED_VOLATILE], Action.REBOOT,
     "gpu-ecc-uncorrected"),
])
def test_gpu_state_signals_choose_reset_only_when_nothing_asks_for_more(signals, action, rule) -> None:
    d = decide(fault(signals=signals))
    assert (d.action, d.rule_id, d.skip_health_check) == (action, rule, True)


def test_driver_reboot_request_beats_a_reset_bucket_xid() -> None:
    d = decide(fault(xids=[(95, "GPU-a")], signals=[GpuSignalKind.REBOOT_REQUESTED]))
    assert (d.action, d.rule_id) == (Action.REBOOT, "gpu-recovery-action-reboot")


def test_reset_verdict_resets_and_a_reboot_verdict_still_wins() -> None:
    d = after(fault(), "reset", gpus=[{"index": 1, "uuid": "GPU-a", "remap_pending": True,
                                       "ecc_uncorrected_volatile": 3, "recovery_action": "drain_and_reset"}])
    assert d.action is Action.RESET_GPU and d.after_health_check
    assert {"gpu-remap-pending", "gpu-recovery-action-reset", "dcgm-verdict-reset"} <= set(d.matched_rules)
    assert "gpu-ecc-uncorrected" not in d.matched_rules  # the remap's own errors: one signal
    rebooted = after(fault(xids=[(95, "GPU-a")]), "reboot")
    assert (rebooted.action, rebooted.rule_id) == (Action.REBOOT, "dcgm-verdict-reboot")


def test_reset_severity_dcgm_error_asks_for_a_reset_unless_the_verdict_says_reboot() -> None:
    error = {"test": "software", "error_id": 85, "severity": 6, "category": 10}
    assert after(fault(), "reset", errors=[error]).action is Action.RESET_GPU
    assert after(fault(), "reboot", errors=[error]).action is Action.REBOOT


def test_unknown_recovery_action_is_no_evidence() -> None:
    d = after(fault(), "healthy", gpus=[{"index": 0, "uuid": "GPU-a", "recovery_action": "unknown"},
                                        {"index": 1, "uuid": "GPU-b", "recovery_action": "bus_reset"}])
    assert d.action is Action.APPLICATION_ERROR


@pytest.mark.parametrize("xid", RESET_BUCKET_XIDS)
def test_without_a_reset_stage_reset_rules_decide_exactly_as_the_reboot_of_before(xid: int) -> None:
    """reset_as_reboot: the same rule decides, as a reboot, with a note; budget and fast path kept."""
    d = decide(fault(xids=[(xid, "GPU-a")]), reset_as_reboot=True)
    assert (d.action, d.rule_id, d.skip_health_check, d.budget) == (
        Action.REBOOT, f"xid-{xid}", True, Budget.INFRASTRUCTURE)
    assert any("carried out as a reboot" in n for n in d.notes)


def test_without_a_reset_stage_ties_break_as_before() -> None:
    """XID 48 and a pending remap with its ECC errors: the earlier rule (xid-48) decided the reboot
    before reset_gpu existed, and still does."""
    d = decide(fault(xids=[(48, "GPU-a"), (74, "GPU-a")], signals=[GpuSignalKind.REMAP_PENDING]),
               reset_as_reboot=True)
    assert (d.action, d.rule_id) == (Action.REBOOT, "xid-48")
    d = after(fault(), "reset", reset_as_reboot=True)
    assert (d.action, d.rule_id) == (Action.REBOOT, "dcgm-verdict-reset")
