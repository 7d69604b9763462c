"""``gpu_recovery_client`` when things go wrong: no launcher environment, the API down,
hung, failing (5xx) or throttling (429). Training must never fail because of the channel;
``go_suspend()`` retries what is transient and says clearly what is not."""

from __future__ import annotations

import logging
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState
from gpu_recovery.domain.control_token import make_token
from local_mode.faults import INTERNAL
from tests.control.world import ControlWorld, FakeClock, client_lib

TOKEN0 = make_token("job-1", 0, "33" * 32)
LOGGER = "gpu_recovery_client"


@pytest.fixture
def closed_port() -> int:
    """A loopback port nobody listens on (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def hung_port() -> Iterator[int]:
    """A loopback port that accepts connections (kernel backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])


def warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno >= logging.WARNING and text in r.getMessage()]


def go_suspend_statuses(world: ControlWorld) -> list[int]:
    return [status for method, path, status in world.api.requests
            if method == "POST" and path.partition("?")[0].endswith("/v1/control/suspend")]


def test_without_the_launcher_environment_both_calls_say_so(monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """Not started by the queue: receive_suspend_command() answers False and warns once;
    go_suspend() raises a RuntimeError naming the missing variable."""
    for name in (C.CONTROL_URL_ENV, C.CONTROL_TOKEN_ENV, "RANK", "ATTEMPT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(client_lib, "_warned_missing", set())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert [client_lib.receive_suspend_command() for _ in range(3)] == [False] * 3
    [warning] = warnings_of(caplog, "receive_suspend_command()")
    assert C.CONTROL_URL_ENV in warning
    with pytest.raises(RuntimeError, match=C.CONTROL_URL_ENV):
        client_lib.go_suspend()
    monkeypatch.setenv(C.CONTROL_URL_ENV, "https://api.example/prod")
    with pytest.raises(RuntimeError, match=C.CONTROL_TOKEN_ENV):
        client_lib.go_suspend(block=False)
    monkeypatch.setenv(C.CONTROL_URL_ENV, "file:///etc/passwd")
    monkeypatch.setenv(C.CONTROL_TOKEN_ENV, TOKEN0)
    with pytest.raises(RuntimeError, match=C.CONTROL_URL_ENV):
        client_lib.go_suspend(block=False)


def test_the_rank_is_the_one_the_token_names() -> None:
    """torchrun rewrites RANK per process (the global process rank): the rank of the
    container is the one its token names, so every process of rank 0 is told."""
    env = {C.CONTROL_URL_ENV: "https://api.example/prod", C.CONTROL_TOKEN_ENV: TOKEN0, "RANK": "3",
           "ATTEMPT": "2"}
    client = client_lib.SuspendClient.from_env(env)
    assert client.rank == 0 and client.attempt == 2 and client.url == "https://api.example/prod"
    other = client_lib.SuspendClient.from_env({**env, C.CONTROL_TOKEN_ENV: make_token("job-1", 1, "33" * 32),
                                               "RANK": "0"})
    assert other.rank == 1 and other.receive_suspend_command() is False  # no request: nothing listens
    not_a_launcher_token = client_lib.SuspendClient.from_env({**env, C.CONTROL_TOKEN_ENV: "x" * 20})
    assert not_a_launcher_token.rank == 3


def test_an_unreachable_api_answers_false_once_per_interval_and_is_logged_once(
        closed_port: int, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    client = client_lib.SuspendClient(f"http://127.0.0.1:{closed_port}/prod", TOKEN0, clock=clock,
                                      state_dir=str(tmp_path))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        for _ in range(6):
            assert client.receive_suspend_command() is False
            clock.advance(1.0)
    assert len(warnings_of(caplog, "poll failed")) == 1
    assert len([r for r in caplog.records if "poll failed again" in r.getMessage()]) == 2  # 3 polls in 6 s
    shared = client.read_state()
    assert shared["suspend"] is False and "URLError" in shared["error"]
    (tmp_path / Path(client.state_path).name).write_text("{not json")  # a torn or foreign file
    clock.advance(2.0)
    assert client.receive_suspend_command() is False


def test_a_hung_api_costs_a_step_at_most_the_timeout(hung_port: int, tmp_path: Path) -> None:
    assert client_lib.HTTP_TIMEOUT_SECONDS == 3.0
    client = client_lib.SuspendClient(f"http://127.0.0.1:{hung_port}", TOKEN0, timeout=0.3,
                                      state_dir=str(tmp_path))
    started = time.monotonic()
    assert client.receive_suspend_command() is False
    assert time.monotonic() - started < 2.0
    assert "timed out" in client.read_state()["error"]


def test_a_failing_api_answers_false_then_the_client_recovers(world: ControlWorld,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """DynamoDB failing: the authorizer errors, the gateway answers 500; the poll answers
    False (logged once); once DynamoDB is back the next poll sees the suspend."""
    job = world.start()
    world.user_suspend(job)
    clock = FakeClock()
    rank0 = world.client(job, 0, clock=clock)
    world.qc.local.faults.persistent("dynamodb", "GetItem", error=INTERNAL)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(3):
            assert rank0.receive_suspend_command() is False
            clock.advance(2.0)
        world.qc.local.faults.clear()
        assert rank0.receive_suspend_command() is True
    assert len(warnings_of(caplog, "HTTP 500")) == 1
    assert any("answers again" in r.getMessage() for r in caplog.records)


def test_go_suspend_retries_a_5xx(world: ControlWorld) -> None:
    job = world.start()
    world.qc.local.faults.persistent("dynamodb", "GetItem", error=INTERNAL)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        world.qc.local.faults.clear()  # DynamoDB is back

    ack = world.client(job, 1, sleep=sleep).go_suspend(block=False)
    assert ack["state"] == "SUSPENDING" and len(sleeps) == 1 and 0 <= sleeps[0] <= 0.5
    assert go_suspend_statuses(world) == [500, 200]


def test_go_suspend_retries_429_with_backoff(world: ControlWorld) -> None:
    job = world.start()
    world.api.throttle_next = 2
    sleeps: list[float] = []
    ack = world.client(job, 0, sleep=sleeps.append).go_suspend(block=False)
    assert ack["state"] == "SUSPENDING" and len(sleeps) == 2
    assert 0 <= sleeps[0] <= 0.5 and 0 <= sleeps[1] <= 1.0
    assert go_suspend_statuses(world) == [429, 429, 200]


def test_go_suspend_gives_up_on_an_unreachable_api_after_a_few_tries(closed_port: int,
                                                                      tmp_path: Path) -> None:
    sleeps: list[float] = []
    client = client_lib.SuspendClient(f"http://127.0.0.1:{closed_port}", TOKEN0, sleep=sleeps.append,
                                      state_dir=str(tmp_path))
    with pytest.raises(client_lib.ControlError) as raised:
        client.go_suspend()
    assert raised.value.status is None and "URLError" in str(raised.value)
    assert len(sleeps) == client_lib.GO_SUSPEND_ATTEMPTS - 1
    assert all(0 <= s <= min(client_lib.MAX_BACKOFF_SECONDS, 0.5 * 2 ** i) for i, s in enumerate(sleeps))


class Blocked(Exception):
    pass


def test_go_suspend_does_not_return_and_leaves_on_sigterm(world: ControlWorld) -> None:
    """After the API accepted, go_suspend() waits to be stopped; as PID 1 a default SIGTERM
    would be ignored, so it installs a handler that exits (143) instead."""
    job = world.start()
    waits: list[float] = []

    def sleep(seconds: float) -> Any:
        waits.append(seconds)
        raise Blocked

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(Blocked):
            world.client(job, 0, sleep=sleep).go_suspend()
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        with pytest.raises(SystemExit) as exited:
            handler(signal.SIGTERM, None)
        assert exited.value.code == 143
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert waits == [3600] and world.item(job)["job_state"] == JobState.SUSPENDING.value
