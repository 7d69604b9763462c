"""Local mode engine: emulator, simulated ECS data plane, event bus, fault injection.

Dummy targets record events instead of the real handlers.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpu_recovery import clock as gr_clock
from gpu_recovery import constants as C
from gpu_recovery import event_patterns as patterns
from gpu_recovery.adapters import aws
from gpu_recovery.domain import started_by
from local_mode import events as ev
from local_mode.emulator import LocalAws
from local_mode.sim.api_errors import ATTEMPTS, INTERNAL, THROTTLING, UNAVAILABLE
from local_mode.world import build_world

EVENTS_DIR = Path(__file__).resolve().parents[1] / "events"

# Minimal documented samples (AWS developer guide), used when the shared files are absent.
DOC_TASK_DETAIL_KEYS = {
    "attachments", "availabilityZone", "clusterArn", "containers", "createdAt", "launchType",
    "cpu", "memory", "desiredStatus", "group", "lastStatus", "overrides", "startedAt",
    "updatedAt", "taskArn", "taskDefinitionArn", "version",
}  # fmt: skip
DOC_CI_DETAIL_KEYS = {
    "agentConnected", "attributes", "clusterArn", "containerInstanceArn", "ec2InstanceId",
    "registeredResources", "remainingResources", "status", "updatedAt", "version", "versionInfo",
}  # fmt: skip
ENVELOPE_KEYS = {"version", "id", "detail-type", "source", "account", "time", "region",
                 "resources", "detail"}  # fmt: skip
FARGATE_ONLY = {"connectivity", "connectivityAt", "pullStartedAt", "pullStoppedAt",
                "platformVersion"}  # fmt: skip
EC2_STOP_KEYS = {"containerInstanceArn", "startedBy", "stoppingAt", "stoppedAt", "stoppedReason",
                 "stopCode", "executionStoppedAt"}  # fmt: skip


def _doc(name: str) -> dict[str, Any] | None:
    path = EVENTS_DIR / name
    return json.loads(path.read_text()) if path.exists() else None


class Recorder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.contexts: list[Any] = []
        self.lock = threading.Lock()

    def __call__(self, event: dict[str, Any], context: Any) -> None:
        with self.lock:
            self.events.append(event)
            self.contexts.append(context)

    def details(self, **match: Any) -> list[dict[str, Any]]:
        return [
            e["detail"] for e in self.events if all(e["detail"].get(k) == v for k, v in match.items())
        ]


def _every_instance_event(cluster_arn: str) -> dict[str, Any]:
    """Every container-instance event of the cluster (the deployed rule takes only those of
    nodes the stack reboots)."""
    pattern = patterns.container_instance_pattern(cluster_arn)
    pattern["detail"].pop("attributes")
    return pattern


@pytest.fixture
def env():
    # The engine alone: recorders on the bus instead of the recovery Lambdas.
    with build_world(handlers=False, metrics_disabled=False) as world:
        local, bus, sim = world.aws, world.bus, world.ecs
        rec = {"task": Recorder(), "hc": Recorder(), "ci": Recorder()}
        # Every training task event (the deployed rule leaves PENDING and the like out).
        every_status = patterns.training_task_pattern(local.cluster_arn)
        every_status["detail"].pop("lastStatus")
        bus.add_rule("t", every_status, rec["task"], "task")
        bus.add_rule("h", patterns.health_check_task_pattern(local.cluster_arn), rec["hc"], "hc")
        bus.add_rule("i", _every_instance_event(local.cluster_arn), rec["ci"], "ci")
        yield local, bus, sim, rec


def _start_hc(local: LocalAws, node_arn: str) -> dict[str, Any]:
    return aws.client("ecs").start_task(
        cluster=local.cluster_name,
        taskDefinition=local.health_check_task_definition_arn,
        containerInstances=[node_arn],
        group=C.HEALTH_CHECK_GROUP,
        startedBy=started_by.HEALTH_CHECK,
    )


def test_task_events_have_the_documented_shape(env):
    """Given a started training rank, When it runs and then exits 1,
    Then PENDING/RUNNING/STOPPED events carry the documented envelope and detail keys,
    no tags, exitCode only once stopped, and a version that increments."""
    local, _, sim, rec = env
    sim.add_node("node-a")
    td = sim.register_training_task_definition("llama", gpus=8)
    (arn,) = sim.start_job("llama", td, ["node-a"])
    sim.inject_task_exit(arn, 1, after=60)
    sim.run_for(120)
    events = rec["task"].events
    assert [e["detail"]["lastStatus"] for e in events] == ["PENDING", "RUNNING", "STOPPED"]
    doc = _doc("aws_doc_ecs_task_state_change.json")
    doc_keys = set(doc["detail"]) - FARGATE_ONLY if doc else DOC_TASK_DETAIL_KEYS
    for e in events:
        assert set(e) == (set(doc) if doc else ENVELOPE_KEYS)
        assert e["source"] == "aws.ecs" and e["version"] == "0"
        assert e["resources"] == [arn] and e["time"].endswith("Z") and len(e["time"]) == 20
        keys = set(e["detail"])
        expected = doc_keys - ({"startedAt"} if e["detail"]["lastStatus"] == "PENDING" else set())
        assert expected <= keys, expected - keys
        assert keys <= doc_keys | EC2_STOP_KEYS | FARGATE_ONLY
        assert "tags" not in e["detail"]
    assert [e["detail"]["version"] for e in events] == [1, 2, 3]
    running, stopped = events[1]["detail"], events[2]["detail"]
    assert "exitCode" not in running["containers"][0]
    assert len(running["containers"][0]["gpuIds"]) == 8
    assert stopped["containers"][0]["exitCode"] == 1
    assert stopped["stopCode"] == "EssentialContainerExited"
    assert stopped["group"] == "family:llama" and stopped["launchType"] == "EC2"
    described = aws.client("ecs").describe_tasks(
        cluster=local.cluster_name, tasks=[arn], include=["TAGS"]
    )["tasks"][0]
    assert described["lastStatus"] == "STOPPED"
    assert described["containers"][0]["exitCode"] == 1
    assert {t["key"] for t in described["tags"]} >= {C.TAG_JOB_ID, C.TAG_RANK, C.TAG_WORLD_SIZE}


def test_container_instance_events_have_the_documented_shape(env):
    """Given a registered node, Then its registration event has the documented keys
    and GPU STRINGSET registered/remaining resources."""
    _, _, sim, rec = env
    node = sim.add_node("node-a", gpus=4)
    sim.run_for(1)
    (event,) = rec["ci"].events
    doc = _doc("aws_doc_ecs_container_instance_state_change.json")
    doc_keys = set(doc["detail"]) if doc else DOC_CI_DETAIL_KEYS
    assert set(event) == ENVELOPE_KEYS
    assert event["detail-type"] == "ECS Container Instance State Change"
    assert doc_keys <= set(event["detail"]) <= doc_keys | {"registeredAt", "accountType"}
    gpu = next(r for r in event["detail"]["registeredResources"] if r["name"] == "GPU")
    assert gpu["type"] == "STRINGSET" and gpu["stringSetValue"] == node.gpu_ids
    assert event["detail"]["status"] == "ACTIVE" and event["detail"]["agentConnected"] is True


def test_routing_by_the_deployed_patterns(env):
    """Given a training rank and a health check on two nodes, When both stop,
    Then training events reach only the task rule and only the HC STOPPED event
    reaches the HC rule; container-instance events reach only the instance rule."""
    local, _, sim, rec = env
    sim.add_node("node-a")
    b = sim.add_node("node-b")
    td = sim.register_training_task_definition("llama")
    (arn,) = sim.start_job("llama", td, ["node-a"])
    sim.inject_task_exit(arn, 0, after=30)
    assert not _start_hc(local, b.container_instance_arn)["failures"]
    sim.run_for(600)
    assert all(d["group"] == "family:llama" for d in rec["task"].details())
    assert [d["lastStatus"] for d in rec["hc"].details()] == ["STOPPED"]
    assert rec["hc"].details()[0]["group"] == C.HEALTH_CHECK_GROUP
    assert rec["hc"].details()[0]["containers"][0]["exitCode"] == 0
    assert all(e["detail-type"] == ev.CONTAINER_INSTANCE_DETAIL_TYPE for e in rec["ci"].events)


def test_gpu_placement_failure_and_accounting(env):
    """Given an 8-GPU node running an 8-GPU rank, When another task is started there,
    Then StartTask answers RESOURCE:GPU (HTTP 200, no task); When the rank is stopped,
    Then GPUs are free again only at STOPPED and a new start succeeds."""
    local, _, sim, _rec = env
    a = sim.add_node("node-a")
    td = sim.register_training_task_definition("llama")
    (arn,) = sim.start_job("llama", td, ["node-a"])
    resp = _start_hc(local, a.container_instance_arn)
    assert resp["tasks"] == []
    assert resp["failures"] == [{"arn": a.container_instance_arn, "reason": "RESOURCE:GPU"}]
    ecs = aws.client("ecs")
    ecs.stop_task(cluster=local.cluster_name, task=arn, reason="gpu-recovery: test")
    assert ecs.describe_tasks(cluster=local.cluster_name, tasks=[arn])["tasks"][0][
        "lastStatus"
    ] != "STOPPED"
    sim.run_for(5)
    assert len(a.free_gpu_ids) == 0  # still stopping
    sim.run_for(10)
    assert len(a.free_gpu_ids) == 8
    ci = ecs.describe_container_instances(
        cluster=local.cluster_name, containerInstances=[a.container_instance_arn]
    )["containerInstances"][0]
    remaining = next(r for r in ci["remainingResources"] if r["name"] == "GPU")
    assert len(remaining["stringSetValue"]) == 8
    assert _start_hc(local, a.container_instance_arn)["failures"] == []


def test_no_placement_on_disconnected_or_draining_instance(env):
    """Given a node whose agent is disconnected and one that is DRAINING,
    When a task is started on them, Then they fail with AGENT and RESOURCE:GPU, as ECS says."""
    local, _, sim, _ = env
    a, b = sim.add_node("node-a"), sim.add_node("node-b")
    sim.disconnect_agent("node-a", after=10, for_seconds=120)
    aws.client("ecs").update_container_instances_state(
        cluster=local.cluster_name, containerInstances=[b.container_instance_arn], status="DRAINING"
    )
    sim.run_for(20)
    for node, reason in ((a, "AGENT"), (b, "RESOURCE:GPU")):
        assert _start_hc(local, node.container_instance_arn)["failures"][0]["reason"] == reason
    sim.run_for(200)
    assert _start_hc(local, a.container_instance_arn)["failures"] == []


def test_stop_task_yields_user_initiated_stopped_event(env):
    """Given a running rank, When StopTask is called with a reason,
    Then a STOPPED event with stopCode UserInitiated and that reason follows later."""
    local, _, sim, rec = env
    sim.add_node("node-a")
    td = sim.register_training_task_definition("llama")
    (arn,) = sim.start_job("llama", td, ["node-a"])
    sim.run_for(30)
    aws.client("ecs").stop_task(cluster=local.cluster_name, task=arn, reason="gpu-recovery: stop")
    sim.run_for(60)
    stopped = rec["task"].details(lastStatus="STOPPED")
    assert len(stopped) == 1
    assert stopped[0]["stopCode"] == "UserInitiated"
    assert stopped[0]["stoppedReason"] == "gpu-recovery: stop"
    assert stopped[0]["desiredStatus"] == "STOPPED"
    stopping = [d for d in rec["task"].details(desiredStatus="STOPPED") if d["lastStatus"] != "STOPPED"]
    assert stopping, "a 'stopping' event precedes STOPPED"


@pytest.mark.parametrize("kind", ["ec2", "anywhere"])
def test_reboot_disconnects_then_reconnects(env, kind):
    """Given a node (EC2 or ECS Anywhere), When it is rebooted through EC2
    RebootInstances / SSM AWS-RunShellScript, Then a disconnected event and later a
    reconnected event are emitted, and its boot time moves past the request."""
    _, _, sim, rec = env
    node = sim.add_node("node-a", kind=kind)
    sim.run_for(60)
    requested = sim.now()
    if kind == "ec2":
        aws.client("ec2").reboot_instances(InstanceIds=[node.instance_id])
    else:
        assert node.instance_id.startswith("mi-") and len(node.instance_id) == 20
        aws.client("ssm").send_command(
            InstanceIds=[node.instance_id],
            DocumentName="AWS-RunShellScript",
            Parameters={"commands": ["sudo systemctl reboot"]},
        )
    sim.run_for(600)
    flags = [d["agentConnected"] for d in rec["ci"].details()]
    assert flags[-2:] == [False, True]
    assert node.boot_time > requested
    assert sim.counters["reboots"] == 1
    assert sim.counters["reboots_ec2" if kind == "ec2" else "reboots_ssm"] == 1


def test_reboot_fixable_heals_persistent_does_not(env):
    """Given a reboot-fixable and a persistently faulty node, When both are rebooted
    and health-checked, Then the first checks healthy (exit 0), the second exit 1."""
    local, _, sim, rec = env
    a = sim.add_node("node-a", health="reboot_fixable")
    b = sim.add_node("node-b", health="persistent_reboot")
    c = sim.add_node("node-c", health="replace")
    aws.client("ec2").reboot_instances(InstanceIds=[a.instance_id, b.instance_id, c.instance_id])
    sim.run_for(300)
    for n in (a, b, c):
        assert not _start_hc(local, n.container_instance_arn)["failures"]
    sim.run_for(300)
    codes = {d["containerInstanceArn"]: d["containers"][0]["exitCode"] for d in rec["hc"].details()}
    assert codes == {a.container_instance_arn: 0, b.container_instance_arn: 1,
                     c.container_instance_arn: 2}  # fmt: skip


def test_gpu_fault_with_nccl_cascade(env):
    """Given a 2-rank job, When a GPU fault is injected on node-b with nccl_cascade,
    Then rank 1 exits 1 at the fault and rank 0 exits 1 seconds later."""
    _, _, sim, rec = env
    sim.add_node("node-a"), sim.add_node("node-b")
    td = sim.register_training_task_definition("llama")
    sim.start_job("llama", td, ["node-a", "node-b"])
    sim.inject_gpu_fault("node-b", after=600, nccl_cascade=True)
    sim.run_for(700)
    stopped = rec["task"].details(lastStatus="STOPPED")
    assert [d["containers"][0]["exitCode"] for d in stopped] == [1, 1]
    assert stopped[0]["containerInstanceArn"] == sim.node("node-b").container_instance_arn
    assert sim.node("node-b").health == "reboot_fixable"
    assert any("GPU fault injected" in line for line in sim.format_timeline())


def test_transient_api_errors_are_retried_persistent_surface(env):
    """Given injected ECS/EC2 errors, When a transient fault (2-4 attempts) is armed,
    Then botocore's standard retries succeed without wall-clock sleeping;
    When a persistent fault is armed, Then a ClientError surfaces after 6 attempts
    (max_attempts=5 is read by botocore as retries)."""
    local, _, sim, _ = env
    node = sim.add_node("node-a")
    ecs = aws.client("ecs")
    local.faults.transient("ecs", "DescribeContainerInstances", failures=ATTEMPTS - 1, error=THROTTLING)
    resp = ecs.describe_container_instances(
        cluster=local.cluster_name, containerInstances=[node.container_instance_arn]
    )
    assert resp["ResponseMetadata"]["RetryAttempts"] == ATTEMPTS - 1 == 5
    # Each back-off botocore asked for was recorded instead of slept (no wall clock
    # here: a loaded CI machine makes any time bound flaky).
    assert len(local.retry_sleeps) == ATTEMPTS - 1
    assert all(delay > 0 for delay in local.retry_sleeps)
    local.faults.persistent("ec2", "RebootInstances", error=INTERNAL)
    with pytest.raises(ClientError) as err:
        aws.client("ec2").reboot_instances(InstanceIds=[node.instance_id])
    assert err.value.response["Error"]["Code"] == "InternalError"
    assert local.faults.count("ec2", "RebootInstances") == ATTEMPTS
    local.faults.clear()
    local.faults.inject("ssm", "SendCommand", count=ATTEMPTS, error=UNAVAILABLE)
    with pytest.raises(ClientError):
        aws.client("ssm").send_command(
            InstanceIds=[node.instance_id],
            DocumentName="AWS-RunShellScript",
            Parameters={"commands": ["reboot"]},
        )
    aws.client("ec2").reboot_instances(InstanceIds=[node.instance_id])
    assert sim.counters["reboots"] == 1  # only the call that succeeded


def test_duplicate_delivery_and_dead_letters(env):
    """Given duplicate delivery and a failing target, When an event is put,
    Then each matching target gets it twice with the same id and version, and the
    failure is logged as a dead letter without stopping other targets."""
    local, bus, sim, rec = env
    bus.duplicate_delivery = True

    def broken(event, context):
        raise RuntimeError("boom")

    bus.add_rule("broken", _every_instance_event(local.cluster_arn), broken)
    sim.add_node("node-a")
    sim.run_for(1)
    ids = [e["id"] for e in rec["ci"].events]
    assert len(ids) == 2 and ids[0] == ids[1]
    assert rec["ci"].events[0]["detail"]["version"] == rec["ci"].events[1]["detail"]["version"]
    assert len(bus.dead_letters) == 2 and bus.failures()[0].error == "RuntimeError: boom"
    ctx = rec["ci"].contexts[0]
    assert ctx.function_name == "ci" and ctx.get_remaining_time_in_millis() > 0
    assert ctx.invoked_function_arn.endswith(":function:ci")


def test_schedule_fires_every_simulated_minute_in_simulated_time(env, monkeypatch):
    """Given a 60 s schedule and the sim clock installed, When one simulated hour
    passes with a running job, Then it fires 60 Scheduled Events, handler code sees
    simulated time, and nothing sleeps on the wall clock."""
    _, bus, sim, _ = env
    sweeps = Recorder()
    bus.add_schedule("recovery-sweep", 60, sweeps, "sweep")
    sim.add_node("node-a"), sim.add_node("node-b")
    td = sim.register_training_task_definition("llama")
    sim.start_job("llama", td, ["node-a", "node-b"])
    real_sleeps: list[float] = []
    monkeypatch.setattr(time, "sleep", real_sleeps.append)
    sim.run_for(3600)
    assert sum(real_sleeps) == 0  # the simulated hour never waits on the wall clock
    assert len(sweeps.events) == 60
    first = sweeps.events[0]
    assert first["source"] == "aws.events" and first["detail-type"] == "Scheduled Event"
    assert first["resources"] == ["arn:aws:events:us-east-1:123456789012:rule/recovery-sweep"]
    assert first["time"] == "2026-11-20T14:01:00Z"
    assert gr_clock.now() == sim.clock.start + 3600


def test_notifications_are_read_back_from_sns(env):
    """Given the emulator, When a handler-style client publishes to the topic,
    Then notifications() returns subject, decoded message and attributes."""
    local, _, _, _ = env
    aws.client("sns").publish(
        TopicArn=local.topic_arn,
        Subject="Job llama recovered",
        Message=json.dumps({"job_id": "llama"}),
        MessageAttributes={"event_kind": {"DataType": "String", "StringValue": "recovered"}},
    )
    (n,) = local.notifications()
    assert n["subject"] == "Job llama recovered" and n["message"] == {"job_id": "llama"}
    assert n["attributes"] == {"event_kind": "recovered"}
    assert len(local.notifications()) == 1
    assert local.env[C.ENV_SUSPECT_EXIT_CODES] == "[1]"


def test_concurrent_starts_are_placed_atomically(env):
    """Given an 8-GPU node, When 12 threads each start a 1-GPU task at once,
    Then exactly 8 are placed with distinct GPU ids and 4 fail with RESOURCE:GPU."""
    local, _, sim, _ = env
    node = sim.add_node("node-a")
    td = sim.register_training_task_definition("small", gpus=1)
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def start() -> None:
        r = aws.client("ecs").start_task(
            cluster=local.cluster_name, taskDefinition=td,
            containerInstances=[node.container_instance_arn],
        )  # fmt: skip
        with lock:
            results.append(r)

    threads = [threading.Thread(target=start) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(len(r["tasks"]) for r in results) == 8
    assert sum(len(r["failures"]) for r in results) == 4
    ids = [g for t in sim.running_tasks("node-a") for g in t.gpu_ids]
    assert sorted(ids) == sorted(node.gpu_ids)


def test_environment_restored_on_exit():
    """Given a world (LocalAws and the simulated clock), When the context exits, Then env
    vars and the clock are restored."""
    import os

    before = os.environ.get(C.ENV_JOB_TABLE)
    with build_world(handlers=False, max_recovery_attempts=3, metrics_disabled=True) as world:
        assert os.environ[C.ENV_MAX_RECOVERY_ATTEMPTS] == "3"
        assert os.environ["POWERTOOLS_METRICS_DISABLED"] == "true"
        assert gr_clock.now() == world.ecs.clock.now()
    assert os.environ.get(C.ENV_JOB_TABLE) == before
    assert abs(gr_clock.now() - time.time()) < 5
