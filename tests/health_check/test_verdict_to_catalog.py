"""The health check's real verdict lines, read as evidence and classified by the default catalog:
the script and the catalog agree on the real captures."""

from __future__ import annotations

import pytest

from gpu_recovery.constants import DcgmVerdict
from gpu_recovery.domain import policy
from gpu_recovery.domain.classify import classify
from gpu_recovery.domain.evidence import DcgmFindings, Evidence
from gpu_recovery.domain.fault_catalog import load_catalog
from gpu_recovery.domain.fault_vocabulary import Action, GpuSignalKind, Trigger
from tests.health_check.script_runner import REAL, run_check

T = 1_734_220_000.0
CATALOG = load_catalog()


def classify_run(run, *, reset_as_reboot: bool = False) -> tuple[Action, str, Evidence]:
    verdict = policy.parse_verdict(run.returncode)
    assert verdict is not None and verdict.name.lower() == run.verdict["verdict"]
    findings = DcgmFindings.from_verdict_json(run.verdict, exit_code=run.returncode)
    evidence = Evidence(node_id="ci-1", fault_at=T, trigger=Trigger.TASK_EXIT, exit_code=1)
    evidence = evidence.with_dcgm(findings, T + 150)
    decision = classify(evidence, CATALOG, suspect_exit_codes={1}, reset_as_reboot=reset_as_reboot)
    return decision.action, decision.rule_id, evidence


def test_real_persistence_mode_run_becomes_an_operator_action(tmp_path) -> None:
    run = run_check(tmp_path, dcgmi=(f"{REAL}/dcgmi_r2_dcgm4.5.2_gb10_plugins_allowed.json", 226))
    assert policy.parse_verdict(run.returncode) is DcgmVerdict.OPERATOR_ACTION
    action, rule, evidence = classify_run(run)
    assert (action, rule) == (Action.OPERATOR_ACTION, "dcgm-error-29-persistence-mode")
    assert "DCGM error 29 in software (config, software_other)" in "\n".join(evidence.render_lines())


def test_real_fallen_off_the_bus_output_becomes_a_reboot_that_escalation_can_count(tmp_path) -> None:
    capture = (f"{REAL}/smi_fell_off_bus.txt", 255)
    run = run_check(tmp_path, smi_gpu=capture, smi_remap=capture)
    action, rule, evidence = classify_run(run)
    assert (action, rule) == (Action.REBOOT, "gpu-fallen-off-bus")
    assert [s.gpu for s in evidence.gpu_signals if s.kind is GpuSignalKind.FALLEN_OFF_BUS] == [
        "pci-0000:09:00.0"]


def test_real_inforom_output_becomes_a_replacement(tmp_path) -> None:
    """The script's contract says reboot for any failing nvidia-smi; the catalog knows exit 14
    is a corrupted infoROM, which NVIDIA says to replace."""
    run = run_check(tmp_path, smi_gpu=(f"{REAL}/smi_inforom_corrupted_p100.txt", 14),
                    smi_remap=("smi_remap_na.csv", 0))
    assert run.returncode == 1
    action, rule, _ = classify_run(run)
    assert (action, rule) == (Action.REPLACE, "gpu-inforom-corrupted")


@pytest.mark.parametrize(("dcgmi", "expected"), [
    (("dcgmi_pass_r2.json", 0), (Action.APPLICATION_ERROR, "dcgm-verdict-healthy")),
    (("dcgmi_memory_ecc_fail_r2.json", 226), (Action.REBOOT, "dcgm-verdict-reboot")),
    (("dcgmi_isolate_dbe_r2.json", 205), (Action.REPLACE, "dcgm-severity-isolate")),
])
def test_recorded_fixtures(tmp_path, dcgmi, expected) -> None:
    action, rule, _ = classify_run(run_check(tmp_path, dcgmi=dcgmi))
    assert (action, rule) == expected


def test_contained_memory_error_becomes_a_reset_and_todays_reboot(tmp_path) -> None:
    """The whole picture of a contained HBM error (driver: Drain and Reset, remap pending, its
    ECC errors, DCGM error 85): verdict reset, catalog reset_gpu; without a reset stage the
    same rule decides a reboot."""
    run = run_check(tmp_path, dcgmi=("dcgmi_pending_row_remap_r2.json", 226),
                    smi_gpu=("smi_gpu_ecc_uncorrected.csv", 0), smi_remap=("smi_remap_pending.csv", 0),
                    smi_q=("smi_q_r570_drain_and_reset.txt", 0))
    assert policy.parse_verdict(run.returncode) is DcgmVerdict.RESET
    action, rule, evidence = classify_run(run)
    assert (action, rule) == (Action.RESET_GPU, "gpu-remap-pending")
    assert {s.kind for s in evidence.gpu_signals} == {
        GpuSignalKind.REMAP_PENDING, GpuSignalKind.RESET_REQUESTED}
    assert classify_run(run, reset_as_reboot=True)[:2] == (Action.REBOOT, "gpu-remap-pending")


def test_driver_reboot_request_is_a_reboot_whatever_else_says_reset(tmp_path) -> None:
    run = run_check(tmp_path, smi_remap=("smi_remap_pending.csv", 0), smi_q=("smi_q_r570_reboot.txt", 0))
    assert run.returncode == 1
    assert classify_run(run)[:2] == (Action.REBOOT, "gpu-recovery-action-reboot")


def test_pages_pending_retirement_are_a_reboot(tmp_path) -> None:
    run = run_check(tmp_path, smi_q=("smi_q_v100_retirement_pending.txt", 0),
                    smi_remap=("smi_no_driver.txt", 2))
    assert classify_run(run)[:2] == (Action.REBOOT, "gpu-retirement-pending")
