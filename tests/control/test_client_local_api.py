"""``gpu_recovery_client`` against the real local API (HTTP on 127.0.0.1, the control handler
behind its TOKEN authorizer, the emulator behind them), with ranks the real scheduler tick
launched: their environment is the launcher's."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState, RankState
from gpu_recovery.domain.control_token import make_token
from local_mode.server import route_defined
from tests.control.world import CLIENT_PATH, ControlWorld, client_lib
from tests.fixtures.clock import ManualClock

CONTROL = "/v1/control"
SUSPEND = "/v1/control/suspend"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_launcher_gives_every_rank_the_control_channel(world: ControlWorld) -> None:
    """Given a job submitted through the jobs API and launched by the tick with
    JOB_CONTROL_API_URL set, each rank's environment has the URL, its own token, RANK, ATTEMPT."""
    job = world.start()
    for rank in (0, 1):
        env = world.rank_env(job, rank)
        assert env[C.CONTROL_URL_ENV] == world.control_url
        assert env[C.CONTROL_TOKEN_ENV].startswith(f"{job}.{rank}.")
        assert env["RANK"] == str(rank) and env["ATTEMPT"] == "1"
        assert client_lib.rank_of_token(env[C.CONTROL_TOKEN_ENV]) == rank


def test_rank_0_is_told_once_suspending_and_other_ranks_never_ask(world: ControlWorld) -> None:
    """Given a RUNNING job, When its owner suspends it (jobs API), Then rank 0's
    receive_suspend_command() turns True at its next poll and stays True without asking
    again, while rank 1 never gets True and never sends a request."""
    job = world.start()
    clock = ManualClock()
    rank0, rank1 = world.client(job, 0, clock=clock), world.client(job, 1, clock=clock)
    assert rank0.receive_suspend_command() is False
    assert rank1.receive_suspend_command() is False
    assert world.api.count("GET", CONTROL) == 1  # rank 1 asked nothing

    world.user_suspend(job)
    assert world.item(job)["job_state"] == JobState.SUSPENDING.value
    clock.advance(1.0)
    assert rank0.receive_suspend_command() is False  # cached: the next poll is due at +2 s
    assert world.api.count("GET", CONTROL) == 1
    clock.advance(1.0)
    assert rank0.receive_suspend_command() is True
    assert world.api.count("GET", CONTROL) == 2
    shared = rank0.read_state()
    assert shared["suspend"] is True and shared["state"] == "SUSPENDING"
    assert shared["grace_seconds"] == 60 and shared["deadline_at"] and shared["poll_seconds"] == 2

    for _ in range(20):  # once told, the container stays told, without asking again
        clock.advance(1.0)
        assert rank0.receive_suspend_command() is True
        assert rank1.receive_suspend_command() is False
    another_process = world.client(job, 0, clock=clock)
    assert another_process.receive_suspend_command() is True
    assert world.api.count("GET", CONTROL) == 2


def test_go_suspend_from_any_rank_stops_every_rank(world: ControlWorld) -> None:
    """Given a RUNNING job, When rank 1 calls go_suspend(), Then the job is SUSPENDING with
    its stop committed, every rank STOP_REQUESTED and StopTask called for each task; once
    they stopped the job is SUSPENDED."""
    job = world.start()
    tasks = sorted(t.arn for t in world.qc.live_tasks(job))
    ack = world.client(job, 1).go_suspend(block=False)
    assert ack["job_id"] == job and ack["rank"] == 1 and ack["state"] == "SUSPENDING"
    assert sorted(ack["stopping_ranks"]) == [0, 1]
    item = world.item(job)
    assert item["job_state"] == JobState.SUSPENDING.value
    assert item["suspend"]["stop_requested_at"] and item["suspend"]["kind"] == "self"
    ranks = world.qc.repo.jobs.get_ranks(world.qc.repo.jobs.get_job(job))
    assert {r.rank: r.state for r in ranks if r.attempt == 1} == {
        0: RankState.STOP_REQUESTED, 1: RankState.STOP_REQUESTED}
    assert sorted(world.stop_task_calls) == tasks
    world.qc.sim.run_for(30)
    assert world.qc.state(job) is JobState.SUSPENDED


def test_a_wrong_token_is_403_and_a_malformed_one_401_without_the_authorizer(world: ControlWorld) -> None:
    job = world.start()
    good = world.rank_env(job, 0)[C.CONTROL_TOKEN_ENV]
    wrong_mac = good[:-4] + ("0000" if not good.endswith("0000") else "1111")
    calls = len(world.authorizer_calls)
    for token in (wrong_mac, make_token("no-such-job-1", 0, "22" * 32)):
        status, body = world.http("GET", CONTROL, headers=bearer(token))
        assert (status, body["error"]) == (403, "ACCESS_DENIED")
    assert len(world.authorizer_calls) == calls + 2

    calls = len(world.authorizer_calls)
    for headers in ({}, {"Authorization": "Bearer short"}, {"Authorization": good},
                    {"Authorization": f"Basic {good}"}):
        status, body = world.http("POST", SUSPEND, headers=headers)
        assert (status, body["error"]) == (401, "UNAUTHORIZED"), headers
    assert len(world.authorizer_calls) == calls  # API Gateway answers these itself
    # Well-formed for the gateway, not a control token: the authorizer says Unauthorized.
    status, body = world.http("GET", CONTROL, headers=bearer("a" * 40))
    assert (status, body["error"]) == (401, "UNAUTHORIZED")
    assert len(world.authorizer_calls) == calls + 1

    # The client: polls answer False (logged once), go_suspend() raises with the status.
    refused = client_lib.SuspendClient(world.control_url, wrong_mac, state_dir=str(world.state_dir))
    assert refused.receive_suspend_command() is False
    with pytest.raises(client_lib.ControlError) as raised:
        refused.go_suspend(block=False)
    assert raised.value.status == 403 and "ACCESS_DENIED" in str(raised.value)
    assert world.item(job)["job_state"] == JobState.RUNNING.value


def test_a_stale_attempt_is_never_told_and_cannot_suspend(world: ControlWorld) -> None:
    """A process of an older attempt (its ATTEMPT is over) gets suspend=false, and its
    go_suspend() is refused with 409 and the API's message."""
    job = world.start()
    world.user_suspend(job)
    env = world.rank_env(job, 0)
    stale = client_lib.SuspendClient(env[C.CONTROL_URL_ENV], env[C.CONTROL_TOKEN_ENV], attempt=7,
                                     clock=ManualClock(), state_dir=str(world.state_dir))
    assert stale.receive_suspend_command() is False
    assert stale.read_state()["state"] == "SUSPENDING" and stale.read_state()["attempt"] == 1
    assert world.client(job, 0, clock=ManualClock()).receive_suspend_command() is True
    with pytest.raises(client_lib.ControlError) as raised:
        stale.go_suspend(block=False)
    assert raised.value.status == 409 and raised.value.code == "stale_attempt"
    assert "attempt 7" in raised.value.message
    assert "stop_requested_at" not in world.item(job)["suspend"]


def test_the_processes_of_a_container_share_one_poll_per_interval(world: ControlWorld) -> None:
    """Two processes of rank 0 (two clients, one state dir) calling every 0.1 s for 10 s
    make one request per 2 s interval between them, not one each."""
    job = world.start()
    clock = ManualClock()
    first, second = world.client(job, 0, clock=clock), world.client(job, 0, clock=clock)
    for step in range(100):
        assert (first if step % 2 else second).receive_suspend_command() is False
        clock.advance(0.1)
    assert world.api.count("GET", CONTROL) == 5


def test_while_another_process_is_asking_the_others_answer_from_the_shared_file(
        world: ControlWorld) -> None:
    job = world.start()
    clock = ManualClock()
    asking = world.client(job, 0, clock=clock)
    assert asking.receive_suspend_command() is False
    clock.advance(5)
    waiting = world.client(job, 0, clock=clock)
    fd = os.open(waiting.state_path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # "another process" polls now
        assert waiting.receive_suspend_command() is False
        assert world.api.count("GET", CONTROL) == 1
    finally:
        os.close(fd)
    assert waiting.receive_suspend_command() is False
    assert world.api.count("GET", CONTROL) == 2


def test_a_suspend_decided_at_t_is_seen_by_t_plus_the_poll_interval(world: ControlWorld) -> None:
    """The 5 s bound: training steps every 0.25 s, polls every 2 s; a suspend decided just
    after a poll (the worst case) is seen at the next poll, within 2 s."""
    job = world.start()
    clock = ManualClock()
    rank0 = world.client(job, 0, clock=clock)
    assert rank0.receive_suspend_command() is False
    polled_at = clock()
    clock.advance(0.05)
    decided_at = clock()
    world.user_suspend(job)
    while not rank0.receive_suspend_command():
        clock.advance(0.25)
        assert clock() - decided_at <= 5
    assert clock() - decided_at <= 2.0 + 1e-9  # the first step after the next poll was due
    assert polled_at + 2.0 <= clock() < polled_at + 2.0 + 0.25
    assert world.api.count("GET", CONTROL) == 2


def test_the_api_sets_the_poll_interval(world: ControlWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    """JOB_CONTROL_POLL_SECONDS=5 in the API's settings: the client asks every 5 s."""
    monkeypatch.setenv(C.ENV_CONTROL_POLL_SECONDS, "5")
    from gpu_recovery import runtime

    runtime.reset(clients=False)
    job = world.start()
    clock = ManualClock()
    rank0 = world.client(job, 0, clock=clock)
    for _ in range(100):
        rank0.receive_suspend_command()
        clock.advance(0.1)
    assert world.api.count("GET", CONTROL) == 2 and rank0.read_state()["poll_seconds"] == 5


def test_the_module_calls_read_the_launcher_environment(world: ControlWorld,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The seed's calls as training code makes them: receive_suspend_command() and
    go_suspend() read GPU_RECOVERY_CONTROL_URL/TOKEN, RANK, ATTEMPT; the shared file is in $TMPDIR."""
    job = world.start()
    world.user_suspend(job)
    monkeypatch.setattr(tempfile, "tempdir", str(world.state_dir))

    def become(rank: int) -> None:
        for key, value in world.rank_env(job, rank).items():
            monkeypatch.setenv(key, value)

    become(1)
    assert client_lib.receive_suspend_command() is False
    assert world.api.count("GET", CONTROL) == 0
    become(0)
    assert client_lib.receive_suspend_command() is True
    assert any(name.startswith("gpu-recovery-control-") for name in os.listdir(world.state_dir))
    become(1)
    ack: dict[str, Any] = client_lib.go_suspend(block=False)
    assert ack["rank"] == 1 and sorted(ack["stopping_ranks"]) == [0, 1]


def test_the_control_routes_answer_like_api_gateway(world: ControlWorld) -> None:
    """Defined: GET /v1/control and POST /v1/control/suspend, with or without the stage;
    any other method is 403 MISSING_AUTHENTICATION_TOKEN, before any authorizer."""
    assert route_defined("GET", "/v1/control") and route_defined("POST", "/v1/control/suspend")
    assert not route_defined("POST", "/v1/control") and not route_defined("GET", "/v1/control/suspend")
    job = world.start()
    token = world.rank_env(job, 0)[C.CONTROL_TOKEN_ENV]
    calls = len(world.authorizer_calls)
    for method, path in (("DELETE", CONTROL), ("GET", SUSPEND), ("PUT", "/prod/v1/control"),
                         ("GET", "/v1/control/other")):
        status, body = world.http(method, path, headers=bearer(token))
        assert (status, body["error"]) == (403, "MISSING_AUTHENTICATION_TOKEN"), (method, path)
    assert len(world.authorizer_calls) == calls
    for path in (CONTROL, f"/prod{CONTROL}"):
        status, body = world.http("GET", f"{path}?attempt=1", headers=bearer(token))
        assert status == 200 and body["job_id"] == job and body["rank"] == 0 and body["suspend"] is False
    status, body = world.http("GET", f"{CONTROL}?attempt=zero", headers=bearer(token))
    assert status == 400 and body["field"] == "attempt"
    assert world.item(job)["job_state"] == JobState.RUNNING.value


PROCESS = """
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("gpu_recovery_client", sys.argv[1])
client = importlib.util.module_from_spec(spec)
spec.loader.exec_module(client)
c = client.SuspendClient.from_env(json.loads(sys.argv[2]), state_dir=sys.argv[3])
deadline = time.time() + 8
while time.time() < deadline:
    if c.receive_suspend_command():
        print("told")
        break
    time.sleep(0.01)  # a training step
"""


def test_every_process_of_rank_0_is_told_with_one_poll_per_interval(world: ControlWorld) -> None:
    """Four real processes of rank 0's container (as torchrun starts them), each calling
    receive_suspend_command() every 10 ms: all are told, with one request per 2 s between them."""
    job = world.start()
    env = world.rank_env(job, 0)
    state_dir = world.state_dir / "container"
    state_dir.mkdir()
    workers = [subprocess.Popen([sys.executable, "-c", PROCESS, str(CLIENT_PATH), json.dumps(
        {**env, "RANK": str(local_rank)}), str(state_dir)], stdout=subprocess.PIPE, text=True)
        for local_rank in range(4)]
    time.sleep(2.5)
    world.user_suspend(job)
    outputs = [worker.communicate(timeout=30)[0] for worker in workers]
    assert outputs == ["told\n"] * 4
    # Polls at t0, t0+2, t0+4 at most (the suspend came ~2.5 s after the start): one per
    # interval for the container, not one per process (that would be 4 per interval).
    assert 1 <= world.api.count("GET", CONTROL) <= 3
