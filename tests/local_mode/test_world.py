"""``build_world``: the emulator, the bus and the simulated ECS set up together, the
recovery Lambdas wired as infra deploys them, the handlers' services forgotten after."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery import runtime
from local_mode.sim.broken_calls import THROTTLE
from local_mode.sim.deployment import TAG_LOOKUP_QUEUE
from local_mode.sim.wiring import GANG_QUEUE, SWEEP_SCHEDULE
from local_mode.world import HEARTBEAT_SWEEP_SCHEDULE, QUEUE_SCHEDULER_SCHEDULE, build_world

RULES = ["training-task-state", "health-check-task-stopped", "container-instance-state",
         "ec2-capacity-notices", "health-scheduled-changes"]


def test_a_ranks_stopped_event_reaches_the_task_handler_through_the_bus() -> None:
    """Given a world with the handlers wired and every event delivered twice
    When a one-rank job's rank exits 0
    Then its STOPPED event reaches ecs_task_handler (and its duplicate too), which completes the job."""
    with build_world(duplicate_delivery=True) as world:
        assert [r.name for r in world.bus.rules] == RULES
        assert set(world.handlers) == {"ecs_task_handler", "dcgm_task_monitor", "ecs_instance_monitor",
                                       "recovery_sweep", "gang_worker", "tag_lookup_worker"}
        assert GANG_QUEUE in world.bus.queues and TAG_LOOKUP_QUEUE.name in world.bus.queues
        world.ecs.add_node("node-a")
        td = world.ecs.register_training_task_definition("train", gpus=8)
        world.ecs.plan_family("train", run_seconds=120, exit_code=0)
        world.ecs.start_job("one-rank", td, ["node-a"])
        world.ecs.run_for(600)
        to_handler = [d for d in world.bus.deliveries
                      if d.rule == "training-task-state" and d.target == "ecs_task_handler" and d.ok]
        assert any(d.duplicate for d in to_handler)
        assert runtime.recovery_service().repo.jobs.get_job("one-rank").state is C.JobState.COMPLETE


def test_a_job_registered_by_its_tags_alone_is_registered_through_the_tag_lookup_worker() -> None:
    """Given a world wired as infra deploys it (the tag lookup queue and its worker)
    When an external launcher starts a two-rank job with only the recovery tags (no job item,
    no registration convention) and its ranks run
    Then the task handler queues each task for a lookup instead of describing it, the worker
    gets both in one batch (one DescribeTasks for the two), and registers the job and its ranks."""
    with build_world() as world:
        assert world.aws.env[C.ENV_TAG_LOOKUP_QUEUE_URL] == world.aws.tag_lookup_queue_url
        world.ecs.add_node("node-a")
        world.ecs.add_node("node-b")
        td = world.ecs.register_training_task_definition("train", gpus=8)
        arns = world.ecs.start_job("by-tags", td, ["node-a", "node-b"])
        world.ecs.run_for(120)
        handled = [d for d in world.bus.delivered_to("ecs_task_handler") if d.rule == "training-task-state"]
        assert [d.result["action"] for d in handled] == ["lookup_queued", "lookup_queued"]
        assert world.bus.queues[TAG_LOOKUP_QUEUE.name].sent == 2
        (lookup,) = world.bus.delivered_to("tag_lookup_worker")
        assert lookup.ok and lookup.result == {"batchItemFailures": []}
        repo = world.repo
        job = repo.jobs.get_job("by-tags")
        assert job is not None and job.state is C.JobState.RUNNING and job.world_size == 2
        assert world.job("by-tags")["source"] == "ecs-tags"
        assert [(r.rank, r.task_arn) for r in repo.jobs.get_ranks(job)] == list(enumerate(arns))


def _tag_registered_job(fault: int | None) -> tuple[list[Any], Any, list[Any], Any]:
    """A two-rank job registered by its tags alone, the world's calls counted from its start
    (``fault``: that call throttled): the calls, the one broken, the worker's deliveries, the job."""
    with build_world() as world:
        world.ecs.add_node("node-a")
        world.ecs.add_node("node-b")
        td = world.ecs.register_training_task_definition("train", gpus=8)
        world.aws.call_faults.arm(fault, THROTTLE)
        world.ecs.start_job("by-tags", td, ["node-a", "node-b"])
        world.ecs.run_for(600)
        faults = world.aws.call_faults
        return list(faults.calls), faults.fired, world.bus.delivered_to("tag_lookup_worker"), \
            world.repo.jobs.get_job("by-tags")


def test_a_failed_tag_lookup_comes_back_after_the_claims_lease_not_the_queues_visibility_timeout() -> None:
    """Given a tag-registered job whose lookup's DescribeTasks is throttled (the worker's whole
    batch fails)
    When the worker reports its two messages failed
    Then it asks SQS to show them again once any claim it made has ended its lease
    (ChangeMessageVisibilityBatch): the second delivery comes 75 s after the first, not after
    the queue's visibility timeout (six minutes), and registers the job."""
    calls, _, _, _ = _tag_registered_job(None)
    describe = next(c.index for c in calls if c.operation == "DescribeTasks")
    _, fired, deliveries, job = _tag_registered_job(describe)
    assert fired is not None and fired.operation == "DescribeTasks"
    first, second = deliveries[:2]
    assert first.ok and len(first.result["batchItemFailures"]) == 2  # both messages failed
    assert C.CLAIM_LEASE_SECONDS <= second.time - first.time < C.CLAIM_LEASE_SECONDS + 1 \
        < C.TAG_LOOKUP_VISIBILITY_TIMEOUT_SECONDS
    assert second.ok and second.result == {"batchItemFailures": []}
    assert job is not None and job.state is C.JobState.RUNNING and job.world_size == 2


def test_the_schedules_are_the_ones_asked_for() -> None:
    """Given worlds built with and without the recovery sweep
    When their schedules are listed
    Then the sweep runs every sweep_every_seconds, or not at all with None; the heartbeat
    sweep and the queue scheduler are added on request."""
    with build_world(sweep_every_seconds=300) as world:
        assert [(s.name, s.every_seconds) for s in world.bus.schedules] == [(SWEEP_SCHEDULE, 300)]
    with build_world(sweep_every_seconds=None) as world:
        assert world.bus.schedules == []
        assert "recovery_sweep" not in world.handlers
        world.schedule_heartbeat_sweep(60)
        world.schedule_queue_scheduler(120)
        assert [(s.name, s.every_seconds) for s in world.bus.schedules] == [
            (HEARTBEAT_SWEEP_SCHEDULE, 60), (QUEUE_SCHEDULER_SCHEDULE, 120)]


def test_without_handlers_the_bus_is_empty_and_services_do_not_outlive_their_world() -> None:
    """Given a world built without handlers
    When it is torn down and another is built
    Then the bus had no rule, schedule or queue, and the second world's services are new
    (none is built on the first emulator's session)."""
    with build_world(handlers=False) as world:
        assert (world.bus.rules, world.bus.schedules, world.bus.queues, world.handlers) == ([], [], {}, {})
        first = runtime.recovery_service()
    with build_world(handlers=False):
        assert runtime.recovery_service() is not first


def test_both_backends_wire_the_same_deployment_onto_their_bus() -> None:
    """Given a moto world and a scale world, both from build_world
    When their buses are compared
    Then each has the deployed rules (same names, functions and patterns for its cluster and
    the registration mode "both"), the sweep's schedule and the two queues with the deployed
    batch size, visibility timeout and redrive; only where a function runs differs (a handler
    in process, the engine's function by name)."""
    with build_world() as moto:
        moto_rules = [(r.name, r.target_name, r.pattern, r.retries) for r in moto.bus.rules]
        moto_cluster = moto.aws.cluster_arn
        moto_schedules = [(s.name, s.target_name, s.every_seconds) for s in moto.bus.schedules]
        moto_queues = {name: (source.target_name, source.batch_size, source.queue.visibility_timeout,
                              source.queue.max_receive_count) for name, source in moto.bus.queues.items()}
        assert all(callable(r.target) for r in moto.bus.rules)
    with build_world(backend="scale", seed=1, settings={"registration": "both"}) as scale:
        scale_rules = [(r.name, r.target_name,
                        json.loads(json.dumps(r.pattern).replace(scale.cluster.arn, moto_cluster)), r.retries)
                       for r in scale.bus.rules]
        scale_schedules = [(s.name, s.target_name, s.every_seconds) for s in scale.bus.schedules]
        scale_queues = {name: (queue._source.function if queue._source else "",
                               queue._source.batch_size if queue._source else 0,
                               queue.visibility_timeout, queue.max_receive_count)
                        for name, queue in scale.queues.items()}
        assert all(r.target is None for r in scale.bus.rules)
    assert [r[0] for r in moto_rules] == RULES
    assert scale_rules == moto_rules
    assert scale_schedules == moto_schedules == [(SWEEP_SCHEDULE, "recovery_sweep", 60.0)]
    assert scale_queues == moto_queues and set(moto_queues) == {GANG_QUEUE, TAG_LOOKUP_QUEUE.name}


def test_an_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown world backend"):
        build_world(backend="kube")  # type: ignore[call-overload]
