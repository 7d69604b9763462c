"""Tests of the GPU node agent (agent/gpu_node_agent.py), offline, against fakes:
a fake nvidia-smi, a fake kernel-log command and a local HTTP server on 127.0.0.1
acting as the ECS introspection API and the report API."""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .fakes.fake_server import (
    KERNEL_LOG_DIR,
    SMI_DIR,
    FakeServer,
    Reply,
    env_without_proxy,
    fake_kernel_log,
    fake_nvidia_smi,
)

AGENT_PATH = Path(__file__).resolve().parents[2] / "agent" / "gpu_node_agent.py"
_spec = importlib.util.spec_from_file_location("gpu_node_agent", AGENT_PATH)
assert _spec is not None and _spec.loader is not None
agent_mod = importlib.util.module_from_spec(_spec)
sys.modules["gpu_node_agent"] = agent_mod
_spec.loader.exec_module(agent_mod)

UUID0 = "GPU-6a1b5f2e-0d3c-4c1e-9f6b-1a2b3c4d5e60"
UUID1 = "GPU-6a1b5f2e-0d3c-4c1e-9f6b-1a2b3c4d5e61"
NODE_ID = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
TASK_ARN = "arn:aws:ecs:us-east-1:123456789012:task/gpu-training/7d3c1f0e9b2a4c5d8e6f"
STOPPED_ARN = "arn:aws:ecs:us-east-1:123456789012:task/gpu-training/00000000stopped"


def ecs_task(arn: str, known: str = "RUNNING") -> dict:
    return {
        "Arn": arn,
        "DesiredStatus": "RUNNING",
        "KnownStatus": known,
        "Family": "train",
        "Version": "3",
        "Containers": [{"DockerId": "d0c", "DockerName": "ecs-train-3-main", "Name": "main"}],
    }


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture(autouse=True)
def _clean_env_and_logging(monkeypatch):
    for name in list(os.environ):
        if name.startswith("GPU_AGENT_") or "proxy" in name.lower():
            monkeypatch.delenv(name, raising=False)
    # Let caplog see the agent's records instead of a handler bound to a stale stderr.
    monkeypatch.setattr(agent_mod, "setup_logging", lambda level: None)
    agent_mod.LOG.handlers[:] = []
    agent_mod.LOG.propagate = True
    agent_mod.LOG.setLevel(logging.DEBUG)


@pytest.fixture
def server():
    srv = FakeServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def node(tmp_path, server, monkeypatch):
    """A node: fake nvidia-smi, empty kernel log, empty task/progress dirs, token file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = fake_nvidia_smi(bin_dir)
    kcmd, ksource = fake_kernel_log(bin_dir)
    tasks_dir = tmp_path / "running_tasks"
    tasks_dir.mkdir()
    progress_dir = tmp_path / "progress"
    progress_dir.mkdir()
    token_file = tmp_path / "token"
    token_file.write_text("token-one\n")
    proc_stat = tmp_path / "stat"
    proc_stat.write_text("cpu  1 2 3 4\nintr 5\nctxt 6\nbtime 1795183000\nprocesses 7\n")
    env = {
        "GPU_AGENT_API_URL": server.url,
        "GPU_AGENT_ECS_INTROSPECTION_URL": server.url,
        "GPU_AGENT_INTERVAL": "5",
        "GPU_AGENT_NVIDIA_SMI": str(smi),
        "GPU_AGENT_XID_COMMAND": str(kcmd),
        "GPU_AGENT_TASKS_DIR": str(tasks_dir),
        "GPU_AGENT_PROGRESS_DIR": str(progress_dir),
        "GPU_AGENT_PROC_STAT": str(proc_stat),
        "GPU_AGENT_TOKEN_FILE": str(token_file),
        "GPU_AGENT_RETRY_BASE_SECONDS": "0.01",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    class Node:
        pass

    n = Node()
    n.tmp, n.bin, n.smi, n.kernel_source = tmp_path, bin_dir, smi, ksource
    n.tasks_dir, n.progress_dir, n.token_file, n.env = tasks_dir, progress_dir, token_file, env
    return n


def new_agent() -> object:
    return agent_mod.Agent(agent_mod.Config())


# --------------------------------------------------------------------------- source


def test_source_parses_with_python38_grammar():
    """Given the agent source
    When it is parsed with the Python 3.8 grammar
    Then it parses, and no annotation uses 3.9+/3.10+ runtime forms (list[str], X | Y)."""
    source = AGENT_PATH.read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    builtins_generic = {"list", "dict", "tuple", "set", "frozenset", "type"}
    annotations = []
    for n in ast.walk(tree):
        if isinstance(n, ast.arg | ast.AnnAssign) and n.annotation is not None:
            annotations.append(n.annotation)
        if isinstance(n, ast.FunctionDef) and n.returns is not None:
            annotations.append(n.returns)
    for ann in annotations:
        for sub in ast.walk(ann):
            assert not (
                isinstance(sub, ast.Subscript)
                and isinstance(sub.value, ast.Name)
                and sub.value.id in builtins_generic
            ), ast.unparse(ann)
            assert not (isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.BitOr)), ast.unparse(ann)
    for newer in ("removeprefix", "removesuffix", "is_relative_to", "zoneinfo"):
        assert f".{newer}(" not in source


def test_only_standard_library_imports():
    """Given the agent source
    When its imports are listed
    Then every imported module is in the standard library."""
    tree = ast.parse(AGENT_PATH.read_text())
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names.update(a.name.split(".")[0] for a in n.names)
        elif isinstance(n, ast.ImportFrom) and n.module:
            names.add(n.module.split(".")[0])
    assert names <= set(sys.stdlib_module_names), names - set(sys.stdlib_module_names)


PYTHON38 = os.environ.get("AGENT_TEST_PYTHON38") or shutil.which("python3.8")


def _is_python38(executable: str | None) -> bool:
    if not executable:
        return False
    try:
        probe = subprocess.run(
            [executable, "-c", "import sys; print(sys.version_info[:2])"],
            capture_output=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0 and probe.stdout.strip() == b"(3, 8)"


def test_once_runs_under_python38(node, server):
    """Given a Python 3.8 interpreter (python3.8 on PATH or AGENT_TEST_PYTHON38)
    When the agent runs --once under it against the fake API
    Then both reports are accepted."""
    if not _is_python38(PYTHON38):
        pytest.skip("no working python3.8 (set AGENT_TEST_PYTHON38 to run)")
    env = {**env_without_proxy(), **node.env}
    result = subprocess.run([PYTHON38, str(AGENT_PATH), "--once"], env=env, capture_output=True, timeout=10)
    assert result.returncode == 0, result.stderr.decode()
    assert len(server.posts("/v1/report_tasks")) == len(server.posts("/v1/report_gpu")) == 1


# --------------------------------------------------------------------------- units


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/v1/report_tasks"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/v1/report_tasks"),
        (
            "https://x.execute-api.us-east-1.amazonaws.com/prod",
            "https://x.execute-api.us-east-1.amazonaws.com/prod/v1/report_tasks",
        ),
        (
            "https://x.execute-api.us-east-1.amazonaws.com/prod/",
            "https://x.execute-api.us-east-1.amazonaws.com/prod/v1/report_tasks",
        ),
    ],
)
def test_join_url_keeps_path_prefix(base, expected):
    """Given an API base URL with or without a stage prefix and trailing slash
    When the report path is joined
    Then the prefix is kept and there is exactly one slash between the parts."""
    assert agent_mod.join_url(base, "/v1/report_tasks") == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("00000000:10:1C.0", "0000:10:1c"),
        ("PCI:0000:10:1c", "0000:10:1c"),
        ("0000:0F:1C.0", "0000:0f:1c"),
        ("10:1c.0", "0000:10:1c"),
        ("garbage", None),
    ],
)
def test_normalize_pci_bus_id(raw, expected):
    """Given PCI addresses as nvidia-smi and the kernel print them
    When normalised
    Then domain width and case no longer matter."""
    assert agent_mod.normalize_pci_bus_id(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("Yes", True), ("No", False), ("1", True), ("0", False), ("[N/A]", None), ("", None)],
)
def test_parse_smi_bool(raw, expected):
    """Given nvidia-smi boolean cells
    When parsed
    Then Yes/No and 1/0 become booleans and placeholders None."""
    assert agent_mod.parse_smi_bool(raw) is expected


# --------------------------------------------------------------------------- --once, bodies


def test_once_posts_both_reports_with_auth_and_exact_bodies(node, server, monkeypatch):
    """Given a node with a RUNNING and a STOPPED ECS task, three metadata files (alive,
    dead pid, malformed), a progress file and two healthy GPUs
    When the agent runs --once
    Then it posts report_tasks and report_gpu with the bearer token and exactly the
    expected bodies, and exits 0."""
    server.ecs_tasks = {"Tasks": [ecs_task(TASK_ARN), ecs_task(STOPPED_ARN, "STOPPED")]}
    (node.tasks_dir / "123.json").write_text(
        json.dumps({"running_log_id": 123, "remote_pid": str(os.getpid()), "remote_pgid": os.getpid()})
    )
    (node.tasks_dir / "124.json").write_text(
        json.dumps({"running_log_id": 124, "remote_pid": dead_pid(), "remote_pgid": 1})
    )
    (node.tasks_dir / "125.json").write_text("{not json")
    (node.progress_dir / "7d3c1f0e9b2a4c5d8e6f.step").write_text("1200\n")
    before = time.time()

    rc = agent_mod.main(["--once"])

    assert rc == 0
    tasks_posts, gpu_posts = server.posts("/v1/report_tasks"), server.posts("/v1/report_gpu")
    assert len(tasks_posts) == 1 and len(gpu_posts) == 1
    for post in tasks_posts + gpu_posts:
        assert post.authorization == "Bearer token-one"
        assert post.headers["content-type"] == "application/json"
    body = tasks_posts[0].body
    assert isinstance(body["timestamp"], float) and before <= body["timestamp"] <= time.time()
    assert body == {
        "node_id": NODE_ID,
        "timestamp": body["timestamp"],
        "tasks": [
            {"task_arn": TASK_ARN, "step": 1200},
            {"running_log_id": "123", "remote_pid": os.getpid(), "remote_pgid": os.getpid()},
        ],
        "boot_time": 1795183000.0,
    }
    gbody = gpu_posts[0].body
    assert gbody == {
        "node_id": NODE_ID,
        "timestamp": body["timestamp"],
        "gpus": [
            {
                "index": 0,
                "uuid": UUID0,
                "utilization_gpu": 97,
                "memory_used_mib": 70000,
                "memory_total_mib": 81559,
                "temperature_c": 66,
                "ecc_uncorrected_volatile": 0,
                "ecc_corrected_volatile": 0,
                "remapped_rows_pending": False,
                "remapped_rows_failure": False,
                "recovery_action": "none",
                # The published nvlink -e capture (GPU 0 only, some links elided).
                "nvlink_replay_errors": 0,
                "nvlink_recovery_errors": 0,
                "nvlink_crc_errors": 0,
                "xids": [],
            },
            {
                "index": 1,
                "uuid": UUID1,
                "utilization_gpu": 95,
                "memory_used_mib": 69000,
                "memory_total_mib": 81559,
                "temperature_c": 64,
                "ecc_uncorrected_volatile": 0,
                "ecc_corrected_volatile": 0,
                "remapped_rows_pending": False,
                "remapped_rows_failure": False,
                "recovery_action": "none",
                "nvlink_replay_errors": None,
                "nvlink_recovery_errors": None,
                "nvlink_crc_errors": None,
                "xids": [],
            },
        ],
    }
    calls = (node.bin / "nvidia-smi.calls").read_text()
    assert (
        "--query-gpu=index,uuid,pci.bus_id,utilization.gpu,memory.used,memory.total,"
        "temperature.gpu,ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.volatile.total "
        "--format=csv,noheader,nounits"
    ) in calls
    assert "--query-gpu=index,gpu_recovery_action --format=csv,noheader" in calls
    assert "nvlink -e" in calls
    assert (
        "--query-remapped-rows=gpu_uuid,remapped_rows.pending,remapped_rows.failure "
        "--format=csv,noheader,nounits"
    ) in calls


def test_metadata_task_with_arn_is_merged_and_step_attached(node, server, caplog):
    """Given an ECS task and a metadata file naming the same task ARN, a metadata file
    holding a list (malformed) and a progress file keyed by running_log_id
    When the tasks are collected
    Then the ARN is reported once with the metadata fields, the progress file wins over
    the metadata step, and the malformed file is skipped with a warning."""
    server.ecs_tasks = {"Tasks": [ecs_task(TASK_ARN)]}
    (node.tasks_dir / "9.json").write_text(
        json.dumps({"running_log_id": 9, "remote_pid": os.getpid(), "task_arn": TASK_ARN, "step": 5})
    )
    (node.tasks_dir / "10.json").write_text(json.dumps({"running_log_id": 10, "step": "77"}))
    (node.tasks_dir / "bad.json").write_text("[1, 2]")
    (node.progress_dir / "7d3c1f0e9b2a4c5d8e6f.step").write_text("4242")
    (node.progress_dir / "10.step").write_text("not a number")

    tasks = agent_mod.collect_tasks(agent_mod.Config(), 2.0)

    assert tasks == [
        {"task_arn": TASK_ARN, "running_log_id": "9", "remote_pid": os.getpid(), "step": 4242},
        {"running_log_id": "10", "step": 77},
    ]
    assert any("bad.json" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)


def test_empty_node_reports_empty_task_list(node, server):
    """Given a node where nothing runs
    When the agent runs --once
    Then report_tasks carries an empty list (it says "nothing runs here")."""
    assert agent_mod.main(["--once"]) == 0
    assert server.posts("/v1/report_tasks")[0].body["tasks"] == []


def test_node_without_ecs_uses_node_id_env_and_metadata_files(node, server, monkeypatch, caplog):
    """Given no ECS agent (introspection port closed) and GPU_AGENT_NODE_ID set
    When the agent runs --once
    Then it reports the metadata-file tasks under the configured node id, quietly."""
    monkeypatch.setenv("GPU_AGENT_ECS_INTROSPECTION_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("GPU_AGENT_NODE_ID", "mi-0123456789abcdef0")
    (node.tasks_dir / "7.json").write_text(json.dumps({"running_log_id": 7}))

    assert agent_mod.main(["--once"]) == 0

    body = server.posts("/v1/report_tasks")[0].body
    assert body["node_id"] == "mi-0123456789abcdef0"
    assert body["tasks"] == [{"running_log_id": "7"}]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# --------------------------------------------------------------------------- GPU telemetry


@pytest.mark.parametrize(
    ("gpu_csv", "remap_csv", "expected"),
    [
        (
            "ecc_error_gpu.csv",
            "pending_remap.csv",
            {
                "index": 1,
                "uuid": UUID1,
                "utilization_gpu": 0,
                "memory_used_mib": 512,
                "memory_total_mib": 81559,
                "temperature_c": 41,
                "ecc_uncorrected_volatile": 2,
                "ecc_corrected_volatile": 5,
                "remapped_rows_pending": True,
                "remapped_rows_failure": False,
                "recovery_action": "none",
                "nvlink_replay_errors": None,
                "nvlink_recovery_errors": None,
                "nvlink_crc_errors": None,
                "xids": [],
            },
        ),
        (
            "na_gpu.csv",
            "na_remap.csv",
            {
                "index": 0,
                "uuid": "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0",
                "utilization_gpu": None,
                "memory_used_mib": 1024,
                "memory_total_mib": 16384,
                "temperature_c": None,
                "ecc_uncorrected_volatile": None,
                "ecc_corrected_volatile": None,
                "remapped_rows_pending": None,
                "remapped_rows_failure": None,
                "recovery_action": "none",
                "nvlink_replay_errors": 0,
                "nvlink_recovery_errors": 0,
                "nvlink_crc_errors": 0,
                "xids": [],
            },
        ),
    ],
    ids=["ecc-error-and-pending-remap", "n/a-values"],
)
def test_gpu_telemetry_from_recorded_csv(node, server, gpu_csv, remap_csv, expected):
    """Given nvidia-smi printing an ECC error + pending remap, or [N/A] values
    When the agent runs --once
    Then the last GPU of report_gpu carries the parsed values (N/A -> null)."""
    fake_nvidia_smi(node.bin, gpu_csv, remap_csv)

    assert agent_mod.main(["--once"]) == 0

    body = server.posts("/v1/report_gpu")[0].body
    assert body["gpus"][-1] == expected
    assert "error" not in body


REAL_NVLINK = (SMI_DIR / "real" / "nvlink_e_h100_ml_engineering.txt").read_text()


def nvlink_output(directory: Path, counts: dict[int, tuple[int, int, int]]) -> Path:
    """``nvidia-smi nvlink -e`` in the layout of the published H100 capture (its GPU line and
    its per-link lines), one GPU per entry, link 0 carrying (replay, recovery, CRC) errors
    and link 1 none: rising counters for the tests, printed as the real tool prints them."""
    lines = [line for line in REAL_NVLINK.splitlines() if not line.startswith("# ")]
    head, link0, link1 = lines[0], lines[1:4], lines[5:8]
    out = []
    for gpu, (replay, recovery, crc) in sorted(counts.items()):
        out.append(head.replace("GPU 0:", f"GPU {gpu}:"))
        for line, value in zip(link0, (replay, recovery, crc), strict=True):
            out.append(line.rsplit(" ", 1)[0] + f" {value}")
        out += ["", *link1, ""]
    path = directory / "nvlink-e.txt"
    path.write_text("\n".join(out) + "\n")
    return path


def test_driver_warnings_from_published_captures(node, server):
    """Given the published outputs: GPU 1's recovery action Reset (NVIDIA/DCGM #263) and the
    H100 nvlink -e layout with link 0 of GPU 1 at 7 replay, 1 recovery and 3 CRC errors
    When the agent runs --once
    Then report_gpu carries, per GPU, the recovery action as the health check names it and
    each NVLink counter summed over the GPU's links."""
    fake_nvidia_smi(node.bin, recovery_csv="real/recovery_action_reset_gpu1_dcgm263.csv",
                    nvlink_txt=nvlink_output(node.tmp, {0: (0, 0, 0), 1: (7, 1, 3)}))

    assert agent_mod.main(["--once"]) == 0

    gpus = server.posts("/v1/report_gpu")[0].body["gpus"]
    assert [g["recovery_action"] for g in gpus] == ["none", "gpu_reset"]
    assert {k: gpus[1][k] for k in ("nvlink_replay_errors", "nvlink_recovery_errors", "nvlink_crc_errors")} \
        == {"nvlink_replay_errors": 7, "nvlink_recovery_errors": 1, "nvlink_crc_errors": 3}
    assert gpus[0]["nvlink_replay_errors"] == 0


def test_older_driver_and_no_nvlink_leave_the_fields_null(node, server, caplog):
    """Given a driver before R565 (the recovery-action field refused) and GPUs without NVLink
    When the agent runs --once
    Then the report is sent, accepted as ever, with those fields null and no error."""
    fake_nvidia_smi(node.bin, recovery_csv="recovery_action_unsupported.exit2.txt",
                    nvlink_txt="no_nvlink.txt")

    assert agent_mod.main(["--once"]) == 0

    body = server.posts("/v1/report_gpu")[0].body
    assert "error" not in body
    for gpu in body["gpus"]:
        assert gpu["recovery_action"] is None
        assert gpu["nvlink_replay_errors"] is gpu["nvlink_crc_errors"] is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(("text", "expected"), [
    ("None", "none"), ("Reset", "gpu_reset"), ("Reboot", "node_reboot"), ("Drain P2P", "drain_p2p"),
    ("Drain and Reset", "drain_and_reset"), ("[N/A]", None), ("Recover IMEX Domain", "unknown"),
])
def test_recovery_action_words(text, expected):
    """The man page's values (the DCGM #263 capture prints "None" and "Reset") map to the health
    check's names; N/A is unknown (null); a value the man page does not list is "unknown"."""
    assert agent_mod.parse_recovery_action(text) == expected


def test_missing_nvidia_smi_reports_empty_gpus_with_error(node, server, monkeypatch):
    """Given a node without nvidia-smi
    When the agent runs --once
    Then report_gpu is still sent with "gpus": [] and an "error", and heartbeats flow."""
    monkeypatch.setenv("GPU_AGENT_NVIDIA_SMI", str(node.tmp / "missing" / "nvidia-smi"))

    assert agent_mod.main(["--once"]) == 0

    body = server.posts("/v1/report_gpu")[0].body
    assert body["gpus"] == []
    assert "not found" in body["error"]
    assert len(server.posts("/v1/report_tasks")) == 1


def test_hanging_nvidia_smi_is_killed_at_its_timeout(node, server, monkeypatch):
    """Given an nvidia-smi that hangs (a GPU fallen off the bus)
    When the agent runs a cycle with a 0.5 s command timeout
    Then nvidia-smi is killed, the cycle still reports (with an error) promptly."""
    fake_nvidia_smi(node.bin, sleep_seconds=30)
    monkeypatch.setenv("GPU_AGENT_COMMAND_TIMEOUT", "0.5")
    start = time.monotonic()

    assert agent_mod.main(["--once"]) == 0

    assert time.monotonic() - start < 2.5
    assert "timed out" in server.posts("/v1/report_gpu")[0].body["error"]


# --------------------------------------------------------------------------- Xids


def test_xids_are_mapped_to_gpus_and_deduplicated_across_cycles(node, server):
    """Given a kernel log with Xid 79 on PCI:0000:10:1c (GPU 1, printed by nvidia-smi as
    00000000:10:1C.0) and Xid 48 on 0000:0f:1c (GPU 0)
    When two cycles run and the second log holds the old lines plus a repeated Xid 79
    (new timestamp) and an Xid 94 of an address no GPU has
    Then cycle 1 reports 79 on GPU 1 and 48 on GPU 0, and cycle 2 only the new lines:
    79 on GPU 1 and 94 under unmapped_xids."""
    agent = new_agent()
    node.kernel_source.write_text((KERNEL_LOG_DIR / "xid_cycle1.log").read_text())
    assert agent.run_cycle() is True
    node.kernel_source.write_text((KERNEL_LOG_DIR / "xid_cycle2.log").read_text())
    assert agent.run_cycle() is True

    first, second = (p.body for p in server.posts("/v1/report_gpu"))
    assert [g["xids"] for g in first["gpus"]] == [[48], [79]]
    assert "unmapped_xids" not in first
    assert [g["xids"] for g in second["gpus"]] == [[], [79]]
    assert second["unmapped_xids"] == [{"pci_bus_id": "0000:a0:00", "xid": 94}]


def test_xids_are_kept_until_report_gpu_is_accepted(node, server):
    """Given an Xid in the kernel log and report_gpu failing once with 400
    When two cycles run
    Then the Xid, not delivered in cycle 1, is sent again in cycle 2 (and only then)."""
    agent = new_agent()
    node.kernel_source.write_text((KERNEL_LOG_DIR / "xid_cycle1.log").read_text())
    server.script("/v1/report_gpu", Reply(400, {"message": "bad gpu report"}))

    assert agent.run_cycle() is False
    assert agent.run_cycle() is True
    assert agent.run_cycle() is True

    bodies = [p.body for p in server.posts("/v1/report_gpu")]
    assert [[g["xids"] for g in b["gpus"]] for b in bodies] == [
        [[48], [79]],
        [[48], [79]],
        [[], []],
    ]


def test_default_xid_command_reads_journal_window_then_dmesg():
    """Given no GPU_AGENT_XID_COMMAND and a 30 s interval
    When the kernel-log commands are listed
    Then journalctl -k over the last 40 s comes first and dmesg is the fallback; a
    custom command gets {window} substituted."""
    commands = agent_mod.XidTracker(agent_mod.Config({}), agent_mod.CommandRunner()).commands()
    assert commands[0][:2] == ["journalctl", "-k"]
    assert commands[0][-2:] == ["--since", "-40s"]
    assert commands[1] == ["dmesg"]
    custom = agent_mod.Config({"GPU_AGENT_XID_COMMAND": "my-klog --last {window}s"})
    assert agent_mod.XidTracker(custom, agent_mod.CommandRunner()).commands() == [
        ["my-klog", "--last", "40s"]
    ]


# --------------------------------------------------------------------------- HTTP behaviour


def test_retries_503_then_succeeds(node, server):
    """Given report_tasks answering 503 twice, then 200
    When the agent runs --once
    Then report_tasks is posted three times and the run succeeds."""
    server.script("/v1/report_tasks", Reply(503, {"message": "busy"}), Reply(503, "oops"))

    assert agent_mod.main(["--once"]) == 0

    assert len(server.posts("/v1/report_tasks")) == 3
    assert len(server.posts("/v1/report_gpu")) == 1


def test_429_is_retried(node, server):
    """Given report_gpu answering 429 with Retry-After: 0, then 200
    When the agent runs --once
    Then report_gpu is retried and the run succeeds."""
    server.script("/v1/report_gpu", Reply(429, {"message": "slow down"}, {"Retry-After": "0"}))

    assert agent_mod.main(["--once"]) == 0
    assert len(server.posts("/v1/report_gpu")) == 2


def test_400_is_not_retried_and_its_message_logged(node, server, caplog):
    """Given report_tasks answering 400 with a message
    When the agent runs --once
    Then report_tasks is posted once, the server's message is logged, report_gpu is
    still sent and the exit code is 1."""
    server.script("/v1/report_tasks", Reply(400, {"message": "node_id is required"}))

    assert agent_mod.main(["--once"]) == 1

    assert len(server.posts("/v1/report_tasks")) == 1
    assert len(server.posts("/v1/report_gpu")) == 1
    assert "node_id is required" in caplog.text
    cycle_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cycle ")]
    assert len(cycle_lines) == 1 and "ok=false" in cycle_lines[0]
    assert "report_tasks=failed(status=400,attempts=1)" in cycle_lines[0]


def test_api_that_never_answers_does_not_block_beyond_the_interval(node, server, monkeypatch):
    """Given an API that accepts connections but never answers, and a 2 s interval
    When one cycle runs
    Then it gives up within the interval and reports failure."""
    monkeypatch.setenv("GPU_AGENT_INTERVAL", "2")
    server.default = Reply(hang=True)
    agent = new_agent()
    start = time.monotonic()

    ok = agent.run_cycle()

    assert ok is False
    assert time.monotonic() - start < 2.0
    assert server.posts("/v1/report_tasks") and server.posts("/v1/report_gpu")


def test_unreachable_api_fails_the_cycle_without_raising(node, monkeypatch):
    """Given an API URL where nothing listens
    When the agent runs --once
    Then it exits 1 instead of raising."""
    monkeypatch.setenv("GPU_AGENT_API_URL", "http://127.0.0.1:9/prod")
    monkeypatch.setenv("GPU_AGENT_INTERVAL", "1")
    assert agent_mod.main(["--once"]) == 1


def test_token_file_is_reread_every_cycle(node, server):
    """Given a token file
    When it is rotated between two cycles
    Then the second cycle's reports carry the new token."""
    agent = new_agent()
    assert agent.run_cycle() is True
    node.token_file.write_text("token-two")
    assert agent.run_cycle() is True

    tokens = [p.authorization for p in server.posts("/v1/report_tasks")]
    assert tokens == ["Bearer token-one", "Bearer token-two"]


def test_token_env_wins_over_file(node, server, monkeypatch):
    """Given GPU_AGENT_TOKEN and a token file
    When the agent runs --once
    Then the environment token is used."""
    monkeypatch.setenv("GPU_AGENT_TOKEN", "env-token")
    assert agent_mod.main(["--once"]) == 0
    assert server.posts("/v1/report_gpu")[0].authorization == "Bearer env-token"


def test_path_prefixed_api_url(node, server, monkeypatch):
    """Given GPU_AGENT_API_URL with a stage prefix (/prod/)
    When the agent runs --once
    Then the reports go to /prod/v1/report_tasks and /prod/v1/report_gpu."""
    monkeypatch.setenv("GPU_AGENT_API_URL", server.url + "/prod/")

    assert agent_mod.main(["--once"]) == 0

    paths = sorted(r.path for r in server.requests if r.method == "POST")
    assert paths == ["/prod/v1/report_gpu", "/prod/v1/report_tasks"]


# --------------------------------------------------------------------------- process


def test_sigterm_stops_the_loop_within_a_second(node, server):
    """Given the agent running as a process with an API that never answers
    When it receives SIGTERM in the middle of a report
    Then it exits with code 0 within a second."""
    server.default = Reply(hang=True)
    env = {**env_without_proxy(), **node.env, "GPU_AGENT_INTERVAL": "30"}
    proc = subprocess.Popen(
        [sys.executable, str(AGENT_PATH)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert server.first_post.wait(5), "the agent never posted"
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=5)
        elapsed = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert rc == 0, stderr
    assert elapsed < 1.0
    assert "stopping on signal" in stderr


def test_task_report_carries_the_host_boot_time(node, server):
    """Given /proc/stat with a btime line, When a cycle runs, Then the task report carries
    boot_time (the service uses it to tell a rebooted node is back); without the file the
    field is simply absent."""
    assert new_agent().run_cycle()
    assert server.posts("/v1/report_tasks")[-1].body["boot_time"] == 1795183000.0
    os.remove(node.env["GPU_AGENT_PROC_STAT"])
    assert new_agent().run_cycle()
    assert "boot_time" not in server.posts("/v1/report_tasks")[-1].body
