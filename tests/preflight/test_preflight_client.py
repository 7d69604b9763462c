"""The training client's preflight: the wrapper's loop against the control API's answers,
what it runs for each test, what it sends, and its all-reduce benchmark printing nccl-tests'
own table (row for row as the real H100 run printed it)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from gpu_recovery.domain.preflight.nccl_output import parse_all_reduce_perf
from tests.control.world import client_lib

REAL = Path(__file__).parent / "fixtures" / "real" / "nccl_all_reduce_perf_2x8_h100.txt"
CAPTURE = REAL.read_text()


def test_the_benchmark_prints_the_rows_as_nccl_tests_does() -> None:
    """Every row of the real capture, printed again from its numbers by the client's
    formatter, is the same line: the benchmark's table is the tool's."""
    rows = [line for line in CAPTURE.splitlines() if line.strip() and not line.startswith("#")]
    for line in rows:
        t = line.split()
        oop = (float(t[5]), float(t[6]), float(t[7]), int(t[8]))
        ip = (float(t[9]), float(t[10]), float(t[11]), int(t[12]))
        assert client_lib.table_row(int(t[0]), int(t[1]), t[2], t[3], int(t[4]), oop, ip) == line.rstrip()
    header = client_lib.table_header(
        8, 8589934592, [(0, 6899, "ztan-mig-235z", 0, "0000:04:00", "NVIDIA H100 80GB HBM3")]
    )
    printed = CAPTURE.splitlines()
    first_row = printed.index(rows[0])
    assert (
        header[0] == printed[0]
        and header[3] == printed[3]
        and header[-3:] == printed[first_row - 3 : first_row]
    )
    # the capture ends at the mean's line (common.cu prints one "#" line more)
    assert client_lib.table_footer(0, [70.742])[:2] == printed[-2:]


class FakeDist:
    """torch.distributed's few calls the benchmark makes, on a 2 x 8 model: each all-reduce
    takes what the real capture's large sizes took."""

    def __init__(self) -> None:
        self.clock = 0.0

    def get_rank(self) -> int:
        return 0

    def get_world_size(self) -> int:
        return 16

    def all_gather_object(self, out: list[Any], mine: Any) -> None:
        for i in range(len(out)):
            out[i] = (
                i,
                1000 + i,
                "node-a" if i < 8 else "node-b",
                i % 8,
                "0000:04:00",
                "NVIDIA H100 80GB HBM3",
            )

    def all_reduce(self, tensor: Any) -> None:
        self.clock += 120e-6 + tensor.nbytes / 184.29e9
        tensor.reduced = True

    def barrier(self) -> None:
        pass


class FakeTensor:
    def __init__(self, count: int, value: float = 1.0) -> None:
        self.nbytes = 4 * count
        self.value = value

    def copy_(self, other: FakeTensor) -> FakeTensor:
        return self

    def __ne__(self, other: object) -> FakeTensor:  # type: ignore[override]
        return FakeTensor(0)

    def sum(self) -> FakeTensor:
        return self

    def item(self) -> int:
        return 0


class FakeTorch:
    float32 = "float32"

    class cuda:  # torch's own name
        @staticmethod
        def current_device() -> int:
            return 0

        @staticmethod
        def get_device_properties(_device: Any) -> Any:
            return type("Props", (), {"name": "NVIDIA H100 80GB HBM3", "pci_bus_id": 4})

        @staticmethod
        def synchronize() -> None:
            pass

    @staticmethod
    def device(_kind: str, index: int) -> Any:
        return type("Device", (), {"index": index})()

    @staticmethod
    def ones(count: int, dtype: Any = None, device: Any = None) -> FakeTensor:
        return FakeTensor(count)

    @staticmethod
    def empty_like(t: FakeTensor) -> FakeTensor:
        return FakeTensor(t.nbytes // 4)

    @staticmethod
    def tensor(values: list[int], device: Any = None) -> FakeTensor:
        return FakeTensor(len(values))


def test_the_benchmark_output_is_read_by_the_stack_as_the_tool_s() -> None:
    dist = FakeDist()
    lines: list[str] = []
    wrong = client_lib.allreduce_benchmark(
        FakeTorch, dist, 128 * 2**20, 2**30, lines.append, clock=lambda: dist.clock
    )
    run = parse_all_reduce_perf("\n".join(lines))
    assert wrong == 0 and run.failure(0) == "" and run.ranks == 16 and run.hosts == ("node-a", "node-b")
    assert [r.size_bytes for r in run.rows] == [2**27, 2**28, 2**29, 2**30]
    # busbw = algbw * 2(n-1)/n with n = 16 ranks
    algbw = 2**30 / 1e9 / (120e-6 + 2**30 / 184.29e9)
    assert run.judged_busbw() == pytest.approx(algbw * 30 / 16, rel=0.001)


def test_report_text_keeps_the_table_and_a_few_device_lines() -> None:
    devices = "\n".join(
        f"#  Rank {r:2d} Group  0 Pid {r:6d} on      node device  0 [0000:04:00] H100" for r in range(8192)
    )
    chatter = "\n".join(f"node:1:2 [0] NCCL INFO Channel {i:02d}" for i in range(500))
    text = client_lib.report_text(devices + "\n" + chatter + "\n" + CAPTURE)
    assert "NCCL INFO" not in text and text.count("#  Rank") <= 4
    assert len(text) <= client_lib.MAX_REPORT_CHARS and len(text.splitlines()) <= client_lib.MAX_REPORT_LINES
    assert parse_all_reduce_perf(text).judged_busbw() == pytest.approx(338.085)


def test_what_the_runner_runs_for_each_test() -> None:
    env = {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c,GPU-d,GPU-e,GPU-f,GPU-g,GPU-h",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "PATH": "/nonexistent",
    }
    runner = client_lib.CommandRunner(env, python="python3", script="/opt/gpu_recovery_client.py")
    assert runner.gpus == 8
    sizes = {"min_bytes": 134217728, "max_bytes": 1073741824}
    loopback = runner.command({"kind": "loopback", "group_size": 1, **sizes})
    assert (
        loopback[:7]
        == ["python3", "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node"]
        and "allreduce" in loopback
    )
    group = runner.command(
        {
            "kind": "group",
            "group_size": 4,
            "group_rank": 2,
            "master_addr": "10.0.0.7",
            "port_offset": 18,
            **sizes,
        }
    )
    assert shlex.join(group) == (
        "python3 -m torch.distributed.run --nnodes 4 --nproc-per-node 8 --node-rank 2 "
        "--master-addr 10.0.0.7 --master-port 29518 /opt/gpu_recovery_client.py allreduce "
        "--min-bytes 134217728 --max-bytes 1073741824"
    )
    gang = runner.command(
        {"kind": "group", "group_size": 16, "group_rank": 0, "master_addr": "", "port_offset": 1, **sizes}
    )
    assert "10.0.0.1" in gang  # the gang's rendezvous is the job's own MASTER_ADDR
    tool = client_lib.CommandRunner(
        {**env, "GPU_RECOVERY_ALL_REDUCE_PERF": "/opt/nccl-tests/all_reduce_perf"}
    )
    assert tool.command({"kind": "loopback", **sizes}) == [
        "/opt/nccl-tests/all_reduce_perf",
        "-b",
        "134217728",
        "-e",
        "1073741824",
        "-f",
        "2",
        "-g",
        "8",
    ]
    custom = client_lib.CommandRunner(
        {
            **env,
            "GPU_RECOVERY_PREFLIGHT_COMMAND": (
                "mpirun -np {nnodes} run-nccl {master_addr}:{master_port} {max_bytes}"
            ),
        }
    )
    assert custom.command(
        {"kind": "group", "group_size": 2, "master_addr": "h", "port_offset": 3, **sizes}
    ) == ["mpirun", "-np", "2", "run-nccl", "h:29503", "1073741824"]
    failed = client_lib.CommandRunner(env, python="/nonexistent/python")(
        {"kind": "loopback", "timeout_seconds": 5, **sizes}
    )
    assert failed[0] == 127 and "Test failure" in failed[1]


class ScriptedClient:
    """The control API's answers, in order; records the reports."""

    def __init__(self, answers: list[Any], report_failures: list[Exception] | None = None) -> None:
        self.answers = answers
        self.report_failures = report_failures or []  # the first reports' failures, in order
        self.reports: list[tuple[int, str, int | None]] = []

    def step(self) -> dict[str, Any]:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)

    def report(
        self,
        round_: int,
        test_id: str,
        exit_code: int | None,
        output: str,
        seconds: float | None = None,
        address: str = "",
    ) -> dict[str, Any]:
        if self.report_failures:
            raise self.report_failures.pop(0)
        self.reports.append((round_, test_id, exit_code))
        return {"action": "wait"}


TEST = {"min_bytes": 1, "max_bytes": 2, "timeout_seconds": 30}


def test_the_wrapper_runs_each_test_once_reports_its_own_and_ends_as_told() -> None:
    run = {
        "action": "run",
        "round": 1,
        "poll_seconds": 2,
        "tests": [
            {"id": "loopback", "kind": "loopback", "report": True, **TEST},
            {"id": "gang", "kind": "group", "report": False, **TEST},
        ],
    }
    client = ScriptedClient(
        [run, run, {"action": "wait", "poll_seconds": 2}, {"action": "train", "status": "passed"}]
    )
    ran: list[str] = []
    slept: list[float] = []
    ended = client_lib.run_preflight(
        client,
        lambda t: (ran.append(t["id"]), (0, "out", 1.0))[1],
        "10.0.0.2",
        sleep=slept.append,
        log=lambda _m: None,
    )
    assert ended == "train" and ran == ["loopback", "gang"] and client.reports == [(1, "loopback", 0)]
    assert slept == [2.0, 2.0]  # the round's tests done: it polls, not runs again
    stop = ScriptedClient([{"action": "stop", "reason": "pinned"}])
    assert (
        client_lib.run_preflight(stop, lambda t: (0, "", 0.0), sleep=slept.append, log=lambda _m: None)
        == "stop"
    )


def test_a_report_the_api_failed_is_sent_again_while_its_round_runs_and_never_after() -> None:
    """The stack's own failure (its retries spent) must not read as a hung test: the result is
    sent again at the next poll of its round; a refusal, or a round over, drops it."""
    loopback = {"id": "loopback", "kind": "loopback", "report": True, **TEST}
    gang = {"id": "gang", "kind": "group", "report": True, **TEST}
    round_one = {"action": "run", "round": 1, "poll_seconds": 2, "tests": [loopback, gang]}
    down = client_lib.ControlError("preflight POST refused: HTTP 503", 503, "unavailable")
    client = ScriptedClient([round_one, round_one, round_one, {"action": "train", "status": "passed"}],
                            report_failures=[down, down, down])
    ran: list[str] = []
    ended = client_lib.run_preflight(client, lambda t: (ran.append(t["id"]), (0, "out", 1.0))[1],
                                     sleep=lambda _s: None, log=lambda _m: None)
    # The loopback's and the gang's reports fail; at the next poll the gang's fails again and the
    # loopback's gets through; the gang's at the poll after. Each test ran once.
    assert ended == "train" and ran == ["loopback", "gang"]
    assert client.reports == [(1, "loopback", 0), (1, "gang", 0)]

    refused = client_lib.ControlError("preflight POST refused: HTTP 409", 409, "not_the_leader")
    round_two = {"action": "run", "round": 2, "poll_seconds": 2, "tests": []}
    client = ScriptedClient([round_one, round_two, {"action": "train", "status": "passed"}],
                            report_failures=[refused, down])
    client_lib.run_preflight(client, lambda t: (0, "out", 1.0), sleep=lambda _s: None, log=lambda _m: None)
    assert client.reports == []  # the loopback refused (not again); the gang's round over


def test_the_wrapper_never_blocks_training_on_an_unreachable_api() -> None:
    down = client_lib.ControlError("preflight GET failed: URLError: refused")
    clock = iter(range(0, 10_000, 100))
    client = ScriptedClient([down] * 20)
    assert (
        client_lib.run_preflight(
            client,
            lambda t: (0, "", 0.0),
            sleep=lambda _s: None,
            clock=lambda: float(next(clock)),
            give_up_seconds=900,
            log=lambda _m: None,
        )
        == "train"
    )
    refused = ScriptedClient([client_lib.ControlError("refused", 403, "forbidden")])
    assert (
        client_lib.run_preflight(refused, lambda t: (0, "", 0.0), sleep=lambda _s: None, log=lambda _m: None)
        == "train"
    )
    with pytest.raises(RuntimeError, match="not started by the GPU job queue"):
        client_lib.PreflightClient.from_env({})
