"""The health check as a validation after repair (recovery.validations): with
``VALIDATION_LOAD_SECONDS`` it runs a bounded GPU load (``dcgmi diag -r targeted_stress``)
after the diag, judged by the same rules and exit-code contract, reported in the verdict
line's ``load``. Without it the check is exactly as before (no second dcgmi call)."""

from __future__ import annotations

import pytest

from gpu_recovery.domain.states import DCGM_INCONCLUSIVE_EXIT_CODE
from tests.health_check.script_runner import SHELLS, run_check

LOAD_ENV = {"DCGM_LEVEL": "1", "VALIDATION_LOAD_SECONDS": "45"}


@pytest.mark.parametrize("shell", SHELLS)
def test_a_node_that_holds_under_load_passes(tmp_path, shell):
    run = run_check(tmp_path, env=LOAD_ENV, load=("dcgmi_targeted_stress_pass.json", 0), shell=shell)
    assert run.returncode == 0
    assert run.verdict["dcgm_level"] == 1
    assert run.verdict["load"] == {"test": "targeted_stress", "seconds": 45, "dcgmi_exit_code": 0}
    calls = (run.bindir / "dcgmi.args").read_text().splitlines()
    assert calls == ["diag -r 1 -j", "diag -r targeted_stress -p targeted_stress.test_duration=45 -j"]


def test_a_node_that_passes_idle_but_fails_under_load_is_not_healthy(tmp_path):
    """The diag passes (the node looks fine idle); the load finds GPU 1 short of its target."""
    run = run_check(tmp_path, env=LOAD_ENV, load=("dcgmi_targeted_stress_fail.json", 226))
    assert run.returncode == 1 and run.verdict["verdict"] == "reboot"
    assert run.verdict["failed_tests"] == ["targeted_stress"]
    assert run.verdict["load"]["dcgmi_exit_code"] == 226
    [error] = run.verdict["errors"]
    assert (error["test"], error["error_id"], error["severity"]) == ("targeted_stress", 50, 1)
    assert "GPU load (targeted_stress, 45 s) failed (exit 226)" in run.verdict["reasons"]
    assert not any(r.startswith("dcgmi diag") for r in run.verdict["reasons"])  # the diag passed


def test_a_load_isolate_error_replaces_and_a_hung_load_reboots(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    isolate = run_check(tmp_path / "a", env=LOAD_ENV, load=("dcgmi_targeted_stress_fail.json", 205))
    assert isolate.returncode == 2
    reasons = isolate.verdict["reasons"]
    assert "GPU load (targeted_stress, 45 s) reported an isolate error (exit 205)" in reasons
    hung = run_check(tmp_path / "b", env=LOAD_ENV, load=("dcgmi_targeted_stress_pass.json", 124))
    assert hung.returncode == 1
    assert "GPU load (targeted_stress, 45 s) did not finish in time (exit 124)" in hung.verdict["reasons"]


def test_the_worst_of_diag_and_load_wins(tmp_path):
    run = run_check(tmp_path, dcgmi=("dcgmi_isolate_dbe_r2.json", 205), env=LOAD_ENV,
                    load=("dcgmi_targeted_stress_fail.json", 226))
    assert run.returncode == 2  # the diag's isolate error beats the load's reboot
    assert "targeted_stress" in run.verdict["failed_tests"]


def test_without_a_load_the_check_is_unchanged(tmp_path):
    run = run_check(tmp_path, load=("dcgmi_targeted_stress_fail.json", 226))
    assert run.returncode == 0 and run.verdict["load"] is None
    assert (run.bindir / "dcgmi.args").read_text().splitlines() == ["diag -r 2 -j"]
    (tmp_path / "bad").mkdir()
    bad = run_check(tmp_path / "bad", env={"VALIDATION_LOAD_SECONDS": "soon"},
                    load=("dcgmi_targeted_stress_fail.json", 226))
    assert bad.returncode == 0 and bad.verdict["load"] is None
    assert "invalid VALIDATION_LOAD_SECONDS; no GPU load" in bad.verdict["notes"]


def test_a_load_that_could_not_run_is_inconclusive_not_a_failed_repair(tmp_path):
    """The diag passes, then the load loses its host engine (DCGM -21, exit 235, no test ran):
    no verdict (exit 5), so the validation is run again, never counted as a failed repair."""
    run = run_check(tmp_path, env=LOAD_ENV, load=("dcgmi_host_engine_connection_lost.json", 235))
    assert (run.returncode, run.verdict["verdict"]) == (DCGM_INCONCLUSIVE_EXIT_CODE, "inconclusive")
    assert run.verdict["load"]["dcgmi_exit_code"] == 235
    [why] = run.verdict["reasons"]
    assert why.startswith("GPU load (targeted_stress, 45 s) ran no test (exit 235): Error: Unable to")
