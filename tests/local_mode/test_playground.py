"""``make playground``, as a user drives it: the playground in its own process, the CLIs
(``gpujobs``, ``gpu-recovery-admin``) against the endpoints it prints.

One playground per test module (``python -m local_mode.playground``, ephemeral ports, a
clock 40x real time, 4 nodes, jobs of 2 simulated minutes): a job is submitted from
``examples/job.yaml``, followed until RUNNING, hit by XID 79 through ``gpu-recovery-admin
fault``, watched through its recovery (reboot without the DCGM diag, gang restart as
attempt 2) to COMPLETE; its logs come from the emulated CloudWatch Logs, the playground's
console shows the operators' e-mail, and the admin commands reach the emulator's tables
through ``AWS_ENDPOINT_URL``. The preemption examples run as they are. A second playground
of 17 nodes restarts a 17-rank job through the gang queue and its worker.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli import admin, gpujobs
from tests.fixtures.playground import PlaygroundProcess

REPO = Path(__file__).resolve().parents[2]
WAIT_SECONDS = 120  # any one step, in wall time (each takes a few seconds at 40x)


# The module's scenario is its fixture, run once per worker that takes a test: one
# xdist group (make test runs --dist loadgroup) runs it once.
pytestmark = pytest.mark.xdist_group("playground")


@pytest.fixture(scope="module")
def playground() -> Iterator[PlaygroundProcess]:
    process = PlaygroundProcess("--speed", "40", "--run-minutes", "2", "--reboot-seconds", "60")
    try:
        process.exports()
        yield process
    finally:
        code = process.stop()
        assert code == 0, process.console[-3000:]
        assert "playground stopped" in process.console


@pytest.fixture
def shell(playground: PlaygroundProcess, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This test's environment = a shell where the user pasted the printed exports."""
    exports = playground.exports()
    for name, value in exports.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("NO_COLOR", "1")
    return exports


def cli(capsys: pytest.CaptureFixture[str], main: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def show(capsys: pytest.CaptureFixture[str], job_id: str) -> dict[str, Any]:
    code, out, err = cli(capsys, gpujobs.main, "--json", "show", job_id)
    assert code == 0, err
    return dict(json.loads(out))


def wait_for_state(capsys: pytest.CaptureFixture[str], job_id: str, state: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        job = show(capsys, job_id)
        if job["state"] == state:
            return job
        assert job["state"] not in ("FAILED", "CANCELED"), job
        time.sleep(0.1)
    raise AssertionError(f"{job_id} never {state}: {job}")


def wait_for_console(playground: PlaygroundProcess, *texts: str) -> None:
    """Every one of ``texts`` on the console. The console is printed by the playground's
    driver a few times a second, after the fact: a line may come later than the state it
    tells of (a job read COMPLETE through the API before its line is printed)."""
    deadline = time.monotonic() + WAIT_SECONDS
    for text in texts:
        while text not in playground.console:
            tail = playground.console[-3000:]
            assert time.monotonic() < deadline, f"{text!r} never on the console:\n{tail}"
            time.sleep(0.1)


def wait_for_logs(capsys: pytest.CaptureFixture[str], job_id: str, *texts: str) -> str:
    """``gpujobs logs`` once it shows every one of ``texts``. A rank's program writes its
    last lines at its next step after its task stopped, which may come after the job is
    COMPLETE."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        code, out, err = cli(capsys, gpujobs.main, "logs", job_id)
        assert code == 0, err
        missing = [text for text in texts if text not in out]
        if not missing:
            return out
        assert time.monotonic() < deadline, f"{missing} never in the logs of {job_id}:\n{out[-3000:]}"
        time.sleep(0.1)


def test_a_job_hit_by_xid_79_recovers_and_completes(playground: PlaygroundProcess, shell: dict[str, str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Given the playground and a shell with its exports,
    When a user submits examples/job.yaml, waits for RUNNING, injects XID 79 on rank 1's
    node with gpu-recovery-admin and watches the job,
    Then the node is rebooted without the diag, the gang restarts as attempt 2, the job
    completes (watch exits 0 showing why at each step), its logs are in CloudWatch Logs, the
    operators' e-mail is on the console, and the breaker counted the reboot."""
    code, out, err = cli(capsys, gpujobs.main, "submit", "-f", str(REPO / "examples" / "job.yaml"))
    assert code == 0, err
    job_id = out.strip()
    running = wait_for_state(capsys, job_id, "RUNNING")
    assert running["attempt"] == 1

    code, out, err = cli(capsys, admin.main, "inject-fault", "xid", "79", "--job", job_id, "--rank", "1")
    assert code == 0, err
    injected = json.loads(out)
    assert injected["kind"] == "xid" and "XID 79" in injected["detail"]

    code, out, err = cli(capsys, gpujobs.main, "watch", job_id, "--interval", "0.2")
    assert code == 0, err + out
    assert "-> COMPLETE" in out and "attempt=2" in out
    assert "PENDING_HEALTHCHECK: rank 1 exited 1" in out and "xid-79" in out  # why, from the history
    assert "STARTING: gang restart, attempt 2" in out

    job = show(capsys, job_id)
    assert (job["state"], job["attempt"], job["recoveries_used"]) == ("COMPLETE", 2, 1)
    wait_for_logs(capsys, job_id, "attempt 2", "training complete")

    wait_for_console(playground, "Subject: [GPU recovery] Job recovered and restarted",
                     "reboot requested via EC2 RebootInstances", f"{job_id} -> COMPLETE: every rank exited 0")

    code, out, err = cli(capsys, admin.main, "breaker", "show", "--json")
    assert code == 0, err
    breaker = json.loads(out)  # it acted once (its window is counted on this machine's clock)
    assert (breaker["state"], breaker["limit"], breaker["trips"]) == ("closed", 1, 0)


def test_admin_commands_reach_the_playground(playground: PlaygroundProcess, shell: dict[str, str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Given the playground, When an admin sets a quota (DynamoDB through AWS_ENDPOINT_URL),
    lists the nodes and aims faults at nothing, Then gpujobs quota shows the quota, the
    nodes are listed, and the bad faults are refused naming what is wrong."""
    code, _, err = cli(capsys, admin.main, "quota", "set", "--user", "alice", "--priority", "HIGH",
                       "--nodes", "4")
    assert code == 0, err
    code, out, err = cli(capsys, gpujobs.main, "--json", "quota")
    assert code == 0, err
    high = next(r for r in json.loads(out)["quotas"] if r["priority_name"] == "HIGH")
    assert (high["max_nodes"], high["source"]) == (4, "set")

    code, out, err = cli(capsys, admin.main, "inject-fault", "nodes")
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()] == ["NODE", "node-1", "node-2", "node-3", "node-4"]

    code, _, err = cli(capsys, admin.main, "inject-fault", "xid", "79", "--node", "node-9")
    assert code == 2 and "no node node-9" in err
    code, _, err = cli(capsys, admin.main, "inject-fault", "xid", "79", "--node", "node-1", "--gpu", "8")
    assert code == 2 and "gpu: 0..7" in err
    code, _, err = cli(capsys, admin.main, "inject-fault", "app-error", "--job", "nope-20261120-000000-0000")
    assert code == 2 and "job nope-20261120-000000-0000 not found" in err


def test_doctor_reads_the_playground_as_a_deployed_stack(playground: PlaygroundProcess, shell: dict[str, str],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Given the playground's exports (the stack's outputs file among them), When the operator
    runs gpu-recovery-admin doctor, Then every check runs against the emulated account and
    passes: the cluster, its tagged GPU nodes and their tokens, the health check, the topic,
    every rule with its empty dead-letter queue, the gang queue, PITR, the breaker."""
    code, out, err = cli(capsys, admin.main, "doctor")
    assert code == 0, out + err
    checks = [line.split()[0] for line in out.splitlines()[1:-1]
              if line[:4] in ("PASS", "WARN", "FAIL", "SKIP")]
    assert set(checks) == {"PASS"} and len(checks) >= 15, out
    assert "passed, 0 warnings, 0 failed" in out.splitlines()[-1]


def test_doctor_against_an_emulator_without_the_outputs_says_so_in_one_line(
        playground: PlaygroundProcess, shell: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An AWS_ENDPOINT_URL that answers no CloudFormation (the playground's, without its
    outputs file): one line saying what to give instead, not an HTML 500 page."""
    monkeypatch.delenv("GPU_RECOVERY_OUTPUTS_FILE")
    code, out, err = cli(capsys, admin.main, "doctor")
    assert code == 2 and err == ""
    endpoint = shell["AWS_ENDPOINT_URL"]
    assert out.splitlines() == [f"doctor: AWS_ENDPOINT_URL={endpoint} answers no CloudFormation: give the "
                                "stack's outputs with --outputs-file or $GPU_RECOVERY_OUTPUTS_FILE (make "
                                "playground exports it)"]


# Slow tier: preemption with a graceful suspend and a resume from the checkpoint runs in
# make test through tests/time_sharing/test_preemption_flow.py.
@pytest.mark.slow
def test_a_high_job_preempts_the_low_example(playground: PlaygroundProcess, shell: dict[str, str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Given the playground's 4 nodes, When the LOW example (4 nodes) runs and the HIGH
    example is submitted, Then the LOW job is suspended gracefully (its rank 0 told through
    the real training client), the HIGH job runs, and the LOW job resumes from its
    checkpoint and completes."""
    examples = REPO / "examples"
    # 6 simulated minutes, not the playground's 2: the HIGH job comes before the LOW one
    # ends, however slow this machine answers (at 40x, 1 s of wall time is 40 s of training).
    code, out, err = cli(capsys, gpujobs.main, "submit", "-f", str(examples / "preemptible-low.yaml"),
                         "--env", "PLAYGROUND_RUN_MINUTES=6")
    assert code == 0, err
    low = out.strip()
    wait_for_state(capsys, low, "RUNNING")
    deadline = time.monotonic() + WAIT_SECONDS
    while "step 30/180" not in cli(capsys, gpujobs.main, "logs", low)[1]:  # a minute of work done
        assert time.monotonic() < deadline, "the LOW job makes no progress"
        time.sleep(0.1)
    code, out, err = cli(capsys, gpujobs.main, "submit", "-f", str(examples / "urgent-high.yaml"))
    assert code == 0, err
    high = out.strip()
    code, out, err = cli(capsys, gpujobs.main, "watch", low, "--interval", "0.2")
    assert code == 0, err + out
    assert "suspend=preempted" in out and f"by={high}" in out, playground.console[-6000:]
    assert "rank 0 called go_suspend()" in out  # graceful: the program checkpointed and asked
    job = show(capsys, low)
    assert (job["state"], job["suspend_count"], job["resume_count"], job["recoveries_used"]) == \
        ("COMPLETE", 1, 1, 0)
    assert wait_for_state(capsys, high, "COMPLETE")["attempt"] == 1
    wait_for_logs(capsys, low, "RESUME_COUNT=1", "resuming from the checkpoint at step")


# Slow tier: the gang queue and its worker are tested without the playground in
# tests/recovery/test_fanout.py and tests/local_mode/test_scale_sim.py (64 ranks).
@pytest.mark.slow
def test_a_large_gang_is_stopped_and_restarted_through_the_gang_queue(capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a playground of 17 nodes, When a 17-rank job (more than the 16 stopped and
    started inline) is hit by XID 79, Then its gang is stopped and restarted in batches
    sent to the gang queue and run by the gang worker (the console shows each batch), and
    the job recovers and completes."""
    process = PlaygroundProcess("--nodes", "17", "--gpus", "1", "--speed", "40", "--run-minutes", "1",
                                "--reboot-seconds", "45", "--once")  # 17 nodes: spare the CPU
    try:
        for name, value in process.exports().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("USER", "alice")
        code, out, err = cli(capsys, gpujobs.main, "submit", "-f", str(REPO / "examples" / "job.yaml"),
                             "--name", "wide", "--nnodes", "17", "--gpus-per-node", "1")
        assert code == 0, err
        job_id = out.strip()
        wait_for_state(capsys, job_id, "RUNNING")
        code, _, err = cli(capsys, admin.main, "inject-fault", "xid", "79", "--job", job_id, "--rank", "16")
        assert code == 0, err
        code, out, err = cli(capsys, gpujobs.main, "watch", job_id, "--interval", "0.2")
        assert code == 0 and "-> COMPLETE" in out, err + out
        assert show(capsys, job_id)["attempt"] == 2
        wait_for_console(process, f"gang      worker: stop ranks 0..16 of job {job_id} (attempt 1)",
                         f"gang      worker: start ranks 0..16 of job {job_id} (attempt 2)")
        problems = [line for line in process.lines if "!!" in line and "cannot keep up" not in line]
        assert not problems, problems  # no failed delivery, dead letter or driver error
    finally:
        assert process.stop() == 0, process.console[-3000:]


def test_fault_injection_refuses_an_endpoint_not_on_this_machine(capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployed API never gets a fault request: the command refuses before sending one."""
    monkeypatch.setenv("GPUJOBS_ENDPOINT", "https://abc123.execute-api.us-east-1.amazonaws.com/v1")
    code, out, err = cli(capsys, admin.main, "inject-fault", "xid", "79", "--node", "node-1")
    assert (code, out) == (2, "")
    assert "for the local playground only" in err and "abc123.execute-api" in err
    monkeypatch.delenv("GPUJOBS_ENDPOINT")
    code, _, err = cli(capsys, admin.main, "inject-fault", "nodes")
    assert code == 2 and "no endpoint" in err


def test_the_local_route_refuses_bad_requests_naming_the_field(playground: PlaygroundProcess,
                                                               shell: dict[str, str]) -> None:
    """Given the playground, When POST /local/faults gets an unknown kind, bad JSON or no
    target, Then 400 with the field; an unknown local route is a 404 listing the routes;
    the deployed routes are untouched (an undefined one is still API Gateway's 403)."""
    from cli.inject_fault import FaultError, request

    base = shell["GPUJOBS_ENDPOINT"]
    for body, field in (({"kind": "meteor", "node": "node-1"}, "kind"), ({"kind": "xid"}, "node"),
                        ({"kind": "xid", "node": "node-1", "xid": "seventy-nine"}, "xid")):
        with pytest.raises(FaultError, match=rf"HTTP 400: .*\(field: {field}\)"):
            request(base, "POST", "/local/faults", body)
    with pytest.raises(FaultError, match="HTTP 404: no local route DELETE /local/nodes"):
        request(base, "DELETE", "/local/nodes")
    with pytest.raises(FaultError, match="runs no playground"):
        request(base, "POST", "/v1/faults", {})
    assert request(base, "GET", "/local")["nodes"] == 4


def test_playground_settings_are_checked() -> None:
    from local_mode.playground import PlaygroundConfig

    with pytest.raises(ValueError, match="--speed: 0 is not above 0"):
        PlaygroundConfig(speed=0).validate()
    with pytest.raises(ValueError, match=r"--gpus: 32 is not 1\.\.16"):
        PlaygroundConfig(gpus_per_node=32).validate()
    with pytest.raises(ValueError, match=r"--reboot-seconds: 10 is not 45\.\.3600"):
        PlaygroundConfig(reboot_seconds=10).validate()  # back before its agent was seen going down
    with pytest.raises(ValueError, match="--port and --aws-port must differ"):
        PlaygroundConfig(port=9000, aws_port=9000).validate()


def test_the_examples_task_definitions_are_registered_up_to_their_revision(tmp_path: Path) -> None:
    from local_mode.playground import example_task_definitions

    (tmp_path / "a.yaml").write_text("task_definition: llama-train:3\n")
    (tmp_path / "b.yml").write_text("task_definition: arn:aws:ecs:us-east-1:1:task-definition/llama-train:5")
    (tmp_path / "c.yaml").write_text("task_definition: vit\n")
    (tmp_path / "d.yaml").write_text("name: no task definition\n")
    (tmp_path / "e.yaml").write_text(": not yaml : [\n")
    assert example_task_definitions(tmp_path) == {"llama-train": 5, "vit": 1}
    assert example_task_definitions(REPO / "examples") == {"llama-train": 3}


def test_fault_requests_from_the_command_line() -> None:
    from cli.inject_fault import fault_body, local_endpoint

    parser = admin.build_parser()
    args = parser.parse_args(["inject-fault", "xid", "48", "--job", "j-1", "--rank", "1", "--gpu", "3",
                              "--persistent"])
    assert fault_body(args) == {"kind": "xid", "job_id": "j-1", "rank": 1, "xid": 48, "gpu": 3,
                                "persistent": True}
    args = parser.parse_args(["inject-fault", "lost-node", "--node", "node-2", "--seconds", "600"])
    assert fault_body(args) == {"kind": "lost_node", "node": "node-2", "seconds": 600.0}
    # The driver's warnings (issue 44).
    args = parser.parse_args(["inject-fault", "recovery-action", "reset", "--node", "node-2"])
    assert fault_body(args) == {"kind": "recovery_action", "node": "node-2", "gpu": 0, "action": "reset"}
    args = parser.parse_args(["inject-fault", "remap-pending", "--job", "j-1", "--rank", "1"])
    assert fault_body(args) == {"kind": "remap_pending", "job_id": "j-1", "rank": 1, "gpu": 0}
    args = parser.parse_args(["inject-fault", "rising-counter", "nvlink_replay_errors", "--node", "node-3",
                              "--per-hour", "900"])
    assert fault_body(args) == {"kind": "rising_counter", "node": "node-3", "gpu": 0,
                                "counter": "nvlink_replay_errors", "per_hour": 900.0}
    assert local_endpoint("http://localhost:8080/v1") == "http://localhost:8080"
    assert local_endpoint("http://[::1]:8080") == "http://[::1]:8080"


def test_the_old_fault_command_still_injects_but_says_it_is_deprecated(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`fault` (one letter from `faults`, which reads a job's analysis) is `inject-fault`'s
    old name: it still runs the injection (here refused: the endpoint is not local) and warns."""
    code = admin.main(["fault", "--endpoint", "https://jobs.example.com", "nodes"])
    err = capsys.readouterr().err
    assert code == 2 and "not on this machine" in err
    assert "`gpu-recovery-admin fault` is deprecated; use `gpu-recovery-admin inject-fault`" in err
