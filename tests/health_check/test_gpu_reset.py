"""health_check/gpu_reset.sh run as the ECS task runs it (``sh -c <script text>``) with fake
``nvidia-smi`` / ``dcgmi`` on PATH: it refuses while a process holds a GPU or the driver asks
for a reboot, resets every GPU in one ``nvidia-smi -r``, then runs a short ``dcgmi diag``;
each outcome's exit code and JSON line, and which commands ran."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.health_check.script_runner import FIXTURES, SHELLS, SYSTEM_PATH, write_executable

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "health_check" / "gpu_reset.sh"
APPS_QUERY = "--query-compute-apps=pid,process_name,gpu_uuid"
BUSY = "12345, python, GPU-8f3c2a1e-5b7d-4c9e-a0f1-2d3e4f5a6b70\n"


@dataclass
class Reset:
    returncode: int
    line: dict
    smi_args: list[str]
    dcgmi_args: list[str]


def run_reset(tmp_path: Path, *, apps: tuple[str, int] = ("", 0), smi_q: str = "smi_q_r570_reset.txt",
              reset_rc: int = 0, diag_rc: int = 0, env: dict[str, str] | None = None,
              shell: str = "sh") -> Reset:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "apps.txt").write_text(apps[0])
    write_executable(
        bindir / "nvidia-smi",
        f'printf "%s\\n" "$*" >> "{bindir}/nvidia-smi.args"\n'
        'case "$1" in\n'
        f'  {APPS_QUERY}) cat "{bindir}/apps.txt"; exit {apps[1]} ;;\n'
        f'  -q) cat "{FIXTURES / smi_q}"; exit 0 ;;\n'
        f'  -r) echo "GPU 00000000:10:1C.0 was successfully reset."; exit {reset_rc} ;;\n'
        "esac\n"
        'echo "fake nvidia-smi: unexpected arguments: $*" >&2\nexit 2\n')
    write_executable(bindir / "dcgmi",
                     f'printf "%s\\n" "$*" >> "{bindir}/dcgmi.args"\n'
                     f'cat "{FIXTURES / "dcgmi_pass_r2.json"}"\nexit {diag_rc}\n')
    proc = subprocess.run([shell, "-c", SCRIPT.read_text()], capture_output=True, text=True, timeout=60,
                          check=False, env={"PATH": f"{bindir}:{SYSTEM_PATH}", "LANG": "C", **(env or {})})
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stdout + proc.stderr
    line = json.loads(lines[0])
    assert line["exit_code"] == proc.returncode

    def args(name: str) -> list[str]:
        path = bindir / f"{name}.args"
        return path.read_text().splitlines() if path.exists() else []

    return Reset(proc.returncode, line, args("nvidia-smi"), args("dcgmi"))


@pytest.mark.parametrize("shell", SHELLS)
def test_a_free_node_is_reset_in_one_command_then_diagnosed(tmp_path: Path, shell: str) -> None:
    run = run_reset(tmp_path, shell=shell)
    assert (run.returncode, run.line["result"]) == (0, "passed")
    assert run.smi_args == [f"{APPS_QUERY} --format=csv,noheader", "-q", "-r"]  # every GPU, no -i
    assert run.dcgmi_args == ["diag -r 1 -j"]


def test_a_process_on_a_gpu_stops_it_before_any_reset(tmp_path: Path) -> None:
    run = run_reset(tmp_path, apps=(BUSY, 0))
    assert (run.returncode, run.line["result"]) == (10, "busy")
    assert "12345" in run.line["reason"]
    assert "-r" not in run.smi_args and run.dcgmi_args == []


@pytest.mark.parametrize("fixture", ["smi_q_r570_reboot.txt", "smi_q_r570_drain_p2p.txt"])
def test_a_driver_asking_for_a_node_reboot_is_never_reset(tmp_path: Path, fixture: str) -> None:
    run = run_reset(tmp_path, smi_q=fixture)
    assert (run.returncode, run.line["result"]) == (11, "reboot_required")
    assert "-r" not in run.smi_args and run.dcgmi_args == []


@pytest.mark.parametrize("fixture", ["smi_q_r570_drain_and_reset.txt", "smi_q_r570_none.txt",
                                     "smi_q_r535_no_recovery_action.txt"])
def test_reset_actions_and_drivers_without_the_field_reset(tmp_path: Path, fixture: str) -> None:
    assert run_reset(tmp_path, smi_q=fixture).returncode == 0


def test_a_failed_reset_skips_the_diag(tmp_path: Path) -> None:
    run = run_reset(tmp_path, reset_rc=3)
    assert (run.returncode, run.line["result"]) == (12, "reset_failed")
    assert run.dcgmi_args == []


def test_a_failed_diag_after_the_reset_fails_the_task(tmp_path: Path) -> None:
    run = run_reset(tmp_path, diag_rc=226)
    assert (run.returncode, run.line["result"]) == (13, "diag_failed")


def test_nvidia_smi_that_cannot_answer_resets_nothing(tmp_path: Path) -> None:
    run = run_reset(tmp_path, apps=("NVIDIA-SMI has failed", 9))
    assert (run.returncode, run.line["result"]) == (14, "smi_failed")
    assert "-r" not in run.smi_args


@pytest.mark.parametrize(("level", "used"), [("2", "2"), ("4", "1"), ("x", "1")])
def test_the_diag_level_is_one_or_two(tmp_path: Path, level: str, used: str) -> None:
    run = run_reset(tmp_path, env={"RESET_DIAG_LEVEL": level})
    assert run.dcgmi_args == [f"diag -r {used} -j"] and run.line["diag_level"] == int(used)
