"""The one event bus (``local_mode.sim.bus``): the retry policy and the partial batch semantics
both worlds share, its in-process delivery (the moto world's queues: batch size, partial
failures, visibility timeout, max receives) and its delivery timed on the engine (the scale
world's copies and schedules through Lambda)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from local_mode.events import scheduled_event
from local_mode.scale_recovery import ScaleWorld
from local_mode.sim.bus import async_retry_delay, crush_object_arrays, failed_message_ids, flattened
from local_mode.sim.deployment import RECOVERY_RETRIES, SCHEDULED_RETRIES, AsyncRetries
from local_mode.world import build_world
from tests.fixtures.events import EVENTS_DIR


# ================================================================== the shared semantics
def test_the_async_retry_policy_retries_twice_a_minute_then_two_apart_then_dead_letters() -> None:
    assert async_retry_delay(RECOVERY_RETRIES, 1, 0.0) == 60.0
    assert async_retry_delay(RECOVERY_RETRIES, 2, 60.0) == 120.0
    assert async_retry_delay(RECOVERY_RETRIES, 3, 180.0) is None  # retries spent
    assert async_retry_delay(None, 1, 0.0) is None  # no async invoke config: no retry
    assert async_retry_delay(RECOVERY_RETRIES, 1, 0.0, lambda: 2.5) == 62.5


def test_an_attempt_past_the_maximum_event_age_is_a_dead_letter_instead() -> None:
    assert SCHEDULED_RETRIES.max_event_age_seconds == 300
    assert async_retry_delay(SCHEDULED_RETRIES, 1, 200.0) == 60.0
    assert async_retry_delay(SCHEDULED_RETRIES, 2, 260.0) is None  # 260 + 120 > 300
    no_retries = AsyncRetries(0, 3600.0)
    assert async_retry_delay(no_retries, 1, 0.0, lambda: pytest.fail("no jitter drawn")) is None


def test_a_partial_batch_response_fails_the_items_it_names_or_all_of_them() -> None:
    ids = ["m1", "m2", "m3"]
    assert failed_message_ids(False, None, ids) == set(ids)  # the invocation failed
    assert failed_message_ids(True, None, ids) == set()
    assert failed_message_ids(True, {"batchItemFailures": []}, ids) == set()
    assert failed_message_ids(True, {"batchItemFailures": [{"itemIdentifier": "m2"}]}, ids) == {"m2"}
    # An identifier not in the batch fails the whole batch (as Lambda treats it).
    assert failed_message_ids(True, {"batchItemFailures": [{"itemIdentifier": "x"}]}, ids) == set(ids)
    # Without ReportBatchItemFailures the response is ignored.
    assert failed_message_ids(True, {"batchItemFailures": [{"itemIdentifier": "m2"}]}, ids,
                              report_batch_item_failures=False) == set()


# ================================================================== in process (the moto world)
def test_every_rule_matches_an_event_flattened_once_exactly_as_moto_s_own_matching_does() -> None:
    """The bus flattens an event once for all its rules (``flattened``) instead of once per
    rule inside moto's ``matches_event``: every deployed rule's verdict on every EventBridge
    fixture (in the world's cluster, and in another) is the one moto's own matching gives."""
    with build_world() as world:
        cluster = world.aws.cluster_arn
        events = []
        for path in sorted(EVENTS_DIR.glob("*.json")):
            event = json.loads(path.read_text())
            if "detail-type" not in event:
                continue  # API Gateway's, not EventBridge's
            events.append(event)
            text = json.dumps(event)
            for other in ("arn:aws:ecs:us-east-1:111122223333:cluster/gpu-cluster",
                          "arn:aws:ecs:us-east-1:111122223333:cluster/default"):
                text = text.replace(other, cluster)
            events.append(json.loads(text))
        matched = 0
        for event in events:
            crushed = crush_object_arrays(event)
            flat = flattened(crushed)
            for rule in world.bus.rules:
                expected = rule.matches(event)  # moto's matches_event, as before
                assert rule.matches(event, crushed=crushed, flat=flat) == expected, (rule.name, event)
                matched += expected
        assert matched >= 3  # the comparison covers rules that match, not only ones that do not


def test_in_process_a_queue_delivers_batches_redelivers_failed_items_and_dead_letters_them() -> None:
    """Given the moto world's bus with a queue (batch size 2, visibility 30 s, 3 receives)
    whose worker fails one message every time
    When three messages are sent
    Then they arrive two to a batch, the failing one comes back every 30 s with its receive
    count, and on the receive after its third (30 s later: SQS's redrive happens on the receive
    attempt that would exceed maxReceiveCount) it is a dead letter, in the queue's dead-letter
    queue too; the others are delivered once."""
    seen: list[tuple[float, str, int]] = []

    def worker(event: dict[str, Any], _context: Any) -> dict[str, Any]:
        failures = []
        for record in event["Records"]:
            count = int(record["attributes"]["ApproximateReceiveCount"])
            seen.append((world.ecs.now() - start, record["body"], count))
            if record["body"] == "bad":
                failures.append({"itemIdentifier": record["messageId"]})
        return {"batchItemFailures": failures}

    with build_world(handlers=False) as world:
        start = world.ecs.now()
        world.bus.add_queue("work", worker, "worker", batch_size=2, visibility_timeout=30,
                            max_receive_count=3)
        world.bus.send("work", ["a", "bad", "b"])
        world.ecs.run_for(300)
        assert [body for t, body, _ in seen if t == 0] == ["a", "bad", "b"]
        assert len([d for d in world.bus.delivered_to("worker") if d.time == start]) == 2  # 2 + 1
        assert [(t, count) for t, body, count in seen if body == "bad"] == [(0, 1), (30, 2), (60, 3)]
        (dead,) = world.bus.dead_letters
        assert (dead.rule, dead.target, dead.attempts, dead.at - start) == ("sqs:work", "worker", 3, 90)
        queue = world.bus.queues["work"].queue
        assert queue.moved_to_dead_letter == 1 and queue.dead_letter is not None
        assert [m.body for m in queue.dead_letter.messages.values()] == ["bad"]
        assert json.loads(json.dumps(dead.event))["Records"][0]["body"] == "bad"
        assert world.bus.queued() == 0


def test_in_process_a_failed_target_is_retried_per_its_policy_then_dead_lettered() -> None:
    """Given the moto world's bus with a rule whose target always fails, with the recovery
    functions' retry policy
    When a matching event is put
    Then it is delivered at once, retried 60 s and then 120 s later, then dead-lettered."""
    with build_world(handlers=False) as world:
        start = world.ecs.now()

        def broken(_event: dict[str, Any], _context: Any) -> None:
            raise RuntimeError("boom")

        world.bus.add_rule("scheduled", {"detail-type": ["Scheduled Event"]}, broken, "broken",
                           retries=RECOVERY_RETRIES)
        world.bus.put_events(scheduled_event("arn:aws:events:us-east-1:123456789012:rule/x", time=start))
        world.ecs.run_for(600)
        attempts = [((d.time or 0.0) - start, d.attempt, d.ok) for d in world.bus.delivered_to("broken")]
        assert attempts == [(0, 1, False), (60, 2, False), (180, 3, False)]
        (dead,) = world.bus.dead_letters
        assert (dead.rule, dead.attempts, dead.error) == ("scheduled", 3, "RuntimeError: boom")
        assert world.bus.pending_retries() == 0


def test_a_redriven_dead_letter_leaves_the_dlq_and_reaches_its_target_once_more() -> None:
    """Given a rule's event dead-lettered after its three failed deliveries
    When the DLQ runbook redrives it and its target now answers
    Then it is delivered once more (attempt 4) and is no longer a dead letter; failing again, it
    is a dead letter again at once (its retries spent)."""
    with build_world(handlers=False) as world:
        start = world.ecs.now()
        fails = [True]

        def flaky(_event: dict[str, Any], _context: Any) -> str:
            if fails[0]:
                raise RuntimeError("boom")
            return "done"

        world.bus.add_rule("scheduled", {"detail-type": ["Scheduled Event"]}, flaky, "flaky",
                           retries=RECOVERY_RETRIES)
        world.bus.put_events(scheduled_event("arn:aws:events:us-east-1:123456789012:rule/x", time=start))
        world.ecs.run_for(600)
        (dead,) = world.bus.dead_letters
        again = world.bus.redrive(dead)
        assert (again.ok, again.attempt, len(world.bus.dead_letters)) == (False, 4, 1)
        assert world.bus.dead_letters[0] is not dead and world.bus.dead_letters[0].attempts == 4
        assert world.bus.pending_retries() == 0
        fails[0] = False
        delivered = world.bus.redrive(world.bus.dead_letters[0])
        assert (delivered.ok, delivered.result, delivered.attempt) == (True, "done", 5)
        assert world.bus.dead_letters == []


def test_in_process_a_retry_keeps_the_request_id_and_the_time_left_is_simulated() -> None:
    """Given the moto world's bus with a rule whose target fails, timing out after 60 s
    When two events are put and retried
    Then each retry has its first attempt's request id (Lambda's), each event its own, and
    the context's time left counts down on the simulated clock from the rule's timeout."""
    with build_world(handlers=False) as world:
        seen: list[tuple[str, float, float]] = []

        def broken(_event: dict[str, Any], context: Any) -> None:
            before = context.time_left()
            world.ecs.clock.advance(5)
            seen.append((context.aws_request_id, before, context.time_left()))
            raise RuntimeError("boom")

        world.bus.add_rule("scheduled", {"detail-type": ["Scheduled Event"]}, broken, "broken",
                           retries=RECOVERY_RETRIES, timeout_seconds=60)
        for _ in range(2):
            world.bus.put_events(scheduled_event("arn:aws:events:us-east-1:123456789012:rule/x",
                                                 time=world.ecs.now()))
            world.ecs.run_for(600)
        assert [(left, after) for _, left, after in seen] == [(60.0, 55.0)] * 6
        ids = [request_id for request_id, _, _ in seen]
        assert len(set(ids[:3])) == 1 and len(set(ids[3:])) == 1 and ids[0] != ids[3]


def test_in_process_a_failed_sweep_tick_is_retried_as_the_deployed_schedule_is() -> None:
    """Given the moto world with the recovery sweep's schedule (every 10 minutes here), its
    tick failing on the first two attempts
    When the first tick fires
    Then the same Scheduled Event is retried 60 s and then 120 s later (the deployed
    schedule's async retries, within its maximum event age), the third attempt succeeds and
    nothing is dead-lettered; the next tick comes on time."""
    calls: list[tuple[float, str, str]] = []
    with build_world(handlers=False) as world:
        start = world.ecs.now()

        def sweep(event: dict[str, Any], _context: Any) -> None:
            calls.append((world.ecs.now() - start, event["id"], event["time"]))
            if len(calls) <= 2:
                raise RuntimeError("throttled")

        world.bus.add_schedule("recovery-sweep", 600, sweep, "recovery_sweep", retries=SCHEDULED_RETRIES)
        world.ecs.run_for(1300)
        assert [t for t, _, _ in calls] == [600, 660, 780, 1200]
        assert len({(i, when) for _, i, when in calls[:3]}) == 1 and calls[3][1] != calls[0][1]
        assert world.bus.dead_letters == [] and world.bus.pending_retries() == 0
        attempts = [(d.attempt, d.ok) for d in world.bus.delivered_to("recovery_sweep")]
        assert attempts == [(1, False), (2, False), (3, True), (1, True)]


def test_the_moto_world_wires_the_sweep_schedule_with_its_deployed_retries() -> None:
    with build_world() as world:
        (sweep,) = [s for s in world.bus.schedules if s.name == "recovery-sweep"]
        assert sweep.retries == SCHEDULED_RETRIES


def test_the_heartbeat_sweep_and_queue_scheduler_ticks_are_retried_as_deployed() -> None:
    """Given the moto world with the heartbeat sweep's and the queue scheduler's schedules
    (every minute, as infra deploys them), the scheduler's first tick failing
    When the ticks fire
    Then both schedules carry the deployed async retries and the failed tick's event is tried
    again 60 s later (not dead-lettered at once)."""
    calls: list[tuple[float, str]] = []
    with build_world(handlers=False) as world:
        start = world.ecs.now()

        def scheduler(event: dict[str, Any], _context: Any) -> None:
            calls.append((world.ecs.now() - start, event["id"]))
            if len(calls) == 1:
                raise RuntimeError("throttled")

        world.schedule_heartbeat_sweep(60)
        world.schedule_queue_scheduler(600, target=scheduler)
        assert {s.name: s.retries for s in world.bus.schedules} == {
            "heartbeat-sweep": SCHEDULED_RETRIES, "queue-scheduler": SCHEDULED_RETRIES}
        world.bus.schedules[:] = [s for s in world.bus.schedules if s.name == "queue-scheduler"]
        world.ecs.run_for(700)
        assert [t for t, _ in calls] == [600, 660] and calls[0][1] == calls[1][1]
        assert world.bus.dead_letters == []


# ================================================================== timed on the engine (the scale world)
@pytest.fixture
def scale_world() -> Iterator[ScaleWorld]:
    logging.disable(logging.CRITICAL)
    try:
        with build_world(backend="scale", seed=3, sweep_every_seconds=None) as world:
            yield world
    finally:
        logging.disable(logging.NOTSET)


def test_on_the_engine_every_copy_reaches_lambda_after_its_own_delay(scale_world: ScaleWorld) -> None:
    """Given the scale world's bus (2 copies, 0.05..0.5 s delivery delay) with a rule to a function
    When a matching event is put
    Then the function is invoked twice asynchronously, each copy its own decoded payload, at
    two different times within the delay; the bus runs no schedule of its own (the engine does)."""
    world, sim = scale_world, scale_world.sim
    got: list[tuple[float, dict[str, Any]]] = []
    world.lambdas.add_function("probe", lambda _c, event: got.append((sim.now, event)), timeout=10)
    world.bus.add_rule("probe-rule", {"detail-type": ["Scheduled Event"]}, "probe")
    event = scheduled_event("arn:aws:events:us-east-1:123456789012:rule/x", time=sim.now)
    put_at = sim.now
    assert world.bus.put_events(event) == []  # nothing delivered in process
    sim.run(until=sim.now + 5)
    assert len(got) == 2 and got[0][1] == event and got[0][1] is not got[1][1]
    delays = sorted(t - put_at for t, _ in got)
    assert all(0.05 <= d <= 0.5 for d in delays) and delays[0] != delays[1]
    assert world.bus.next_schedule_due() is None
    with pytest.raises(RuntimeError, match="engine"):
        world.bus.fire_due()


def test_on_the_engine_a_schedule_fires_through_lambda_and_failed_ticks_dead_letter(
        scale_world: ScaleWorld) -> None:
    """Given the scale world's bus with a 60 s schedule to a function that always fails, with
    no retries
    When ten minutes pass
    Then it fired every minute from its first time, and each failure is a dead letter of the
    one record type the moto world's bus keeps."""
    world, sim = scale_world, scale_world.sim
    fired: list[float] = []

    def failing(_container: Any, event: dict[str, Any]) -> None:
        assert event["detail-type"] == "Scheduled Event"
        fired.append(sim.now - start)
        raise RuntimeError("tick failed")

    world.lambdas.add_function("ticker", failing, timeout=10, async_retries=0)
    start = sim.now
    schedule = world.bus.add_schedule("tick", 60, "ticker", first_at=start + 30)
    sim.run(until=start + 600)
    assert fired == [30 + 60 * i for i in range(10)]
    assert schedule.next_due == start + 630
    assert len(world.lambdas.dead_letters) == 10
    dead = world.lambdas.dead_letters[0]
    assert (dead.function, dead.attempts, dead.error) == ("ticker", 1, "RuntimeError: tick failed")


def test_on_the_engine_a_queue_worker_fails_items_alone_and_redrives_them(scale_world: ScaleWorld) -> None:
    """Given the scale world with a queue (visibility 30 s, 2 receives) and a worker on it
    (ScaleWorld.add_worker: a record whose handler raises is a partial batch failure)
    When two messages are sent, one of which always fails
    Then the good one is deleted after one receive, the bad one is received twice, 30 s apart,
    and is then moved to the dead-letter queue (SQS's redrive, on its next receive)."""
    world, sim = scale_world, scale_world.sim
    seen: list[tuple[str, int, float]] = []

    def handle(_container: Any, body: dict[str, Any], receive_count: int) -> None:
        seen.append((body["n"], receive_count, sim.now))
        if body["n"] == "bad":
            raise ValueError("poison")

    queue = world.add_queue("work", visibility_timeout=30, max_receive_count=2)
    world.add_worker(queue, "worker", handle, timeout=10, batch_size=10)
    start = sim.now
    sim.run_process(lambda: queue.port().send([{"n": "good"}, {"n": "bad"}]))
    sim.run(until=start + 300)
    assert sorted((n, c) for n, c, _ in seen) == [("bad", 1), ("bad", 2), ("good", 1)]
    bad = [t for n, _, t in seen if n == "bad"]
    assert bad[1] - bad[0] == pytest.approx(30, abs=1)
    stats = queue.stats()
    assert (stats["deleted"], stats["moved_to_dead_letter"], stats["dead_letter_queue"], stats["in_queue"]) \
        == (1, 1, 1, 0)
    assert stats["failed_items"] == 2
