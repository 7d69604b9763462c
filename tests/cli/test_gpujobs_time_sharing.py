"""``gpujobs suspend|resume|quota`` and the AUTO priority against the REAL local API server
(the jobs API's handlers behind ``LocalApiServer``), the real scheduler tick and the recovery
handlers on the emulator (moto + simulated ECS): nothing between the CLI and DynamoDB is faked.

Local mode takes the caller from ``X-Local-User`` (``$USER`` for the CLI); ``admin`` is the
admin role here (``JOBS_ADMIN_ROLES``). The deployment's default quota is HIGH = 2 nodes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from cli import gpujobs
from cli.gpujobs.render import fmt_time
from gpu_recovery import constants as C
from gpu_recovery import runtime
from gpu_recovery.constants import JobState
from tests.fixtures.queue_cluster import QueueCluster, make_queue_cluster


@dataclass
class Stack:
    url: str
    tc: QueueCluster
    td: str  # family:revision of the training task definition


@pytest.fixture
def stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    """Two 8-GPU nodes, the jobs API on 127.0.0.1, admins = the local user "admin"."""
    from handlers import jobs_api
    from local_mode.server import LocalApi, LocalApiServer

    monkeypatch.setenv(C.ENV_JOBS_ADMIN_ROLES, "admin")
    monkeypatch.setenv(C.ENV_DEFAULT_NODE_QUOTAS, json.dumps({"HIGH": 2}))
    monkeypatch.delenv(gpujobs.ENDPOINT_ENV, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    jobs_api.reset()
    try:
        with contextmanager(make_queue_cluster)(nodes=[8, 8]) as tc, LocalApiServer(LocalApi()) as server:
            yield Stack(server.url, tc, tc.train_td.rsplit("/", 1)[-1])
    finally:
        jobs_api.reset()


@pytest.fixture
def as_user(stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """``as_user("alice", "quota")`` -> (exit code, stdout, stderr) of gpujobs run as alice."""

    def run(user: str, *argv: str) -> tuple[int, str, str]:
        monkeypatch.setenv("USER", user)
        code = gpujobs.main(["--endpoint", stack.url, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def quota_rows(out: str) -> dict[str, list[str]]:
    """The `gpujobs quota` table -> {level: [limit, source, in use, room]}."""
    lines = out.splitlines()
    assert lines[1].split() == ["PRIORITY", "LIMIT", "SOURCE", "IN", "USE", "ROOM"]
    return {line.split()[0]: line.split()[1:] for line in lines[2:]}


def test_quotas_set_by_an_admin_drive_auto_and_are_refused_to_others(stack: Stack, as_user: Any) -> None:
    """Given the deployment's default HIGH = 2 nodes and an admin role "admin",
    When alice reads her quota, tries to set one and to read bob's, the admin sets hers
    (PUT /v1/quotas), she submits with priority AUTO, and the admin removes a quota,
    Then alice sees every level with its source; her PUT and her read of bob's are 403s
    printed as such (exit 2); AUTO picks the highest level where her quota has room; a job
    larger than her quota at its level is refused naming nnodes; the removal brings back
    the default."""
    code, out, err = as_user("alice", "quota")
    assert code == 0, err
    assert out.splitlines()[0] == "User: alice"
    rows = quota_rows(out)
    assert rows["HIGH"] == ["2", "default", "0", "2"]
    assert rows["NORMAL"] == ["unlimited", "unlimited", "0", "-"]

    alice = gpujobs.ApiClient(stack.url, local_user="alice")
    with pytest.raises(gpujobs.ApiError) as refused:
        alice.request("PUT", "/quotas", body={"user": "alice", "priority": "HIGH", "max_nodes": 64})
    assert refused.value.status == 403 and "only an admin role" in refused.value.message
    code, _, err = as_user("alice", "quota", "--user", "bob")
    assert code == 2
    assert err.startswith("gpujobs: error: HTTP 403: admin: only an admin role (admin) may read the quota "
                          "of bob")
    code, _, err = as_user("alice", "quota", "--all")
    assert code == 2 and "HTTP 403" in err and "list every user's quota" in err

    admin = gpujobs.ApiClient(stack.url, local_user="admin")
    row = admin.request("PUT", "/quotas", body={"user": "alice", "priority": "HIGH", "max_nodes": 0})
    assert (row["user"], row["max_nodes"], row["source"]) == ("alice", 0, "set")
    admin.request("PUT", "/quotas", body={"user": "alice", "priority": "ABOVE_NORMAL", "max_nodes": 2})
    code, out, _ = as_user("admin", "quota", "--user", "alice")
    assert code == 0 and out.splitlines()[0] == "User: alice"
    rows = quota_rows(out)
    assert rows["HIGH"] == ["0", "set", "0", "0"] and rows["ABOVE_NORMAL"] == ["2", "set", "0", "2"]
    code, out, _ = as_user("admin", "--json", "quota", "--all")
    assert code == 0
    assert sorted((r["user"], r["priority_name"]) for r in json.loads(out)["quotas"]) == [
        ("alice", "ABOVE_NORMAL"), ("alice", "HIGH")]

    code, out, err = as_user("alice", "submit", "--name", "auto", "--task-definition", stack.td,
                             "--nnodes", "2", "--gpus-per-node", "8", "--priority", "AUTO")
    assert code == 0, err
    job_id = out.strip()
    code, out, _ = as_user("alice", "show", job_id)
    assert code == 0
    assert "Priority:   ABOVE_NORMAL (20), chosen by AUTO at submit" in out
    assert "Quota user: alice" in out
    code, _, err = as_user("alice", "submit", "--name", "big", "--task-definition", stack.td,
                           "--nnodes", "1", "--gpus-per-node", "8", "--priority", "HIGH")
    assert code == 2
    assert "HTTP 400: nnodes: the job could never start: alice may hold at most 0 node(s) at HIGH" in err
    assert "(field: nnodes)" in err

    removed = admin.request("DELETE", "/quotas", query={"user": "alice", "priority": "HIGH"})
    assert removed["removed"] is True and (removed["max_nodes"], removed["source"]) == (2, "default")
    code, out, _ = as_user("alice", "quota")
    assert quota_rows(out)["HIGH"] == ["2", "default", "0", "2"]


def test_suspend_a_running_job_then_resume_it(stack: Stack, as_user: Any) -> None:
    """Given alice's 1-node job RUNNING (started by the scheduler tick),
    When she runs `gpujobs suspend`, rank 0 calls go_suspend(), and later `gpujobs resume`,
    Then suspend prints SUSPENDING with the forced-stop deadline (her 30 s grace) and the hold;
    show has the held SUSPENDED state and the suspension; the scheduler leaves a held job
    alone; resume queues it again, the next tick restarts it at attempt 2 and show counts
    one suspend and one resume; resuming a running job is a 409 (exit 2) with the reason."""
    tc = stack.tc
    code, out, err = as_user("alice", "submit", "--name", "train", "--task-definition", stack.td,
                             "--nnodes", "1", "--gpus-per-node", "8", "--priority", "LOW",
                             "--suspend-grace", "30")
    assert code == 0, err
    job_id = out.strip()
    assert tc.scheduler().tick().admitted == [job_id]
    tc.sim.run_for(30)
    assert tc.state(job_id) is JobState.RUNNING

    code, out, err = as_user("alice", "suspend", job_id)
    assert code == 0, err
    deadline = fmt_time(tc.item(job_id)["suspend"]["deadline_at"])
    assert out.strip() == (f"{job_id}: SUSPENDING (rank 0 is told to checkpoint and call go_suspend(); "
                           f"ranks stopped by {deadline} at the latest; "
                           f"held until `gpujobs resume {job_id}`)")
    code, out, _ = as_user("alice", "--json", "show", job_id)
    shown = json.loads(out)
    assert shown["state"] == "SUSPENDING" and shown["suspend"]["kind"] == "user"
    assert shown["suspend"]["grace_seconds"] == 30 and shown["suspend_grace_seconds"] == 30

    runtime.job_control_service().go_suspend(job_id, 0, int(tc.item(job_id)["attempt"]))
    tc.sim.run_for(30)
    assert tc.state(job_id) is JobState.SUSPENDED
    code, out, _ = as_user("alice", "show", job_id)
    assert "State:      SUSPENDED, held until resumed" in out
    assert "Suspended:  1 time(s), resumed 0" in out
    assert "\nSuspension:\n  Kind:      user (by user alice)\n" in out
    assert f"  Held:      yes: waits for `gpujobs resume {job_id}`" in out
    assert tc.scheduler().tick().admitted == []  # held: the scheduler does not resume it

    code, out, err = as_user("alice", "resume", job_id)
    assert code == 0, err
    assert out.strip() == (f"{job_id}: SUSPENDED (queued at its original position: it starts when nodes "
                           "are free)")
    assert tc.scheduler().tick().admitted == [job_id]
    tc.sim.run_for(30)
    code, out, _ = as_user("alice", "--json", "show", job_id)
    shown = json.loads(out)
    assert (shown["state"], shown["attempt"], shown["resume_count"], shown["held"]) == (
        "RUNNING", 2, 1, False)
    code, out, _ = as_user("alice", "show", job_id)
    assert "Suspended:  1 time(s), resumed 1" in out and "\nLast suspension:\n" in out

    code, _, err = as_user("alice", "resume", job_id)
    assert code == 2
    assert f"HTTP 409: job {job_id} is RUNNING: only a suspended job can be resumed" in err
    code, out, _ = as_user("alice", "events", job_id)
    transitions = [line.split()[1:3] for line in out.splitlines()[1:]]
    assert ["RUNNING", "SUSPENDING"] in transitions and ["SUSPENDING", "SUSPENDED"] in transitions
    assert ["SUSPENDED", "STARTING"] in transitions


def test_another_users_job_cannot_be_suspended(stack: Stack, as_user: Any) -> None:
    """Given alice's queued job,
    When bob suspends it, then the admin does,
    Then bob gets a 403 (exit 2, the ownership rule named) and the admin's suspend holds it."""
    code, out, _ = as_user("alice", "submit", "--name", "mine", "--task-definition", stack.td,
                           "--nnodes", "1", "--gpus-per-node", "8")
    job_id = out.strip()
    code, _, err = as_user("bob", "suspend", job_id)
    assert code == 2 and "HTTP 403: ownership" in err
    code, out, _ = as_user("admin", "suspend", job_id)
    assert code == 0 and out.startswith(f"{job_id}: SUSPENDED (held until")
