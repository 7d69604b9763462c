"""The gpujobs CLI against the real local API server (same handlers as API Gateway)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from cli.gpujobs import main


@pytest.fixture
def endpoint() -> Iterator[dict[str, Any]]:
    from handlers import jobs_api
    from local_mode.server import LocalApi, LocalApiServer
    from local_mode.world import build_world

    jobs_api.reset()
    try:
        with build_world(handlers=False) as world, LocalApiServer(LocalApi()) as server:
            sim = world.ecs
            sim.add_node("node-a", gpus=8)
            td = sim.register_training_task_definition("train", gpus=8)
            yield {"url": server.url, "td": td.rsplit("/", 1)[-1]}
    finally:
        jobs_api.reset()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_submit_list_show_events_cancel(endpoint: dict[str, Any], capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the local API on 127.0.0.1, When a user submits, lists, shows, reads events and
    cancels with the CLI, Then every command talks to the real handlers over HTTP."""
    monkeypatch.setenv("USER", "alice")
    url = endpoint["url"]
    code, out, err = run(capsys, "--endpoint", url, "submit", "--name", "llama-ft",
                         "--task-definition", endpoint["td"], "--nnodes", "1", "--gpus-per-node", "8",
                         "--priority", "HIGH", "--env", "LR=3e-4", "--command", "python train.py")
    assert code == 0, err
    job_id = out.strip().splitlines()[-1]
    assert job_id.startswith("llama-ft-")

    code, out, _ = run(capsys, "--endpoint", url, "--json", "list")
    assert code == 0
    assert [j["job_id"] for j in json.loads(out)["jobs"]] == [job_id]

    code, out, _ = run(capsys, "--endpoint", url, "--json", "show", job_id)
    shown = json.loads(out)
    assert code == 0 and shown["state"] == "QUEUED" and shown["priority"] == 30

    code, out, _ = run(capsys, "--endpoint", url, "cancel", job_id)
    assert code == 0 and "CANCELED" in out

    code, out, _ = run(capsys, "--endpoint", url, "--json", "events", job_id)
    assert [e["to"] for e in json.loads(out)["events"]] == ["QUEUED", "CANCELED"]


def test_invalid_spec_is_a_4xx_naming_the_field(endpoint: dict[str, Any],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--endpoint", endpoint["url"], "submit", "--name", "big",
                       "--task-definition", endpoint["td"], "--nnodes", "1", "--gpus-per-node", "16")
    assert code == 2
    assert "gpus_per_node" in err


def test_unknown_job_is_a_4xx(endpoint: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--endpoint", endpoint["url"], "show", "nope-20261120-000000-abcd")
    assert code == 2 and "404" in err


def test_suspend_and_resume_a_waiting_job(endpoint: dict[str, Any], capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Given alice's queued job (no scheduler runs here),
    When she suspends it, suspends it again, resumes it and cancels it with the CLI,
    Then it is SUSPENDED and held at once (show says so, list shows the state), the repeat
    changes nothing, the resume queues it again (still SUSPENDED, no longer held) and a
    suspended job can be canceled."""
    monkeypatch.setenv("USER", "alice")
    url = endpoint["url"]
    code, out, err = run(capsys, "--endpoint", url, "submit", "--name", "paused",
                         "--task-definition", endpoint["td"], "--nnodes", "1", "--gpus-per-node", "8")
    assert code == 0, err
    job_id = out.strip()
    code, out, _ = run(capsys, "--endpoint", url, "suspend", job_id)
    assert code == 0 and out.strip() == f"{job_id}: SUSPENDED (held until `gpujobs resume {job_id}`)"
    code, out, _ = run(capsys, "--endpoint", url, "show", job_id)
    assert "State:      SUSPENDED, held until resumed" in out and "Kind:      user (by user alice)" in out
    code, out, _ = run(capsys, "--endpoint", url, "list", "--state", "SUSPENDED")
    assert out.splitlines()[1].split()[:3] == [job_id, "paused", "SUSPENDED"]
    code, out, _ = run(capsys, "--endpoint", url, "suspend", job_id)
    assert code == 0 and out.strip().endswith("; it already was)")

    code, out, _ = run(capsys, "--endpoint", url, "resume", job_id)
    assert code == 0 and "queued at its original position" in out
    code, out, _ = run(capsys, "--endpoint", url, "--json", "show", job_id)
    shown = json.loads(out)
    assert (shown["state"], shown["held"], shown["suspend_count"]) == ("SUSPENDED", False, 0)
    code, out, _ = run(capsys, "--endpoint", url, "cancel", job_id)
    assert code == 0 and out.strip() == f"{job_id}: CANCELED"


def test_quota_is_yours_and_another_users_is_forbidden(endpoint: dict[str, Any],
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Given no quota and no default (every level unlimited) and no admin role configured,
    When alice reads her quota and bob's,
    Then hers lists every level as unlimited; bob's is a 403 printed clearly, exit 2."""
    monkeypatch.setenv("USER", "alice")
    code, out, _ = run(capsys, "--endpoint", endpoint["url"], "quota")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "User: alice" and len(lines) == 9
    assert all(line.split()[1:] == ["unlimited", "unlimited", "0", "-"] for line in lines[2:])
    code, out, err = run(capsys, "--endpoint", endpoint["url"], "quota", "--user", "bob")
    assert code == 2 and out == ""
    assert err == ("gpujobs: error: HTTP 403: admin: only an admin role (none configured) may read the quota "
                   "of bob\n")
