"""Each recovery handler's body (``handle(event, service, *, time_left, request_id)``) on its
own, and the two callers of it: the Lambda entry point (``lambda_handler``: runtime's service,
the context's time left and request id) and the scale simulator (the container's service, the
simulated time left and the invocation's request id). One body: what is checked here holds
for Lambda and for the simulators."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError

from gpu_recovery import clock, runtime
from gpu_recovery.recovery.ports import Invocation, Outcome
from local_mode.sim.lambda_context import LambdaContext

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "tests" / "events"
TASK_STOPPED = json.loads((EVENTS / "training_task_stopped_exit1.json").read_text())
HEALTH_CHECK_STOPPED = json.loads((EVENTS / "health_check_task_stopped.json").read_text())
INSTANCE_CHANGE = json.loads((EVENTS / "aws_doc_ecs_container_instance_state_change.json").read_text())
RECOVERY_HANDLERS = ("ecs_task_handler", "dcgm_task_monitor", "ecs_instance_monitor", "recovery_sweep",
                     "gang_worker", "tag_lookup_worker")
HEARTBEAT_HANDLERS = ("heartbeat_sweep",)


class Service:
    """The recovery service's entry points the handlers call: records each call; ``fail``
    makes a gang batch whose body has ``"fail": true`` raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.invocations: list[Any] = []
        self.brought_forward: list[list[str]] = []  # the message ids of each redeliver_soon

    def on_task_state_change(self, detail: Any) -> Outcome:
        self.calls.append(("task", detail.taskArn))
        return Outcome("registered", "job-1")

    def on_health_check_stopped(self, detail: Any, invocation: Any = None) -> Outcome:
        self.calls.append(("health_check", detail.taskArn))
        self.invocations.append(invocation)
        return Outcome("verdict", "job-1")

    def on_container_instance_change(self, detail: Any, time: Any) -> Outcome:
        self.calls.append(("instance", (detail.containerInstanceArn, time)))
        return Outcome("noted")

    def sweep(self, time_left: Any = None) -> Outcome:
        self.calls.append(("sweep", time_left() if time_left else None))
        return Outcome("swept")

    def redeliver_soon(self, records: list[dict[str, Any]]) -> int:
        self.brought_forward.append([record["messageId"] for record in records])
        return len(records)

    def on_gang_batch(self, body: dict[str, Any], *, receive_count: int, time_left: Any) -> Outcome:
        self.calls.append(("gang", (body["id"], receive_count, time_left() if time_left else None)))
        if body.get("fail"):
            raise RuntimeError("ThrottlingException")
        return Outcome("batch done")


def _sqs(*bodies: str) -> dict[str, Any]:
    return {"Records": [{"messageId": f"m{i}", "receiptHandle": f"r{i}", "body": body,
                         "attributes": {"ApproximateReceiveCount": "2"}, "messageAttributes": {},
                         "eventSource": "aws:sqs", "awsRegion": "us-east-1",
                         "eventSourceARN": "arn:aws:sqs:us-east-1:111122223333:gang-batches"}
                        for i, body in enumerate(bodies)]}


def _handle(name: str) -> Any:
    return importlib.import_module(f"handlers.{name}").handle


def test_event_bodies_parse_call_the_service_and_drop_malformed_events() -> None:
    service = Service()
    assert _handle("ecs_task_handler")(TASK_STOPPED, service) == {"action": "registered", "job_id": "job-1"}
    assert _handle("dcgm_task_monitor")(HEALTH_CHECK_STOPPED, service)["action"] == "verdict"
    assert _handle("ecs_instance_monitor")(INSTANCE_CHANGE, service)["action"] == "noted"
    assert [kind for kind, _ in service.calls] == ["task", "health_check", "instance"]
    assert service.calls[0][1] == TASK_STOPPED["detail"]["taskArn"]

    running = {**HEALTH_CHECK_STOPPED, "detail": {**HEALTH_CHECK_STOPPED["detail"], "lastStatus": "RUNNING"}}
    ignored = _handle("dcgm_task_monitor")(running, service)
    assert ignored == {"action": "ignored", "why": "lastStatus RUNNING"}
    for name in ("ecs_task_handler", "dcgm_task_monitor", "ecs_instance_monitor"):
        assert _handle(name)({"detail-type": "x", "detail": "not an object"}, service)["action"] == "dropped"
    assert len(service.calls) == 3  # neither the ignored nor the malformed events reached the service
    assert service.invocations == [None]  # no context: no verdict lease


def test_the_dcgm_body_gives_the_service_its_invocation() -> None:
    """Given the invocation's request id and time left
    When a health check's STOPPED event is handled
    Then the service gets them as the invocation (the verdict lease's holder and deadline)."""
    service = Service()
    clock.set_clock(lambda: 1_800_000_000.0)
    handle = _handle("dcgm_task_monitor")
    try:
        handle(HEALTH_CHECK_STOPPED, service, time_left=lambda: 42.0, request_id="req-1")
        handle(HEALTH_CHECK_STOPPED, service, time_left=lambda: 42.0)  # no request id: no invocation
    finally:
        clock.reset_clock()
    assert service.invocations == [Invocation("req-1", 1_800_000_042.0), None]

def test_the_sweeps_ignore_the_schedules_event_and_the_recovery_sweep_gets_the_time_left() -> None:
    service = Service()
    assert _handle("recovery_sweep")({"detail-type": "Scheduled Event"}, service,
                                     time_left=lambda: 12.5)["action"] == "swept"
    assert _handle("recovery_sweep")({}, service)["action"] == "swept"
    assert _handle("heartbeat_sweep")({}, service, time_left=lambda: 12.5)["action"] == "swept"
    assert service.calls == [("sweep", 12.5), ("sweep", None), ("sweep", None)]


def test_gang_worker_partial_batch_response_is_powertools() -> None:
    handle, service = _handle("gang_worker"), Service()
    batches = (json.dumps({"id": "a"}), "not json", json.dumps([1]), json.dumps({"id": "b", "fail": True}))
    out = handle(_sqs(*batches), service, time_left=lambda: 40.0)
    # Malformed messages are dropped (deleted: retrying cannot fix them); the failing one comes back.
    assert out == {"batchItemFailures": [{"itemIdentifier": "m3"}]}
    assert service.calls == [("gang", ("a", 2, 40.0)), ("gang", ("b", 2, 40.0))]
    assert service.brought_forward == [["m3"]]  # the failed one, asked back sooner
    # Every record failing fails the invocation, as Powertools' BatchProcessor does in Lambda
    # (each asked back sooner all the same).
    with pytest.raises(BatchProcessingError):
        handle(_sqs(json.dumps({"id": "c", "fail": True})), service)
    assert service.brought_forward == [["m3"], ["m0"]]


@pytest.mark.parametrize("name", RECOVERY_HANDLERS + HEARTBEAT_HANDLERS)
def test_lambda_handler_runs_the_body_with_runtimes_service_and_the_contexts_time_left(
        monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    module = importlib.import_module(f"handlers.{name}")
    service = Service()
    seen: list[tuple[Any, Any, float | None]] = []
    ids: list[Any] = []

    def body(event: dict[str, Any], given: Any, *, time_left: Any = None,
             request_id: Any = None) -> dict[str, Any]:
        seen.append((event, given, time_left() if time_left else None))
        ids.append(request_id)
        return {"action": "done"}

    factory = "heartbeat_service" if name in HEARTBEAT_HANDLERS else "recovery_service"
    monkeypatch.setattr(runtime, factory, lambda metrics=None: service)
    monkeypatch.setattr(module, "handle", body)
    event = {"id": "e-1", "Records": []}
    assert module.lambda_handler(event, LambdaContext(name, aws_request_id="req-7")) == {"action": "done"}
    [(given_event, given_service, time_left)] = seen
    assert given_event is event and given_service is service
    # The sweep and the gang worker budget their work by the invocation's time left.
    # The DCGM monitor holds its verdict's lease as the invocation (request id, deadline).
    if name in ("recovery_sweep", "gang_worker", "dcgm_task_monitor"):
        assert time_left is not None and 0 < time_left <= LambdaContext(name).timeout_seconds
    if name == "dcgm_task_monitor":
        assert ids == ["req-7"]


def test_the_scale_simulator_runs_the_handlers_bodies() -> None:
    from local_mode import scale_recovery as sr
    from local_mode.world import build_world

    assert {name: _handle(name) for name in RECOVERY_HANDLERS} == sr.HANDLES
    with build_world(backend="scale", seed=1, sweep_every_seconds=None, copies=1,
                     keep_invocations=True) as world:
        world.lambdas.invoke_async("ecs_task_handler", {"detail-type": "x", "detail": "not an object"})
        world.lambdas.invoke_async("recovery_sweep", {})
        world.sim.run(until=world.sim.now + 60)
        results = {i.function: i.result for i in world.lambdas.invocations}
    assert results["ecs_task_handler"] == {"action": "dropped",
                                           "why": "malformed ECS Task State Change event"}
    assert results["recovery_sweep"]["action"] == "swept"


#: The recovery service's event entry points: only the handlers' bodies call them.
ENTRY_POINTS = ("on_task_state_change", "on_health_check_stopped", "on_container_instance_change",
                "on_gang_batch", "on_tag_lookups")


def handler_bodies_repeated(source: str, path: str) -> list[str]:
    """``path:line what`` for each call of an entry point, or import of the ECS event models."""
    found = []
    for node in ast.walk(ast.parse(source, path)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ENTRY_POINTS):
            found.append(f"{path}:{node.lineno} .{node.func.attr}(")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpu_recovery.events"):
            found.append(f"{path}:{node.lineno} from {node.module} import")
    return found


def test_no_simulator_or_bench_repeats_a_handlers_body() -> None:
    """Given local_mode/ and bench/ (the simulators, the demo, the campaigns, the benches)
    When their calls into the recovery service's event entry points are listed
    Then there are none: they run the handlers (``lambda_handler``, or ``handle`` with a
    service of their own), which parse the events and call the service."""
    repeated = "service.on_gang_batch(body)\nfrom gpu_recovery.events.ecs import X\n"
    assert sorted(handler_bodies_repeated(repeated, "x.py")) == [
        "x.py:1 .on_gang_batch(", "x.py:2 from gpu_recovery.events.ecs import"]
    found = [hit for folder in ("local_mode", "bench") for path in sorted((ROOT / folder).rglob("*.py"))
             for hit in handler_bodies_repeated(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, f"run the handler's body (handlers.<name>.handle) instead: {found}"
