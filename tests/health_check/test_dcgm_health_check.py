"""Offline tests for health_check/dcgm_health_check.sh.

The script is run exactly as the ECS task runs it, ``sh -c <script text>``, with
fake ``dcgmi`` / ``nvidia-smi`` executables on PATH that print recorded outputs
(tests/health_check/fixtures) and exit with recorded codes.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from gpu_recovery.domain.states import DCGM_INCONCLUSIVE_EXIT_CODE
from tests.health_check.script_runner import (
    CSV_FORMAT,
    FIXTURES,
    FULL_QUERY,
    GPU_QUERY,
    HAVE_DASH,
    REAL,
    REMAP_QUERY,
    SCRIPT,
    SHELLS,
    SYSTEM_PATH,
    UUID0,
    UUID1,
    run_check,
    write_executable,
)

# --- healthy ---------------------------------------------------------------


@pytest.mark.parametrize("shell", SHELLS)
def test_all_healthy_exits_0(tmp_path, shell):
    """Given dcgmi passes and nvidia-smi shows no ECC / remap signal,
    When the health check runs,
    Then it exits 0 with verdict healthy and lists every GPU."""
    run = run_check(tmp_path, shell=shell)

    assert run.returncode == 0
    v = run.verdict
    assert v["verdict"] == "healthy"
    assert v["dcgmi_exit_code"] == 0
    assert v["dcgm_level"] == 2
    assert v["failed_tests"] == []
    assert v["gpus"] == [
        {
            "index": 0,
            "uuid": UUID0,
            "ecc_uncorrected_volatile": 0,
            "remap_pending": False,
            "remap_failure": False,
            "recovery_action": "none",
            "retired_pages_pending": None,
        },
        {
            "index": 1,
            "uuid": UUID1,
            "ecc_uncorrected_volatile": 0,
            "remap_pending": False,
            "remap_failure": False,
            "recovery_action": "none",
            "retired_pages_pending": None,
        },
    ]


def test_runs_the_documented_commands(tmp_path):
    """Given the default configuration,
    When the health check runs,
    Then it calls `dcgmi diag -r 2 -j`, both nvidia-smi CSV queries and `nvidia-smi -q`."""
    run = run_check(tmp_path)

    assert (run.bindir / "dcgmi.args").read_text().splitlines() == ["diag -r 2 -j"]
    assert (run.bindir / "nvidia-smi.args").read_text().splitlines() == [
        f"{GPU_QUERY} {CSV_FORMAT}",
        f"{REMAP_QUERY} {CSV_FORMAT}",
        FULL_QUERY,
    ]


def test_yes_no_remap_values_are_understood(tmp_path):
    """Given nvidia-smi prints remap flags as "No"/"No",
    When the health check runs,
    Then they read as false and the node is healthy."""
    run = run_check(tmp_path, smi_remap=("smi_remap_healthy_yesno.csv", 0))

    assert run.returncode == 0
    assert [g["remap_pending"] for g in run.verdict["gpus"]] == [False, False]
    assert [g["remap_failure"] for g in run.verdict["gpus"]] == [False, False]


def test_not_available_values_become_null_and_stay_healthy(tmp_path):
    """Given nvidia-smi reports "[N/A]" for ECC and remap fields (e.g. ECC off),
    When the health check runs,
    Then the values are null, not errors, and dcgmi decides: healthy."""
    run = run_check(tmp_path, smi_gpu=("smi_gpu_na.csv", 0), smi_remap=("smi_remap_na.csv", 0))

    assert run.returncode == 0
    for gpu in run.verdict["gpus"]:
        assert gpu["ecc_uncorrected_volatile"] is None
        assert gpu["remap_pending"] is None
        assert gpu["remap_failure"] is None


# --- reboot (1) --------------------------------------------------------------


@pytest.mark.parametrize("shell", SHELLS)
def test_dcgmi_nvvs_error_226_means_reboot(tmp_path, shell):
    """Given dcgmi fails the memory test (volatile SBEs) and exits 226 (DCGM -30),
    When the health check runs,
    Then it exits 1 (reboot) and names the failed test."""
    run = run_check(tmp_path, dcgmi=("dcgmi_memory_ecc_fail_r2.json", 226), shell=shell)

    assert run.returncode == 1
    assert run.verdict["dcgmi_exit_code"] == 226
    assert run.verdict["failed_tests"] == ["memory"]
    assert "dcgmi diag failed (exit 226)" in run.verdict["reasons"]


def test_pcie_nvlink_failure_in_dcgm3_layout_means_reboot(tmp_path):
    """Given a DCGM 3.x style JSON ("DCGM GPU Diagnostic", gpu_id) where PCIe fails
    on NVLink CRC errors and dcgmi exits 226,
    When the health check runs,
    Then it exits 1 and lists the PCIe test."""
    run = run_check(tmp_path, dcgmi=("dcgmi_pcie_nvlink_fail_r2_v3.json", 226))

    assert run.returncode == 1
    assert run.verdict["failed_tests"] == ["PCIe"]


def test_ecc_uncorrected_with_dcgmi_pass_means_reboot(tmp_path):
    """Given dcgmi passes but GPU 1 has 3 uncorrected volatile ECC errors,
    When the health check runs,
    Then it exits 1 and explains which GPU."""
    run = run_check(tmp_path, smi_gpu=("smi_gpu_ecc_uncorrected.csv", 0))

    assert run.returncode == 1
    assert run.verdict["dcgmi_exit_code"] == 0
    assert run.verdict["gpus"][1]["ecc_uncorrected_volatile"] == 3
    assert any("ECC" in r and "GPU 1" in r for r in run.verdict["reasons"])


def test_pending_row_remap_alone_means_reset(tmp_path):
    """Given dcgmi passes and nothing fails but GPU 1 has a pending row remap,
    When the health check runs,
    Then it exits 4 (reset): the remap takes effect at the next GPU reset (nvidia-smi man page,
    Remapped Rows "Pending")."""
    run = run_check(tmp_path, smi_remap=("smi_remap_pending.csv", 0))

    assert run.returncode == 4
    assert run.verdict["gpus"][1]["remap_pending"] is True
    assert any("pending" in r and UUID1 in r for r in run.verdict["reasons"])


def test_nvidia_smi_failing_means_reboot(tmp_path):
    """Given nvidia-smi cannot talk to the driver (exit 9, GPU off the bus),
    When the health check runs,
    Then it exits 1."""
    run = run_check(
        tmp_path,
        smi_gpu=("smi_no_driver.txt", 9),
        smi_remap=("smi_no_driver.txt", 9),
    )

    assert run.returncode == 1
    assert "nvidia-smi --query-gpu failed (exit 9)" in run.verdict["reasons"]


# --- replace (2) --------------------------------------------------------------


@pytest.mark.parametrize("shell", SHELLS)
def test_dcgmi_isolate_205_means_replace(tmp_path, shell):
    """Given dcgmi finds a volatile double-bit ECC error and exits 205 (DCGM -51),
    When the health check runs,
    Then it exits 2 (replace)."""
    run = run_check(tmp_path, dcgmi=("dcgmi_isolate_dbe_r2.json", 205), shell=shell)

    assert run.returncode == 2
    assert run.verdict["dcgmi_exit_code"] == 205
    assert run.verdict["failed_tests"] == ["memory"]


def test_isolate_severity_in_json_means_replace_even_with_other_exit(tmp_path):
    """Given the dcgmi JSON carries an isolate-severity error but dcgmi exits 226,
    When the health check runs,
    Then the JSON wins: exit 2."""
    run = run_check(tmp_path, dcgmi=("dcgmi_isolate_dbe_r2.json", 226))

    assert run.returncode == 2
    assert "dcgmi diag reported an isolate-severity error" in run.verdict["reasons"]


def test_remap_failure_means_replace(tmp_path):
    """Given dcgmi passes but GPU 0 reports a row-remapping failure ("Yes"),
    When the health check runs,
    Then it exits 2."""
    run = run_check(tmp_path, smi_remap=("smi_remap_failure.csv", 0))

    assert run.returncode == 2
    assert run.verdict["gpus"][0]["remap_failure"] is True
    assert any("failure" in r and UUID0 in r for r in run.verdict["reasons"])


def test_replace_outranks_reboot_signals(tmp_path):
    """Given both reboot signals (ECC, dcgmi 226) and a remap failure,
    When the health check runs,
    Then the worst verdict wins (2) and all reasons are kept."""
    run = run_check(
        tmp_path,
        dcgmi=("dcgmi_memory_ecc_fail_r2.json", 226),
        smi_gpu=("smi_gpu_ecc_uncorrected.csv", 0),
        smi_remap=("smi_remap_failure.csv", 0),
    )

    assert run.returncode == 2
    assert len(run.verdict["reasons"]) == 3


# --- configuration --------------------------------------------------------------


@pytest.mark.parametrize("level", ["1", "3", "4"])
def test_valid_level_is_passed_to_dcgmi(tmp_path, level):
    """Given DCGM_LEVEL is 1, 3 or 4,
    When the health check runs,
    Then dcgmi runs at that level and the verdict records it."""
    run = run_check(tmp_path, env={"DCGM_LEVEL": level})

    assert (run.bindir / "dcgmi.args").read_text().strip() == f"diag -r {level} -j"
    assert run.verdict["dcgm_level"] == int(level)


@pytest.mark.parametrize("level", ["0", "5", "two", "2; rm -rf /", '"\\'])
def test_invalid_level_falls_back_to_2_with_a_note(tmp_path, level):
    """Given an invalid DCGM_LEVEL (including quotes and backslashes),
    When the health check runs,
    Then dcgmi runs at level 2, the node is still judged, and a note says so."""
    run = run_check(tmp_path, env={"DCGM_LEVEL": level})

    assert run.returncode == 0
    assert (run.bindir / "dcgmi.args").read_text().strip() == "diag -r 2 -j"
    assert run.verdict["dcgm_level"] == 2
    assert any(level in n and "DCGM_LEVEL" in n for n in run.verdict["notes"])


def test_fakes_can_be_selected_by_environment(tmp_path):
    """Given DCGMI and NVIDIA_SMI point at executables outside PATH,
    When the health check runs,
    Then those are used."""
    other = tmp_path / "other"
    other.mkdir()
    run_check(other)  # creates other/bin/{dcgmi,nvidia-smi}
    fakes = other / "bin"
    run = run_check(
        tmp_path,
        dcgmi=None,
        smi_gpu=None,
        env={"DCGMI": str(fakes / "dcgmi"), "NVIDIA_SMI": str(fakes / "nvidia-smi")},
    )

    assert run.returncode == 0
    assert len(run.verdict["gpus"]) == 2


# --- output hygiene --------------------------------------------------------------


def test_strings_are_json_escaped(tmp_path):
    """Given a hostname and a failed test name with quotes, backslashes, tabs and
    control characters,
    When the health check runs,
    Then the single output line is still valid JSON carrying them intact."""
    (tmp_path / "weird.json").write_text(
        "WARNING: chatter before the JSON\n"
        '{"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tests":['
        '{"name":"mem \\"x\\" \\\\ \\t\\u0001","results":[{"status":"Fail"}]}]}]}}\n'
    )
    weird_host = 'ip-10-0-0-1"\\\t'
    run = run_check(
        tmp_path,
        dcgmi=(str(tmp_path / "weird.json"), 226),
        hostname=weird_host,
    )

    assert run.verdict["hostname"] == weird_host
    assert run.verdict["failed_tests"] == ['mem "x" \\ \t\x01']


def test_diagnostic_chatter_goes_to_stderr(tmp_path):
    """Given a normal run,
    When the health check runs,
    Then stdout holds only the verdict and the raw dcgmi output is on stderr."""
    run = run_check(tmp_path, dcgmi=("dcgmi_memory_ecc_fail_r2.json", 226))

    assert run.stdout.count("\n") == 1
    assert "dcgmi| " in run.stderr
    assert "single-bit ECC" in run.stderr


def test_does_not_depend_on_its_own_path(tmp_path):
    """Given the script text is the whole command (no file, $0 is "sh"),
    When it runs from an unrelated working directory,
    Then it works the same."""
    env = {"PATH": f"{SYSTEM_PATH}"}
    proc = subprocess.run(
        ["sh", "-c", SCRIPT.read_text()],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    verdict = json.loads(proc.stdout)
    # No dcgmi / nvidia-smi here: the check could not run.
    assert proc.returncode == verdict["exit_code"] == DCGM_INCONCLUSIVE_EXIT_CODE


def test_script_is_small_posix_and_has_no_bashisms():
    """Given the script file,
    Then it is under 16 KB (it is embedded in the container command),
    parses under dash -n and documents the exit-code contract at the top."""
    data = SCRIPT.read_bytes()
    assert len(data) < 16 * 1024
    head = data.decode()[:1500]
    for marker in ("2 replace", "1 reboot", "4 reset", "3 operator_action", "5 inconclusive", "0 healthy"):
        assert marker in head
    if HAVE_DASH:
        subprocess.run(["/bin/dash", "-n", str(SCRIPT)], check=True)
    text = data.decode()
    for bashism in ("[[", "$'", "function ", "local ", "pipefail", "<<<"):
        assert bashism not in text.split("HC_AWK='")[0], bashism


def test_remap_query_failure_is_only_a_note(tmp_path):
    """Given an older GPU where `--query-remapped-rows` fails (no row remapping),
    When the health check runs and everything else is fine,
    Then the node stays healthy, remap fields are null and a note explains why."""
    run = run_check(tmp_path, smi_remap=("smi_no_driver.txt", 2))

    assert run.returncode == 0
    assert [g["remap_failure"] for g in run.verdict["gpus"]] == [None, None]
    assert any("query-remapped-rows failed (exit 2)" in n for n in run.verdict["notes"])


def test_dcgmi_timeout_means_reboot(tmp_path):
    """Given DCGM_TIMEOUT=1 and a dcgmi that hangs,
    When the health check runs,
    Then dcgmi is stopped (exit 124) and the verdict is reboot."""
    if not shutil.which("timeout", path=SYSTEM_PATH):
        pytest.skip("timeout(1) not available")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    write_executable(bindir / "dcgmi", "exec sleep 10\n")
    run = run_check(tmp_path, dcgmi=None, env={"DCGM_TIMEOUT": "1"})

    assert run.returncode == 1
    assert run.verdict["dcgmi_exit_code"] == 124
    assert "dcgmi diag timed out" in run.verdict["reasons"]


# --- DCGM errors in the verdict ------------------------------------------------------


def test_errors_carry_id_severity_category_and_message_once_per_test(tmp_path):
    """Given dcgmi reports a volatile DBE (error 4, isolate, hardware-memory) both on the
    GPU's result and in the test summary,
    When the health check runs,
    Then the verdict lists that error once, with its test, severity, category and text."""
    run = run_check(tmp_path, dcgmi=("dcgmi_isolate_dbe_r2.json", 205))

    assert run.verdict["errors"] == [{
        "test": "memory", "error_id": 4, "severity": 2, "category": 10,
        "message": "Detected 2 volatile double-bit ECC error(s) in GPU 0.",
    }]


def test_dcgm3_layout_errors_are_listed(tmp_path):
    """Given the DCGM 3.x layout with two triage-severity errors in the PCIe test,
    When the health check runs,
    Then both are listed (and the verdict stays reboot)."""
    run = run_check(tmp_path, dcgmi=("dcgmi_pcie_nvlink_fail_r2_v3.json", 226))

    assert run.returncode == 1
    assert [(e["test"], e["error_id"], e["severity"], e["category"]) for e in run.verdict["errors"]] == [
        ("PCIe", 13, 4, 11), ("PCIe", 45, 4, 13)]


# --- operator action (3): configuration problems ---------------------------------------


@pytest.mark.parametrize("shell", SHELLS)
def test_real_persistence_mode_failure_means_operator_action_not_reboot(tmp_path, shell):
    """Given the real DCGM 4.5.2 level-2 run on a GB10 whose only failure is DCGM error 29
    (persistence mode disabled, severity 5 = configuration) and dcgmi exit 226,
    When the health check runs,
    Then it exits 3 (operator_action), not 1: a reboot leaves persistence mode off."""
    run = run_check(tmp_path, dcgmi=(f"{REAL}/dcgmi_r2_dcgm4.5.2_gb10_plugins_allowed.json", 226),
                    shell=shell)

    assert run.returncode == 3
    v = run.verdict
    assert v["verdict"] == "operator_action"
    assert v["dcgmi_exit_code"] == 226
    assert v["failed_tests"] == ["software"]
    assert [(e["test"], e["error_id"], e["severity"], e["category"]) for e in v["errors"]] == [
        ("software", 29, 5, 8)]
    assert "nvidia-smi -i <gpuId> -pm 1" in v["errors"][0]["message"]
    assert len(v["reasons"]) == 1
    assert "configuration" in v["reasons"][0] and "29" in v["reasons"][0]


def test_configuration_problem_does_not_hide_a_hardware_signal(tmp_path):
    """Given the persistence-mode failure and a pending row remap on GPU 1,
    When the health check runs,
    Then the remap wins (reset, exit 4) and the configuration problem is kept as a note."""
    run = run_check(tmp_path, dcgmi=(f"{REAL}/dcgmi_r2_dcgm4.5.2_gb10_plugins_allowed.json", 226),
                    smi_remap=("smi_remap_pending.csv", 0))

    assert run.returncode == 4
    assert any("pending" in r for r in run.verdict["reasons"])
    assert not any("configuration" in r for r in run.verdict["reasons"])
    assert any("configuration" in n and "29" in n for n in run.verdict["notes"])


def test_configuration_problem_with_remap_failure_means_replace(tmp_path):
    """Given the persistence-mode failure and a row-remapping failure,
    When the health check runs,
    Then it exits 2 (replace)."""
    run = run_check(tmp_path, dcgmi=(f"{REAL}/dcgmi_r2_dcgm4.5.2_gb10_plugins_allowed.json", 226),
                    smi_remap=("smi_remap_failure.csv", 0))

    assert run.returncode == 2


def _diag(tests: list[tuple[str, str, list[tuple[int, int, int]]]]) -> str:
    """A DCGM 4.x diag JSON: (test name, status, [(error_id, severity, category)])."""
    rendered = []
    for name, status, errors in tests:
        warnings = ",".join(
            f'{{"error_category":{cat},"error_id":{eid},"error_severity":{sev},"warning":"e{eid}"}}'
            for eid, sev, cat in errors)
        rendered.append(f'{{"name":"{name}","results":[{{"entity_group":"GPU","entity_id":0,'
                        f'"status":"{status}","warnings":[{warnings}]}}],'
                        f'"test_summary":{{"status":"{status}"}}}}')
    return ('{"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tests":['
            + ",".join(rendered) + "]}]}}\n")


@pytest.mark.parametrize(
    ("tests", "dcgmi_exit", "expected"),
    [
        # config error plus a triage-severity memory error: the memory error needs a reboot
        ([("software", "Fail", [(29, 5, 8)]), ("memory", "Fail", [(5, 4, 10)])], 226, 1),
        # config error plus a failed test that says nothing about why: not explained, reboot
        ([("software", "Fail", [(29, 5, 8)]), ("pcie", "Fail", [])], 226, 1),
        # two different configuration errors (ECC disabled 55, persistence mode 29)
        ([("software", "Fail", [(29, 5, 8)]), ("memory", "Fail", [(55, 5, 10)])], 226, 3),
        # a configuration warning on a passing run is not a failure
        ([("software", "Pass", [(29, 5, 8)])], 0, 0),
        # configuration-only failure but dcgmi exited 0 (3.x counts only Fail results)
        ([("software", "Fail", [(29, 5, 8)])], 0, 3),
        # an error without a severity is not known to be configuration
        ([("software", "Fail", [(29, -1, 8)])], 226, 1),
    ],
)
def test_only_configuration_errors_give_operator_action(tmp_path, tests, dcgmi_exit, expected):
    """Given dcgmi results mixing configuration-severity and other errors,
    When the health check runs,
    Then operator_action (3) only when every error is configuration-severity and every failed
    test is explained by one; otherwise the usual verdict."""
    text = _diag(tests).replace('"error_severity":-1,', "")
    (tmp_path / "diag.json").write_text(text)
    run = run_check(tmp_path, dcgmi=(str(tmp_path / "diag.json"), dcgmi_exit))

    assert run.returncode == expected, run.verdict


def test_timeout_is_never_a_configuration_problem(tmp_path):
    """Given dcgmi printed a configuration error and then timed out (exit 124),
    When the health check runs,
    Then the verdict is reboot."""
    (tmp_path / "diag.json").write_text(_diag([("software", "Fail", [(29, 5, 8)])]))
    run = run_check(tmp_path, dcgmi=(str(tmp_path / "diag.json"), 124))

    assert run.returncode == 1
    assert "dcgmi diag timed out" in run.verdict["reasons"]


# --- real nvidia-smi captures ------------------------------------------------------------


@pytest.mark.parametrize("smi_exit", [255, 15])
def test_real_fallen_off_the_bus_output_means_reboot_with_the_message(tmp_path, smi_exit):
    """Given nvidia-smi prints the real "Unable to determine the device handle ... Unknown
    Error" line (NVIDIA/nvidia-docker#1553) and exits 255 (or 15, "fallen off the bus"),
    When the health check runs,
    Then the verdict is reboot, and the message and exit code are in the verdict for the
    fault catalog (which escalates a repeat to replace)."""
    capture = (f"{REAL}/smi_fell_off_bus.txt", smi_exit)
    run = run_check(tmp_path, smi_gpu=capture, smi_remap=capture, smi_q=capture)

    assert run.returncode == 1
    assert run.verdict["smi_exit_code"] == smi_exit
    assert run.verdict["smi_errors"] == [
        "Unable to determine the device handle for GPU 0000:09:00.0: Unknown Error"]
    assert f"nvidia-smi --query-gpu failed (exit {smi_exit})" in run.verdict["reasons"]


def test_real_inforom_warning_is_reported(tmp_path):
    """Given nvidia-smi exits 14 (infoROM corrupted) and prints NVIDIA's documented example
    output ending in "WARNING: infoROM is corrupted at gpu 0000:0B:00.0",
    When the health check runs,
    Then the verdict is reboot (the script's contract: any failing query) and the warning
    is kept in smi_errors, so the fault catalog can choose replace."""
    capture = (f"{REAL}/smi_inforom_corrupted_p100.txt", 14)
    run = run_check(tmp_path, smi_gpu=capture, smi_remap=("smi_remap_na.csv", 0))

    assert run.returncode == 1
    assert run.verdict["smi_exit_code"] == 14
    assert len(run.verdict["smi_errors"]) == 5
    assert run.verdict["smi_errors"][-1] == "WARNING: infoROM is corrupted at gpu 0000:0B:00.0"


def test_gpu_rows_are_kept_beside_an_error_line(tmp_path):
    """Given nvidia-smi lists GPU 0 but cannot reach GPU 1 (error line, exit 255),
    When the health check runs,
    Then GPU 0 is still listed, the error line is kept and the verdict is reboot."""
    (tmp_path / "partial.txt").write_text(
        "0, GPU-8f3c2a1e-5b7d-4c9e-a0f1-2d3e4f5a6b70, 0\n"
        "Unable to determine the device handle for GPU 0000:10:1C.0: Unknown Error\n")
    run = run_check(tmp_path, smi_gpu=(str(tmp_path / "partial.txt"), 255))

    assert run.returncode == 1
    assert [g["index"] for g in run.verdict["gpus"]] == [0]
    assert run.verdict["smi_errors"] == [
        "Unable to determine the device handle for GPU 0000:10:1C.0: Unknown Error"]


def test_real_captures_are_unmodified_copies_with_their_sources():
    """The real captures are byte-for-byte the shared ones and keep their attribution."""
    real = FIXTURES / REAL
    sources = (real / "SOURCES.md").read_text()
    for name in ("dcgmi_r2_dcgm4.5.2_gb10_plugins_allowed.json", "smi_fell_off_bus.txt",
                 "smi_inforom_corrupted_p100.txt"):
        assert (real / name).is_file()
        assert f"`{name}`" in sources
    for origin in ("baldwinSPC/glimmer-burnin", "NVIDIA/nvidia-docker issue #1553",
                   "NVIDIA/cloud-native-docs"):
        assert origin in sources


# --- reset (4): the driver's recovery action, pending remaps, page retirement ----------------
# The nvidia-smi -q fixtures follow the output format of drivers R565+ ("GPU Recovery Action",
# values from the nvidia-smi man page) and older drivers without the field: fixtures/README.md.


@pytest.mark.parametrize("shell", SHELLS)
def test_driver_asking_for_a_gpu_reset_means_reset(tmp_path, shell):
    """Given everything passes but nvidia-smi -q reports "GPU Recovery Action : Reset" on GPU 1,
    When the health check runs,
    Then it exits 4 (reset), reports the action per GPU and says why."""
    run = run_check(tmp_path, smi_q=("smi_q_r570_reset.txt", 0), shell=shell)

    assert run.returncode == 4
    assert [g["recovery_action"] for g in run.verdict["gpus"]] == ["none", "gpu_reset"]
    assert run.verdict["reasons"] == [f"driver recovery action on GPU 1 ({UUID1}): Reset"]


def test_contained_uncorrectable_error_with_pending_remap_means_reset(tmp_path):
    """Given the whole picture of a contained HBM uncorrectable error on GPU 1 (R570): the driver
    says "Drain and Reset", a row remap is pending, 3 uncorrected volatile ECC errors, and dcgmi
    fails (226) only on DCGM error 85 (pending row remap, severity 6 "Drain and reset GPU"),
    When the health check runs,
    Then every failure is one a reset clears: exit 4, and every reason is listed."""
    run = run_check(tmp_path, dcgmi=("dcgmi_pending_row_remap_r2.json", 226),
                    smi_gpu=("smi_gpu_ecc_uncorrected.csv", 0),
                    smi_remap=("smi_remap_pending.csv", 0),
                    smi_q=("smi_q_r570_drain_and_reset.txt", 0))

    assert run.returncode == 4
    v = run.verdict
    assert v["gpus"][1]["recovery_action"] == "drain_and_reset"
    assert v["gpus"][1]["remap_pending"] is True
    assert [(e["error_id"], e["severity"]) for e in v["errors"]] == [(85, 6)]
    assert len(v["reasons"]) == 4
    assert any("reset-severity" in r and "85" in r for r in v["reasons"])
    assert any("ECC" in r and "cleared by that reset" in r for r in v["reasons"])


@pytest.mark.parametrize("q_fixture", ["smi_q_r570_reboot.txt", "smi_q_r570_drain_p2p.txt"])
def test_driver_asking_for_more_than_a_reset_is_never_reset(tmp_path, q_fixture):
    """Given a pending row remap on GPU 1 but the driver's recovery action is Reboot (or Drain
    P2P, which a health-check task cannot carry out),
    When the health check runs,
    Then it exits 1 (reboot): never reset when the driver says a reset is not enough."""
    run = run_check(tmp_path, smi_remap=("smi_remap_pending.csv", 0), smi_q=(q_fixture, 0))

    assert run.returncode == 1
    assert any("a GPU reset is not enough" in r for r in run.verdict["reasons"])


def test_driver_reboot_alone_means_reboot(tmp_path):
    """Given dcgmi passes and nothing else fails but the driver says Reboot on GPU 1,
    When the health check runs,
    Then it exits 1: the driver's "Application cannot restart without node reboot" wins over
    a passing diag."""
    run = run_check(tmp_path, smi_q=("smi_q_r570_reboot.txt", 0))

    assert run.returncode == 1
    assert run.verdict["gpus"][1]["recovery_action"] == "node_reboot"


def test_reset_request_beside_an_unexplained_failure_means_reboot(tmp_path):
    """Given the driver asks for a reset on GPU 1 but dcgmi fails on a triage-severity memory
    error (not one a reset is known to clear),
    When the health check runs,
    Then it exits 1 (reboot), keeping both reasons."""
    run = run_check(tmp_path, dcgmi=("dcgmi_memory_ecc_fail_r2.json", 226),
                    smi_q=("smi_q_r570_reset.txt", 0))

    assert run.returncode == 1
    assert "dcgmi diag failed (exit 226)" in run.verdict["reasons"]
    assert any("recovery action" in r for r in run.verdict["reasons"])


def test_remap_failure_beside_a_reset_request_means_replace(tmp_path):
    """Given the driver asks for a reset but GPU 0 has a row-remapping failure,
    When the health check runs,
    Then it exits 2 (replace): the worst verdict wins."""
    run = run_check(tmp_path, smi_remap=("smi_remap_failure.csv", 0),
                    smi_q=("smi_q_r570_reset.txt", 0))

    assert run.returncode == 2


def test_reset_severity_dcgm_error_alone_stays_reboot(tmp_path):
    """Given dcgmi fails only on a reset-severity error but nvidia-smi shows neither a pending
    remap nor a reset request (the script cannot see what DCGM saw),
    When the health check runs,
    Then it exits 1, today's verdict: a reset needs evidence of its own."""
    run = run_check(tmp_path, dcgmi=("dcgmi_pending_row_remap_r2.json", 226))

    assert run.returncode == 1
    assert any("reset-severity" in r for r in run.verdict["reasons"])


def test_ecc_on_a_gpu_without_reset_evidence_means_reboot(tmp_path):
    """Given GPU 1 has a pending row remap but GPU 0 has uncorrected volatile ECC errors,
    When the health check runs,
    Then it exits 1: GPU 0's errors are not explained by GPU 1's reset."""
    (tmp_path / "ecc0.csv").write_text(f"0, {UUID0}, 2\n1, {UUID1}, 0\n")
    run = run_check(tmp_path, smi_gpu=(str(tmp_path / "ecc0.csv"), 0),
                    smi_remap=("smi_remap_pending.csv", 0))

    assert run.returncode == 1
    assert "uncorrected volatile ECC errors on GPU 0: 2" in run.verdict["reasons"]


def test_configuration_and_reset_severity_errors_together_mean_reset(tmp_path):
    """Given dcgmi fails on persistence mode (29, configuration) and on a pending row remap
    (85, reset severity) and nvidia-smi shows GPU 1's remap pending,
    When the health check runs,
    Then it exits 4 and keeps the configuration problem as a note."""
    (tmp_path / "diag.json").write_text(_diag([("software", "Fail", [(29, 5, 8), (85, 6, 10)])]))
    run = run_check(tmp_path, dcgmi=(str(tmp_path / "diag.json"), 226),
                    smi_remap=("smi_remap_pending.csv", 0))

    assert run.returncode == 4
    assert any("configuration" in n and "29" in n for n in run.verdict["notes"])


@pytest.mark.parametrize(("remap", "gpu", "expected"), [
    ("smi_remap_healthy.csv", "smi_gpu_healthy.csv", 0),
    ("smi_remap_pending.csv", "smi_gpu_healthy.csv", 4),
    ("smi_remap_healthy.csv", "smi_gpu_ecc_uncorrected.csv", 1),
])
def test_old_driver_without_recovery_action_keeps_todays_verdicts(tmp_path, remap, gpu, expected):
    """Given an R535 driver whose nvidia-smi -q has no "GPU Recovery Action" (added in R565),
    When the health check runs,
    Then the action is "unknown", never guessed: healthy stays healthy, uncorrected ECC alone
    stays reboot, and only a pending remap (its own evidence) gives reset."""
    run = run_check(tmp_path, smi_q=("smi_q_r535_no_recovery_action.txt", 0),
                    smi_remap=(remap, 0), smi_gpu=(gpu, 0))

    assert run.returncode == expected
    assert [g["recovery_action"] for g in run.verdict["gpus"]] == ["unknown", "unknown"]
    assert not run.verdict["notes"]


def test_pages_pending_retirement_mean_reboot(tmp_path):
    """Given a pre-Ampere GPU (no row remapping: "Remapped Rows : N/A", the remap query fails)
    whose "Pending Page Blacklist" is Yes,
    When the health check runs,
    Then it exits 1: the man page says such pages are retired at the next reboot."""
    run = run_check(tmp_path, smi_q=("smi_q_v100_retirement_pending.txt", 0),
                    smi_remap=("smi_no_driver.txt", 2))

    assert run.returncode == 1
    assert [g["retired_pages_pending"] for g in run.verdict["gpus"]] == [False, True]
    assert any("pending retirement" in r and UUID1 in r for r in run.verdict["reasons"])


def test_full_query_failure_is_only_a_note(tmp_path):
    """Given `nvidia-smi -q` fails while the CSV queries and dcgmi pass,
    When the health check runs,
    Then the node stays healthy, the new fields are unknown and a note says why."""
    run = run_check(tmp_path, smi_q=("smi_no_driver.txt", 9))

    assert run.returncode == 0
    assert [g["recovery_action"] for g in run.verdict["gpus"]] == ["unknown", "unknown"]
    assert [g["retired_pages_pending"] for g in run.verdict["gpus"]] == [None, None]
    assert any("nvidia-smi -q failed (exit 9)" in n for n in run.verdict["notes"])


def test_unrecognized_recovery_action_is_unknown_with_a_note(tmp_path):
    """Given a recovery action value the man page does not list (a future driver's),
    When the health check runs,
    Then it is reported as unknown, a note keeps the text, and the verdict is unchanged."""
    text = (FIXTURES / "smi_q_r570_reset.txt").read_text().replace(
        "GPU Recovery Action                   : Reset", "GPU Recovery Action                   : Bus Reset")
    (tmp_path / "q.txt").write_text(text)
    run = run_check(tmp_path, smi_q=(str(tmp_path / "q.txt"), 0))

    assert run.returncode == 0
    assert run.verdict["gpus"][1]["recovery_action"] == "unknown"
    assert any("not recognized: Bus Reset" in n for n in run.verdict["notes"])


def test_recovery_action_is_read_from_its_own_gpu_section(tmp_path):
    """Given a -q output whose GPU 0 says Reset and GPU 1 None, with other "Pending" lines
    (MIG Mode, ECC Mode, Remapped Rows) around,
    When the health check runs,
    Then each GPU gets its own action and no unrelated "Pending" is read as retirement."""
    text = (FIXTURES / "smi_q_r570_reset.txt").read_text()
    first, second = text.split("GPU 00000000:2A:00.0\n")
    action = "GPU Recovery Action                   : "
    swapped = (first.replace(action + "None", action + "Reset") + "GPU 00000000:2A:00.0\n"
               + second.replace(action + "Reset", action + "None"))
    (tmp_path / "q.txt").write_text(swapped)
    run = run_check(tmp_path, smi_q=(str(tmp_path / "q.txt"), 0))

    assert [g["recovery_action"] for g in run.verdict["gpus"]] == ["gpu_reset", "none"]
    assert [g["retired_pages_pending"] for g in run.verdict["gpus"]] == [None, None]
    assert run.returncode == 4


def test_generated_fixtures_document_their_sources():
    """The -q fixtures are built from documented output formats: their README says which."""
    readme = (FIXTURES / "README.md").read_text()
    for path in [*sorted(FIXTURES.glob("smi_q_*.txt")), FIXTURES / "dcgmi_pending_row_remap_r2.json"]:
        assert f"`{path.name}`" in readme, path.name
    for source in ("docs.nvidia.com/deploy/nvidia-smi", "nvml-api/change-log",
                   "a100-gpu-mem-error-mgmt", "dcgm_errors.c"):
        assert source in readme
