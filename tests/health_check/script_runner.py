"""Runs health_check/dcgm_health_check.sh as the ECS task runs it (``sh -c <script text>``)
with fake ``dcgmi`` / ``nvidia-smi`` executables on PATH that print recorded outputs
(tests/health_check/fixtures) and exit with recorded codes; checks the verdict line's shape."""

from __future__ import annotations

import json
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "health_check" / "dcgm_health_check.sh"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
REAL = "real"  # fixtures/real: captures printed by real machines (see fixtures/real/SOURCES.md)
SYSTEM_PATH = "/usr/bin:/bin"

GPU_QUERY = "--query-gpu=index,uuid,ecc.errors.uncorrected.volatile.total"
REMAP_QUERY = "--query-remapped-rows=gpu_uuid,remapped_rows.pending,remapped_rows.failure"
FULL_QUERY = "-q"  # the driver's recovery action and page retirement (fixtures/README.md)
CSV_FORMAT = "--format=csv,noheader,nounits"
UUID0 = "GPU-8f3c2a1e-5b7d-4c9e-a0f1-2d3e4f5a6b70"
UUID1 = "GPU-1a2b3c4d-5e6f-7081-92a3-b4c5d6e7f809"

REQUIRED_FIELDS = {
    "verdict",
    "exit_code",
    "dcgm_level",
    "dcgmi_exit_code",
    "failed_tests",
    "errors",
    "gpus",
    "smi_exit_code",
    "smi_errors",
    "reasons",
    "hostname",
}
GPU_FIELDS = {"index", "uuid", "ecc_uncorrected_volatile", "remap_pending", "remap_failure",
              "recovery_action", "retired_pages_pending"}
RECOVERY_ACTIONS = {"none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset", "unknown"}
ERROR_FIELDS = {"test", "error_id", "severity", "category", "message"}
VERDICT_FOR_CODE = {0: "healthy", 1: "reboot", 2: "replace", 3: "operator_action", 4: "reset",
                    5: "inconclusive"}

HAVE_DASH = Path("/bin/dash").exists()
SHELLS = [
    "sh",
    pytest.param("/bin/dash", marks=pytest.mark.skipif(not HAVE_DASH, reason="no /bin/dash")),
]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    verdict: dict
    bindir: Path


def write_executable(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _fixture(name: str) -> Path:
    path = FIXTURES / name
    assert path.is_file(), path
    return path


def run_check(
    tmp_path: Path,
    *,
    dcgmi: tuple[str, int] | None = ("dcgmi_pass_r2.json", 0),
    smi_gpu: tuple[str, int] | None = ("smi_gpu_healthy.csv", 0),
    smi_remap: tuple[str, int] = ("smi_remap_healthy.csv", 0),
    smi_q: tuple[str, int] = ("smi_q_r570_none.txt", 0),
    env: dict[str, str] | None = None,
    shell: str = "sh",
    hostname: str | None = None,
    load: tuple[str, int] | None = None,
) -> Run:
    """Run the script via ``<shell> -c <text>`` with fakes on PATH.

    ``dcgmi=None`` / ``smi_gpu=None`` leave that executable out (it cannot run). ``load``:
    what ``dcgmi diag -r targeted_stress ...`` (the validation's GPU load) prints and exits.
    """
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    if dcgmi is not None:
        name, code = dcgmi
        stress = (f'if [ "$3" = targeted_stress ]; then cat "{_fixture(load[0])}"; exit {load[1]}; fi\n'
                  if load is not None else "")
        write_executable(
            bindir / "dcgmi",
            f'printf "%s\\n" "$*" >> "{bindir}/dcgmi.args"\n{stress}cat "{_fixture(name)}"\nexit {code}\n',
        )
    if smi_gpu is not None:
        (gname, gcode), (rname, rcode), (qname, qcode) = smi_gpu, smi_remap, smi_q
        write_executable(
            bindir / "nvidia-smi",
            f'printf "%s\\n" "$*" >> "{bindir}/nvidia-smi.args"\n'
            'case "$1" in\n'
            f'  {GPU_QUERY}) cat "{_fixture(gname)}"; exit {gcode} ;;\n'
            f'  {REMAP_QUERY}) cat "{_fixture(rname)}"; exit {rcode} ;;\n'
            f'  {FULL_QUERY}) cat "{_fixture(qname)}"; exit {qcode} ;;\n'
            "esac\n"
            'echo "fake nvidia-smi: unexpected arguments: $*" >&2\nexit 2\n',
        )
    if hostname is not None:
        write_executable(bindir / "hostname", f"cat <<'EOF'\n{hostname}\nEOF\n")
    full_env = {"PATH": f"{bindir}:{SYSTEM_PATH}", "LANG": "C"}
    full_env.update(env or {})
    proc = subprocess.run(
        [shell, "-c", SCRIPT.read_text()],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, f"stdout must be exactly one line:\n{proc.stdout}\n{proc.stderr}"
    verdict = json.loads(lines[0])
    _assert_shape(verdict, proc.returncode)
    return Run(proc.returncode, proc.stdout, proc.stderr, verdict, bindir)


def _assert_shape(verdict: dict, returncode: int) -> None:
    assert verdict.keys() >= REQUIRED_FIELDS
    assert verdict["exit_code"] == returncode
    assert verdict["verdict"] == VERDICT_FOR_CODE[returncode]
    assert verdict["dcgm_level"] in (1, 2, 3, 4)
    assert verdict["dcgmi_exit_code"] is None or isinstance(verdict["dcgmi_exit_code"], int)
    assert all(isinstance(t, str) for t in verdict["failed_tests"])
    assert all(isinstance(r, str) for r in verdict["reasons"])
    assert all(isinstance(e, str) for e in verdict["smi_errors"])
    assert verdict["smi_exit_code"] is None or isinstance(verdict["smi_exit_code"], int)
    for error in verdict["errors"]:
        assert error.keys() == ERROR_FIELDS
        assert isinstance(error["test"], str) and isinstance(error["message"], str)
        for key in ("error_id", "severity", "category"):
            assert error[key] is None or isinstance(error[key], int)
    assert isinstance(verdict["hostname"], str)
    for gpu in verdict["gpus"]:
        assert gpu.keys() == GPU_FIELDS
        assert isinstance(gpu["uuid"], str)
        assert gpu["ecc_uncorrected_volatile"] is None or isinstance(
            gpu["ecc_uncorrected_volatile"], int
        )
        assert gpu["remap_pending"] in (True, False, None)
        assert gpu["remap_failure"] in (True, False, None)
        assert gpu["recovery_action"] in RECOVERY_ACTIONS
        assert gpu["retired_pages_pending"] in (True, False, None)
    if returncode == 0:
        assert verdict["reasons"] == []
    else:
        assert verdict["reasons"], "a non-healthy verdict must say why"
