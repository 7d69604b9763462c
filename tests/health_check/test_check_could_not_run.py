"""A health check that could not run or could not evaluate gives no verdict about the GPUs.

dcgmi or nvidia-smi missing, a dcgmi that ran no test (no DCGM host engine), the script's own
evaluation dying: exit 5, ``inconclusive``, never ``reboot`` (the monitor failed, not the
hardware: aws/containers-roadmap#2555). A missing tool never hides what the other one found.
"""

from __future__ import annotations

import shutil

import pytest

from gpu_recovery.domain.states import DCGM_INCONCLUSIVE_EXIT_CODE
from tests.health_check.script_runner import SHELLS, SYSTEM_PATH, run_check, write_executable

INCONCLUSIVE = DCGM_INCONCLUSIVE_EXIT_CODE


def _subdir(tmp_path, name: str):
    """A run of its own (each run leaves its fake executables in <dir>/bin)."""
    path = tmp_path / name
    path.mkdir()
    return path


def _skip_if_installed(tool: str) -> None:
    if shutil.which(tool, path=SYSTEM_PATH):
        pytest.skip(f"a real {tool} is installed on this host")


@pytest.mark.parametrize("shell", SHELLS)
def test_dcgmi_missing_is_inconclusive_not_reboot(tmp_path, shell):
    """Given no dcgmi executable can be found (nvidia-smi sees healthy GPUs),
    When the health check runs,
    Then it exits 5, inconclusive, with a null dcgmi exit code and the reason."""
    _skip_if_installed("dcgmi")
    run = run_check(tmp_path, dcgmi=None, shell=shell)

    assert (run.returncode, run.verdict["verdict"]) == (INCONCLUSIVE, "inconclusive")
    assert run.verdict["dcgmi_exit_code"] is None
    assert run.verdict["reasons"] == ["dcgmi cannot run (not found: dcgmi)"]


def test_dcgmi_override_path_missing_is_inconclusive(tmp_path):
    """Given DCGMI points at a path that does not exist,
    When the health check runs,
    Then it exits 5."""
    run = run_check(tmp_path, env={"DCGMI": str(tmp_path / "nope" / "dcgmi")})

    assert run.returncode == INCONCLUSIVE
    assert run.verdict["dcgmi_exit_code"] is None


def test_nvidia_smi_missing_is_inconclusive_even_when_dcgmi_passes(tmp_path):
    """Given no nvidia-smi executable can be found and dcgmi passes,
    When the health check runs,
    Then it exits 5 (not healthy: the ECC and row-remap half of the check never ran), no GPUs."""
    _skip_if_installed("nvidia-smi")
    run = run_check(tmp_path, smi_gpu=None)

    assert (run.returncode, run.verdict["verdict"]) == (INCONCLUSIVE, "inconclusive")
    assert run.verdict["gpus"] == []
    assert run.verdict["reasons"] == ["nvidia-smi cannot run (not found: nvidia-smi)"]


@pytest.mark.parametrize(("dcgmi", "why"), [
    (("dcgmi_host_engine_connection_lost.json", 235),
     "dcgmi diag ran no test (exit 235): Error: Unable to complete diagnostic for entities *,cpu:*. "
     "Return: (-21) : Host engine connection invalid/disconnected\n"),
    (("dcgmi_embedded_host_engine_failed.txt", 249), "dcgmi diag ran no test (exit 249)"),
])
def test_dcgmi_that_cannot_reach_a_host_engine_is_inconclusive(tmp_path, dcgmi, why):
    """Given dcgmi runs but no DCGM host engine answers (the connection lost: DCGM -21, exit 235,
    its runtime_error JSON; or no embedded one could start: DCGM -7, exit 249, plain text),
    When the health check runs on healthy-looking GPUs,
    Then it exits 5, inconclusive, saying why; dcgmi's exit code is kept."""
    run = run_check(tmp_path, dcgmi=dcgmi)

    assert (run.returncode, run.verdict["verdict"]) == (INCONCLUSIVE, "inconclusive")
    assert run.verdict["dcgmi_exit_code"] == dcgmi[1]
    assert run.verdict["reasons"] == [why]
    assert not run.verdict["failed_tests"] and not run.verdict["errors"]


def test_a_dcgm_status_naming_a_lost_gpu_stays_evidence(tmp_path):
    """Given dcgmi ran no test but DCGM's status is about the GPU itself (-18 GPU is lost, exit
    238), unlike a connection failure (exit 235),
    When the health check runs,
    Then the lost GPU is a reboot, the connection failure inconclusive."""
    lost = run_check(_subdir(tmp_path, "lost"), dcgmi=("dcgmi_gpu_is_lost.json", 238))
    unreachable = run_check(_subdir(tmp_path, "unreachable"),
                            dcgmi=("dcgmi_host_engine_connection_lost.json", 235))

    assert lost.returncode == 1
    assert "dcgmi diag failed (exit 238)" in lost.verdict["reasons"]
    assert any("GPU is lost" in r for r in lost.verdict["reasons"])
    assert unreachable.returncode == INCONCLUSIVE


@pytest.mark.parametrize("awk_exit", [2, 137])
def test_a_failed_evaluation_is_inconclusive_never_a_verdict(tmp_path, awk_exit):
    """Given the script's awk dies (a fatal error exits 2, which is also replace's code; an
    OOM kill 137) without printing the verdict line,
    When the health check runs with dcgmi and nvidia-smi healthy,
    Then it prints the inconclusive line and exits 5: neither replace nor reboot."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    write_executable(bindir / "awk", f"cat >/dev/null\nexit {awk_exit}\n")
    run = run_check(tmp_path)

    assert (run.returncode, run.verdict["verdict"]) == (INCONCLUSIVE, "inconclusive")
    assert run.verdict["reasons"] == ["health check could not evaluate results"]
    assert f"awk exit {awk_exit}" in run.stderr


def test_evidence_from_the_tool_that_ran_still_decides(tmp_path):
    """Given one tool missing and the other finding a fault (dcgmi missing with a row-remap
    failure; nvidia-smi missing with a failed dcgmi memory test),
    When the health check runs,
    Then the fault decides (replace, reboot) and the missing tool is only a note."""
    _skip_if_installed("dcgmi")
    _skip_if_installed("nvidia-smi")
    no_dcgmi = run_check(_subdir(tmp_path, "no-dcgmi"), dcgmi=None, smi_remap=("smi_remap_failure.csv", 0))
    no_smi = run_check(_subdir(tmp_path, "no-smi"), smi_gpu=None,
                       dcgmi=("dcgmi_memory_ecc_fail_r2.json", 226))

    assert no_dcgmi.returncode == 2
    assert "dcgmi cannot run (not found: dcgmi)" in no_dcgmi.verdict["notes"]
    assert no_smi.returncode == 1
    assert "nvidia-smi cannot run (not found: nvidia-smi)" in no_smi.verdict["notes"]
