"""The scale simulator: simulated time and processes, Lambda (timeouts, retries, dead
letters, concurrency), ECS rate limits with botocore's standard retries, the SQS queue
model, and a small recovery that must come out right."""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpu_recovery import clock
from gpu_recovery import constants as C
from gpu_recovery.adapters.queue import Redeliveries
from local_mode.scale_recovery import launch_tagged_job
from local_mode.sim.aws_calls import Account, ClientFailure
from local_mode.sim.contract.requests import ContractViolation
from local_mode.sim.engine import Simulation
from local_mode.sim.lambdas import LambdaService
from local_mode.sim.sqs import SqsQueue, sqs_batch_handler
from local_mode.world import build_world
from tests.fixtures.history import state_changes


@pytest.fixture
def sim() -> Iterator[Simulation]:
    simulation = Simulation(seed=7)
    simulation.install_clock()
    try:
        yield simulation
    finally:
        simulation.close()
        clock.reset_clock()


# ================================================================== time and processes
def test_processes_interleave_at_waits_and_time_only_moves_forward(sim: Simulation) -> None:
    trace: list[tuple[str, float]] = []

    def worker(name: str, pause: float) -> None:
        for _ in range(3):
            trace.append((name, clock.now() - sim.start))
            clock.sleep(pause)

    sim.spawn(lambda: worker("a", 1.0), name="a")
    sim.spawn(lambda: worker("b", 0.4), name="b")
    sim.run()
    assert [(name, round(t, 3)) for name, t in trace] == [
        ("a", 0.0), ("b", 0.0), ("b", 0.4), ("b", 0.8), ("a", 1.0), ("a", 2.0)]


def test_a_function_timeout_ends_the_invocation_and_cannot_be_caught(sim: Simulation) -> None:
    lambdas = LambdaService(sim, retry_jitter=0.0)
    caught: list[str] = []

    def slow(_container: Any, _payload: Any) -> None:
        try:
            clock.sleep(100)
        except Exception:  # the code under test cannot swallow Lambda's kill
            caught.append("caught")

    lambdas.add_function("slow", slow, timeout=10)
    lambdas.invoke_async("slow", {})
    sim.run(until=sim.now + 1000)
    stats = lambdas.functions["slow"].stats
    assert caught == []
    assert (stats.invocations, stats.timeouts, stats.retries, stats.dead_letters) == (3, 3, 2, 1)
    assert stats.max_duration == pytest.approx(10.0)
    # Retried 1 and 2 minutes after each failure, then dead-lettered.
    starts = [i.started_at - sim.start for i in lambdas.invocations]  # type: ignore[operator]
    assert starts == pytest.approx([0.0, 70.0, 200.0])
    assert lambdas.dead_letters[0].attempts == 3


def test_a_retry_keeps_the_failed_invocations_request_id_and_time_left_is_simulated(sim: Simulation) -> None:
    """Lambda's retry of a failed asynchronous invocation keeps its request id (a new event,
    a new one); the context's time left counts down in simulated time."""
    lambdas = LambdaService(sim, retry_jitter=0.0)
    seen: list[tuple[str, float, float]] = []

    def failing(_container: Any, _payload: Any) -> None:
        context = sim.current.context if sim.current is not None else None
        assert context is not None
        before = context.time_left()
        clock.sleep(4)
        seen.append((context.aws_request_id, before, context.time_left()))
        raise RuntimeError("boom")

    lambdas.add_function("failing", failing, timeout=10)
    lambdas.invoke_async("failing", {})
    sim.run(until=sim.now + 1000)
    lambdas.invoke_async("failing", {})
    sim.run(until=sim.now + 1000)
    assert [(left, after) for _, left, after in seen] == [(10.0, 6.0)] * 6
    ids = [request_id for request_id, _, _ in seen]
    assert len(set(ids[:3])) == 1 and len(set(ids[3:])) == 1 and ids[0] != ids[3]


def test_invocations_beyond_the_concurrency_limit_wait_for_a_slot(sim: Simulation) -> None:
    lambdas = LambdaService(sim, concurrency=2)
    lambdas.add_function("work", lambda _c, _p: clock.sleep(5), timeout=60)
    for _ in range(5):
        lambdas.invoke_async("work", {})
    sim.run()
    assert lambdas.max_running == 2 and lambdas.throttled == 3
    ends = sorted(i.ended_at - sim.start for i in lambdas.invocations)  # type: ignore[operator]
    assert ends == pytest.approx([5, 5, 10, 10, 15])


# ================================================================== ECS rate limits
def test_a_burst_of_stop_tasks_is_throttled_at_100_then_40_per_second_and_retried(sim: Simulation) -> None:
    with build_world(backend="scale", seed=3, sweep_every_seconds=None, copies=1) as world:
        node = world.cluster.add_node("n0", gpus=8)
        definition = world.cluster.register_task_definition("small", gpus=0)
        tasks = [world.cluster.launch(definition, node) for _ in range(300)]

        def stop(part: list[Any]) -> None:  # one invocation (container, client) per part
            client = world.cluster.client()
            for task in part:
                client.stop_task(cluster=world.cluster.name, task=task.arn, reason="test")

        for i in range(30):  # 30 concurrent invocations, 10 stops each
            world.sim.spawn(lambda part=tasks[i::30]: stop(part), label="stopper")
        world.sim.run()
        stats = world.account.stats
        assert world.cluster.counters["stop_requests"] == 300  # every stop landed in the end
        assert stats.calls["ecs:StopTask"] - stats.throttled["ecs:StopTask"] == 300
        assert stats.throttled["ecs:StopTask"] > 0 and stats.failed["ecs:StopTask"] == 0
        assert world.account.buckets["ecs_control"].taken == 300
        # No faster than the bucket: 100 at once, then 40 per second.
        assert world.sim.now - world.sim.start >= world.account.buckets["ecs_control"].floor_seconds(300)


def test_a_throttled_call_gives_up_after_six_attempts_with_throttling_exception(sim: Simulation) -> None:
    with build_world(backend="scale", seed=3, sweep_every_seconds=None, copies=1) as world:
        world.account.buckets["ecs_read"].burst = 0.0
        world.account.buckets["ecs_read"].rate = 0.0
        client = world.cluster.client()
        with pytest.raises(ClientError) as error:
            world.sim.run_process(lambda: client.list_tasks(cluster=world.cluster.name))
        assert error.value.response["Error"]["Code"] == "ThrottlingException"
        assert world.account.stats.calls["ecs:ListTasks"] == 6
        assert client.quota.available == 500 - 5 * 5


def test_the_cordon_attribute_is_put_and_deleted_by_arn_or_id_and_an_unknown_target_fails(
        sim: Simulation) -> None:
    """The stack's cordon (PutAttributes / DeleteAttributes) works in the simulator as on ECS."""
    with build_world(backend="scale", seed=3, sweep_every_seconds=None, copies=1) as world:
        node = world.cluster.add_node("n0")
        client = world.cluster.client()
        world.sim.run_process(lambda: client.put_attributes(cluster=world.cluster.name, attributes=[
            {"name": "gpu-recovery.cordoned", "targetId": node.container_instance_id,
             "targetType": "container-instance"}]))
        assert node.attributes == {"gpu-recovery.cordoned": None}
        world.sim.run_process(lambda: client.delete_attributes(cluster=world.cluster.name, attributes=[
            {"name": "gpu-recovery.cordoned", "targetId": node.container_instance_arn}]))
        assert node.attributes == {}
        with pytest.raises(ClientError) as error:
            world.sim.run_process(lambda: client.put_attributes(cluster=world.cluster.name, attributes=[
                {"name": "gpu-recovery.cordoned", "targetId": "arn:missing"}]))
        assert error.value.response["Error"]["Code"] == "TargetNotFoundException"


def test_start_task_places_one_task_per_named_instance_and_reports_the_others(sim: Simulation) -> None:
    with build_world(backend="scale", seed=3, sweep_every_seconds=None, copies=1) as world:
        nodes = [world.cluster.add_node(f"n{i}") for i in range(12)]
        definition = world.cluster.register_task_definition("train", gpus=8)
        world.cluster.launch(definition, nodes[1])  # n1's GPUs are taken
        nodes[2].agent_connected = False
        client = world.cluster.client()
        response = world.sim.run_process(lambda: client.start_task(
            cluster=world.cluster.name, taskDefinition="train",
            containerInstances=[n.container_instance_arn for n in nodes[:3]] + ["arn:missing"],
            startedBy="gang-a2"))
        assert [t["containerInstanceArn"] for t in response["tasks"]] == [nodes[0].container_instance_arn]
        assert response["failures"] == [{"arn": nodes[1].container_instance_arn, "reason": "RESOURCE:GPU"},
                                        {"arn": nodes[2].container_instance_arn, "reason": "AGENT"},
                                        {"arn": "arn:missing", "reason": "MISSING"}]
        assert world.account.stats.calls["ecs:StartTask"] == 1  # one call for the whole list
        eleven = [n.container_instance_arn for n in nodes[:11]]
        # The request guard refuses the request before the cluster sees it; the cluster
        # refuses it too, as ECS does.
        with pytest.raises(ContractViolation, match="at most 10 container instances"):
            world.sim.run_process(lambda: client.start_task(
                cluster=world.cluster.name, taskDefinition="train", containerInstances=eleven))
        assert [v.member for v in world.requests.take()] == ["containerInstances"]
        with pytest.raises(ClientFailure, match="at most 10"):
            world.cluster.start_task({"cluster": world.cluster.name, "taskDefinition": "train",
                                      "containerInstances": eleven})
        listed = world.sim.run_process(lambda: client.list_tasks(cluster=world.cluster.name,
                                                                 startedBy="gang-a2"))
        assert listed["taskArns"] == [response["tasks"][0]["taskArn"]]


# ================================================================== SQS
def _queue_world(sim: Simulation, *, max_concurrency: int | None = None,
                 timeout: float = 30.0) -> tuple[SqsQueue, LambdaService, list[tuple[str, int, float]]]:
    account = Account(sim)
    lambdas = LambdaService(sim)
    dead = SqsQueue(sim, account, "work-dlq")
    queue = SqsQueue(sim, account, "work", visibility_timeout=60, max_receive_count=3, dead_letter=dead)
    seen: list[tuple[str, int, float]] = []

    def handle(body: dict[str, Any], receive_count: int) -> None:
        seen.append((body["id"], receive_count, sim.now - sim.start))
        clock.sleep(body.get("work", 0.1))
        failures = body.get("fail", 0)
        if failures < 0 or receive_count <= failures:
            raise RuntimeError(f"{body['id']} failed")

    lambdas.add_function("worker", sqs_batch_handler(handle), timeout=timeout)
    queue.attach(lambdas, "worker", batch_size=4, max_concurrency=max_concurrency)
    return queue, lambdas, seen


def test_a_queue_worker_retries_failed_items_and_dead_letters_poison_messages(sim: Simulation) -> None:
    queue, lambdas, seen = _queue_world(sim)
    port = queue.port()
    bodies = [{"id": f"m{i}"} for i in range(10)] + [{"id": "flaky", "fail": 2}, {"id": "poison", "fail": -1}]
    sim.run_process(lambda: port.send(bodies))
    sim.run(until=sim.now + 1000)
    counts: dict[str, list[int]] = {}
    for message_id, receive_count, _ in seen:
        counts.setdefault(message_id, []).append(receive_count)
    assert all(counts[f"m{i}"] == [1] for i in range(10))  # delivered once, deleted
    assert counts["flaky"] == [1, 2, 3]  # back after each visibility timeout
    assert counts["poison"] == [1, 2, 3]  # then redriven instead of a 4th receive
    assert queue.messages == {} and queue.moved_to_dead_letter == 1
    assert queue.dead_letter is not None
    assert [json.loads(m.body)["id"] for m in queue.dead_letter.messages.values()] == ["poison"]
    flaky_times = [t for i, _, t in seen if i == "flaky"]
    assert flaky_times[1] - flaky_times[0] >= 60 and flaky_times[2] - flaky_times[1] >= 60
    assert queue.sent == 12 and lambdas.functions["worker"].stats.errors == 0  # partial failures: no error


def test_a_queue_respects_delay_batch_size_and_maximum_concurrency(sim: Simulation) -> None:
    queue, lambdas, seen = _queue_world(sim, max_concurrency=2)
    port = queue.port()
    sim.run_process(lambda: port.send([{"id": f"d{i}", "work": 5.0} for i in range(20)], delay_seconds=30))
    sim.run(until=sim.now + 600)
    assert min(t for _, _, t in seen) >= 30  # nothing before the delay
    source = queue._source
    assert source is not None
    assert source.max_active == 2  # the maximum concurrency
    assert source.batches == 5  # 20 messages, 4 a batch
    assert lambdas.max_running == 2 and len(seen) == 20


def test_a_timed_out_batch_comes_back_whole_after_the_visibility_timeout(sim: Simulation) -> None:
    queue, _, seen = _queue_world(sim, timeout=30.0)
    port = queue.port()
    sim.run_process(lambda: port.send([{"id": "fast"}, {"id": "slow", "work": 40.0, "fail": 0}]))
    sim.run(until=sim.now + 200)
    firsts = [(i, n) for i, n, _ in seen]
    # The first batch times out inside "slow": "fast" comes back too (it was not deleted).
    assert firsts[:2] == [("fast", 1), ("slow", 1)]
    assert ("fast", 2) in firsts


def test_a_worker_brings_its_failed_message_back_sooner_through_the_queues_client(sim: Simulation) -> None:
    """Given a queue with a 60 s visibility timeout and a worker that fails a message's first
    receive and asks it back in 5 s (``adapters.queue.Redeliveries`` on the queue's client,
    ChangeMessageVisibilityBatch on the queue its records name)
    When the message is sent
    Then its second receive comes 5 s after the first, not 60; the third failure is left to
    the visibility timeout (only a first receive is brought forward)."""
    queue = SqsQueue(sim, Account(sim), "work", visibility_timeout=60)
    lambdas = LambdaService(sim)
    client = queue.client()
    seen: list[tuple[int, float]] = []

    def handler(_container: Any, event: dict[str, Any]) -> dict[str, Any]:
        records = event["Records"]
        count = int(records[0]["attributes"]["ApproximateReceiveCount"])
        seen.append((count, sim.now - sim.start))
        if count >= 3:
            return {"batchItemFailures": []}
        Redeliveries(client, 5).bring_forward(records)
        return {"batchItemFailures": [{"itemIdentifier": r["messageId"]} for r in records]}

    lambdas.add_function("worker", handler, timeout=10)
    queue.attach(lambdas, "worker", batch_size=1)
    sim.run_process(lambda: queue.port().send([{"id": "m"}]))
    sim.run(until=sim.now + 300)
    (first, t1), (second, t2), (third, t3) = seen
    assert (first, second, third) == (1, 2, 3)
    assert t2 - t1 == pytest.approx(5, abs=1) and t3 - t2 == pytest.approx(60, abs=1)


def test_send_message_batch_is_validated_as_sqs_does(sim: Simulation) -> None:
    queue, _, _ = _queue_world(sim)
    client = queue.client()

    def send(entries: list[dict[str, Any]]) -> Any:
        return sim.run_process(lambda: client.send_message_batch(QueueUrl=queue.url, Entries=entries))

    with pytest.raises(ClientError, match="TooManyEntriesInBatchRequest"):
        send([{"Id": str(i), "MessageBody": "{}"} for i in range(11)])
    with pytest.raises(ClientError, match="BatchEntryIdsNotDistinct"):
        send([{"Id": "a", "MessageBody": "{}"}, {"Id": "a", "MessageBody": "{}"}])
    with pytest.raises(ClientError, match="BatchRequestTooLong"):
        send([{"Id": "a", "MessageBody": "x" * 300_000}])
    with pytest.raises(ValueError, match="visibility timeout"):
        other = SqsQueue(sim, Account(sim), "short", visibility_timeout=5)
        lambdas = LambdaService(sim)
        lambdas.add_function("w", lambda _c, _p: None, timeout=30)
        other.attach(lambdas, "w")


# ================================================================== a small recovery
def test_a_small_job_recovers_from_a_gpu_fault_with_an_nccl_cascade_and_duplicate_events() -> None:
    logging.disable(logging.CRITICAL)
    try:
        with build_world(backend="scale", seed=1) as world:
            nodes = [world.cluster.add_node(f"n{i}") for i in range(8)]
            world.cluster.add_node("spare")
            job = launch_tagged_job(world, "job1", nodes)
            sim = world.sim
            sim.run(until=sim.now + 300)
            assert all(world.rank("job1", r) for r in range(8))
            assert (world.job("job1") or {}).get("job_state") == "RUNNING"
            world.reset_measurements()
            t_fault = sim.now
            world.cluster.fail_gpu(nodes[0], nccl_cascade=True,
                                   cascade_delay=lambda: sim.rng.uniform(0.2, 3.0))

            def recovered() -> bool:
                item = world.job("job1") or {}
                return item.get("job_state") == "RUNNING" and item.get("attempt") == 2 \
                    and 2 in job.all_running_at

            assert sim.run(until=t_fault + 3600, stop=recovered) == "stop"
            sim.run(until=sim.now + 300)  # late duplicates and retries change nothing
            item = world.job("job1") or {}
            assert (item["job_state"], item["attempt"]) == ("RUNNING", 2)
            suspects = {world.cluster.node(i).name for i in world.suspects("job1", attempt=1)}
            assert "n0" in suspects
            # The job's history has its state changes only (each verdict is on its suspect item),
            # and the goodput ledger's marks within RUNNING (rank 0 running: restart until then).
            assert [h["to"] for h in state_changes(item["history"])][-4:] == [
                "PENDING_HEALTHCHECK", "PENDING_RESTART", "STARTING", "RUNNING"]
            # Exactly one DCGM check per suspect node, one reboot (node 0), nothing dead-lettered.
            assert dict(world.cluster.health_checks) == dict.fromkeys(suspects, 1)
            assert dict(world.cluster.reboots) == {"n0": 1}
            assert world.lambdas.dead_letters == []
            # Every rank runs exactly once in attempt 2, on its node, after the fault's floor.
            # (identical ranks start together: one StartTask for the 8, tagged with their ranks)
            second = {t.arn: t for t in world.cluster.running() if t.tags.get(C.TAG_ATTEMPT) == "2"}
            ranks = [world.rank("job1", r) or {} for r in range(8)]
            assert [(r.get("attempt"), r.get("rank_state")) for r in ranks] == [(2, "RUNNING")] * 8
            assert sorted(second) == sorted(r["task_arn"] for r in ranks)
            assert all(second[r["task_arn"]].node == nodes[i].name for i, r in enumerate(ranks))
            cluster = world.cluster
            assert job.all_running_at[2] - t_fault >= cluster.dcgm_seconds + cluster.reboot_seconds
            assert [n.subject for n in world.topic.published] == [
                "[GPU recovery] Job recovered and restarted: job job1"]
            usage = world.dynamo.meter.total
            assert usage.items_read > 0 and usage.largest_item_bytes < 64 * 1024
            assert world.account.stats.calls["ecs:StartTask"] == 1 + len(suspects)
    finally:
        logging.disable(logging.NOTSET)


# ================================================================== the scale bench, small
@pytest.mark.parametrize("tasks", [8, 64])
def test_a_small_scale_bench_run_recovers_with_nothing_dead_lettered(tasks: int) -> None:
    """``make bench BENCH=scale`` at 8 tasks (its batches run inline) and 64 (through the gang
    queue and its worker): recovered, nothing dead-lettered, within every limit."""
    from bench.scale_bench import run_scenario

    collector = (gc.get_threshold(), gc.get_freeze_count())
    logging.disable(logging.CRITICAL)
    try:
        result = run_scenario("per-node", tasks, "cascade", wall_cap=60.0)
    finally:
        logging.disable(logging.NOTSET)
    # The run tunes the garbage collector for itself (fewer passes) and gives it back as it was.
    assert (gc.get_threshold(), gc.get_freeze_count()) == collector
    assert result["outcome"] == "recovered", result.get("traceback") or result["outcome"]
    assert result["dead_letters_total"] == 0
    assert result["dynamodb"]["largest_item_bytes"] < 64 * 1024
    assert all(f["timeouts"] == 0 and f["longest_s"] < f["timeout_s"]
               for f in result["lambda"]["functions"].values())
    assert result["ecs"]["control_per_rank"] <= 2.0
    assert result["ecs"]["failed_after_retries"] == 0
    assert result["suspects"] >= 1 and result["reboots"] == 1
    queue = result["gang_queue"]
    assert (queue["sent"] > 0) == (tasks > 16) and queue["failed_items"] == 0 and queue["in_queue"] == 0
    assert result["above_floor_s"] is not None and 0 <= result["above_floor_s"] < 30


@pytest.mark.slow
@pytest.mark.long  # ~2.5 min on one core: started first (tests/conftest.py)
def test_the_largest_job_recovers_within_every_aws_request_and_item_limit() -> None:
    """8,192 tasks, one per GPU on 1,024 nodes (the largest job the loop protects, issue 40):
    its recovery makes no request AWS would refuse (the scale world's request guard: every
    StartTask's tags, every transaction, batch and item) and writes no item over 400 KB (the
    in-memory DynamoDB measures each by DynamoDB's rules). Slow tier: minutes of wall time;
    the quick tier runs the same recovery at 8 and 64 tasks."""
    from bench.scale_bench import run_scenario

    logging.disable(logging.CRITICAL)
    try:
        result = run_scenario("per-gpu", 8192, "cascade", wall_cap=3600.0)
    finally:
        logging.disable(logging.NOTSET)
    assert result["outcome"] == "recovered", result.get("traceback") or result["outcome"]
    assert "contract_violations" not in result
    assert result["dynamodb"]["largest_item_bytes"] < 400 * 1024
    assert result["dead_letters_total"] == 0
