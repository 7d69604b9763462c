"""The answers AWS documents and moto never gives, as the simulation layer gives them
(``local_mode.sim.answers``, ``local_mode.sim.log_pages``; issue 40, 2c): GetLogEvents in
partial and empty pages with lines readable seconds after they were written, a transaction
cancelled for throttling, a BatchGetItem's unprocessed keys, ECS ``failures`` in a 200; each
a shape the crash campaigns break calls in (``CallFaults.arm(n, shape)``)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpu_recovery import clock
from gpu_recovery import constants as C
from gpu_recovery.adapters import aws
from gpu_recovery.adapters.ecs import EcsActionFailed, EcsAdapter
from gpu_recovery.adapters.queue import GangQueue
from gpu_recovery.repository import Repository
from gpu_recovery.repository.base import Update
from local_mode.emulator import LocalAws
from local_mode.sim import deployment as D
from local_mode.sim.answers import (
    BATCH_ENTRY_FAILED,
    CANCELLED_THROTTLED,
    ECS_FAILURES,
    EMPTY_LOG_PAGE,
    SHAPES,
    UNPROCESSED_KEYS,
)
from local_mode.sim.broken_calls import ALL_MODES, FAULT_MODES, modes_of
from local_mode.sim.log_pages import InvalidLogToken, LogPaging, log_page
from local_mode.world import build_world

EVENTS = [{"timestamp": 1_000 * i, "message": f"line {i}", "ingestedAt": float(i)} for i in range(7)]


def _read_all(paging: LogPaging, *, head: bool, now: float = 100.0,
              empty_every: int = 0) -> tuple[list[str], int]:
    """Every readable line, following the token until it comes back unchanged."""
    token, lines, calls = None, [], 0
    while True:
        calls += 1
        params: dict[str, Any] = {"startFromHead": head, **({"nextToken": token} if token else {})}
        page = log_page(EVENTS, params, now=now, paging=paging, nonce=calls,
                        empty=bool(empty_every and calls % empty_every == 0))
        got = [e["message"] for e in page["events"]]
        lines = lines + got if head else got + lines
        nxt = page["nextForwardToken" if head else "nextBackwardToken"]
        if nxt == token:
            return lines, calls
        token = nxt
        assert calls < 50


@pytest.mark.parametrize("head", [True, False], ids=["forward", "backward"])
def test_get_log_events_pages_partially_and_emptily_and_ends_on_the_unchanged_token(head: bool) -> None:
    everything = [f"line {i}" for i in range(7)]
    paging = LogPaging(page_events=2, empty_every=0, visible_after=0)
    assert _read_all(paging, head=head)[0] == everything
    lines, calls = _read_all(paging, head=head, empty_every=2)
    assert lines == everything and calls > 5  # empty pages in between, never taken for the end
    # Lines written less than visible_after ago are not readable yet.
    assert _read_all(LogPaging(page_events=3, visible_after=2.0), head=head, now=5.0)[0] == everything[:4]


def test_get_log_events_refuses_tokens_it_cannot_use() -> None:
    paging = LogPaging(page_events=2, visible_after=0)
    forward = log_page(EVENTS, {"startFromHead": True}, now=10, paging=paging)["nextForwardToken"]
    with pytest.raises(InvalidLogToken):  # a forward token goes with startFromHead true
        log_page(EVENTS, {"nextToken": forward}, now=10, paging=paging)
    with pytest.raises(InvalidLogToken):
        log_page(EVENTS, {"nextToken": "not-a-token", "startFromHead": True}, now=10, paging=paging)


def test_the_moto_world_answers_get_log_events_in_pages_with_late_lines() -> None:
    """A line the simulation writes at simulated time t (moto's CloudWatch Logs holds it) is
    readable through the handlers' client only ``visible_after`` later, in pages."""
    now = [float(int(time.time()))]  # CloudWatch Logs takes no line more than 2 h ahead
    with LocalAws(log_paging=LogPaging(page_events=2, empty_every=0, visible_after=3.0)) as local:
        clock.set_clock(lambda: now[0])
        internal = local.client("logs")
        internal.create_log_stream(logGroupName="/ecs/gpu-health-check", logStreamName="s")
        internal.put_log_events(logGroupName="/ecs/gpu-health-check", logStreamName="s",
                                logEvents=[{"timestamp": int(now[0] * 1000) + i, "message": f"m{i}"}
                                           for i in range(3)])
        logs = aws.client("logs")
        stream = {"logGroupName": "/ecs/gpu-health-check", "logStreamName": "s", "startFromHead": True}
        assert logs.get_log_events(**stream)["events"] == []
        now[0] += 3.0
        page = logs.get_log_events(**stream)
        assert [e["message"] for e in page["events"]] == ["m0", "m1"]
        with pytest.raises(logs.exceptions.ResourceNotFoundException):
            logs.get_log_events(logGroupName="/ecs/gpu-health-check", logStreamName="nope")


def test_every_shape_is_an_operations_and_a_mode_of_its_calls() -> None:
    assert set(SHAPES.values()) == {CANCELLED_THROTTLED, UNPROCESSED_KEYS, EMPTY_LOG_PAGE, ECS_FAILURES,
                                    BATCH_ENTRY_FAILED}
    assert modes_of("sqs", "SendMessageBatch") == (*FAULT_MODES, BATCH_ENTRY_FAILED)
    assert modes_of("dynamodb", "TransactWriteItems") == (*FAULT_MODES, CANCELLED_THROTTLED)
    assert modes_of("dynamodb", "GetItem") == FAULT_MODES
    assert modes_of("ecs", "UpdateContainerInstancesState") == (*FAULT_MODES, ECS_FAILURES)
    assert set(ALL_MODES) >= set(SHAPES.values())
    with pytest.raises(ValueError):
        LocalAws().call_faults.arm(1, "sideways")


def test_a_campaign_breaks_every_call_both_ways_and_each_call_site_once_in_its_shape() -> None:
    from local_mode.campaigns.runner import faults_at
    from local_mode.sim.broken_calls import LOST_RESPONSE, THROTTLE, ApiCall

    calls = [ApiCall(1, "dynamodb", "BatchGetItem", "recovery/sweep.py:run"),
             ApiCall(2, "dynamodb", "GetItem", "recovery/sweep.py:run"),
             ApiCall(3, "dynamodb", "BatchGetItem", "recovery/sweep.py:run"),  # the same site again
             ApiCall(4, "dynamodb", "BatchGetItem", "recovery/placement.py:refresh"),
             ApiCall(5, "dynamodb", "TransactWriteItems", "recovery/sweep.py:run")]
    assert faults_at(calls, [1, 2, 3, 4, 5]) == [
        (1, THROTTLE), (1, LOST_RESPONSE), (1, UNPROCESSED_KEYS),
        (2, THROTTLE), (2, LOST_RESPONSE),
        (3, THROTTLE), (3, LOST_RESPONSE),
        (4, THROTTLE), (4, LOST_RESPONSE), (4, UNPROCESSED_KEYS),
        (5, THROTTLE), (5, LOST_RESPONSE), (5, CANCELLED_THROTTLED)]
    assert faults_at(calls, [3], (UNPROCESSED_KEYS,)) == [(3, UNPROCESSED_KEYS)]  # asked for: given


@pytest.mark.parametrize("backend", ["moto", "memory"])
def test_dynamodb_calls_broken_in_their_shapes_on_either_backend(backend: str) -> None:
    """A transaction answered TransactionCanceledException [ThrottlingError, None] (nothing
    written) and a BatchGetItem leaving the later half of its keys unprocessed, answered
    alike on moto's DynamoDB and on the in-memory store; the repository gets through both."""
    now = [2_000_000_000.0]
    with LocalAws(dynamodb=backend) as local:
        clock.set_clock(lambda: now[0], lambda s: now.__setitem__(0, now[0] + s))
        repo = Repository(aws.resource("dynamodb"), local.job_table, local.instance_table)
        key = "job_id_rank"
        writes = [Update(local.job_table, {key: f"j#{i}"}, set_fields={"state": "RUNNING"}) for i in range(4)]
        local.call_faults.arm(1, CANCELLED_THROTTLED)
        assert repo.tables.db.transact(writes) is True
        assert [c.operation for c in local.call_faults.calls] == ["TransactWriteItems", "TransactWriteItems"]
        local.call_faults.arm(1, UNPROCESSED_KEYS)
        found = repo.tables.db.batch_get(local.job_table, [{key: f"j#{i}"} for i in range(4)])
        assert sorted(i[key] for i in found) == [f"j#{i}" for i in range(4)]
        assert [c.operation for c in local.call_faults.calls] == ["BatchGetItem", "BatchGetItem"]
        assert local.answers.given == [("dynamodb", "TransactWriteItems", CANCELLED_THROTTLED),
                                       ("dynamodb", "BatchGetItem", UNPROCESSED_KEYS)]


def test_ecs_calls_broken_in_their_shape_answer_failures_in_a_200() -> None:
    """StartTask places nothing on its last instance (RESOURCE:GPU), DescribeTasks and
    DescribeContainerInstances answer their last resource MISSING, UpdateContainerInstancesState
    changes nothing and answers MISSING: the adapter sees each (drain() is not confirmed)."""
    with build_world(handlers=False) as world:
        for name in ("node-a", "node-b"):
            world.ecs.add_node(name)
        td = world.ecs.register_training_task_definition("train", gpus=8)
        ecs = EcsAdapter(aws.client("ecs"), world.aws.cluster_name)
        arns = [world.ecs.node(n).container_instance_arn for n in ("node-a", "node-b")]
        faults = world.aws.call_faults
        faults.arm(1, ECS_FAILURES)
        started = ecs.start_task(task_definition=td, container_instance_arns=arns, started_by="t")
        assert list(started.placed) == [arns[0]]
        assert started.failures == [{"arn": arns[1], "reason": "RESOURCE:GPU"}]
        assert [t.node for t in world.ecs.running_tasks()] == ["node-a"]
        faults.arm(1, ECS_FAILURES)
        refused = ecs.start_task(task_definition=td, container_instance_arn=arns[1])
        assert refused.placement_failed and world.ecs.running_tasks("node-b") == []
        task = started.task_arns[0]
        faults.arm(1, ECS_FAILURES)
        assert ecs.describe_task(task) is None
        assert ecs.describe_task(task) is not None
        faults.arm(1, ECS_FAILURES)
        assert ecs.describe_container_instance(arns[1]) is None
        faults.arm(1, ECS_FAILURES)
        with pytest.raises(EcsActionFailed, match="MISSING"):
            ecs.drain(arns[1])
        assert ecs.describe_container_instance(arns[1])["status"] == "ACTIVE"
        assert ecs.drain(arns[1]) == "draining"
        assert [shape for *_, shape in world.aws.answers.given] == [ECS_FAILURES] * 5


def test_a_send_message_batch_broken_in_its_shape_sends_all_but_its_last_entry_and_says_so() -> None:
    """SendMessageBatch answered 200 with its last entry in ``Failed`` (SenderFault false):
    the others are on the queue, and the gang queue's adapter raises naming the code, so its
    caller sends the whole batch again (its consumers are idempotent)."""
    with build_world() as world:
        queue = world.bus.queues[D.GANG_QUEUE.name].queue
        gang = GangQueue(aws.client("sqs"), world.aws.env[C.ENV_GANG_QUEUE_URL])
        world.aws.call_faults.arm(1, BATCH_ENTRY_FAILED)
        with pytest.raises(RuntimeError, match=r"refused 1 message.*InternalError"):
            gang.send([{"batch": i} for i in range(3)])
        assert queue.sent == 2
        world.aws.call_faults.arm(1, BATCH_ENTRY_FAILED)
        with pytest.raises(RuntimeError, match="refused 1 message"):
            gang.send([{"batch": 9}])
        assert queue.sent == 2
        gang.send([{"batch": i} for i in range(3)])
        assert queue.sent == 5
        assert world.aws.answers.given == [("sqs", "SendMessageBatch", BATCH_ENTRY_FAILED)] * 2
