"""A gang's planned training counts from its rendezvous (``plan_family(..., gang=True)``):
NCCL's init waits for every rank, so no rank of an attempt finishes its run before the last
one is RUNNING, however late a broken call made that rank's start. The crash campaigns rely
on it to train each attempt minutes, not hours, without a delayed rank finding the rest done."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery.adapters import aws
from local_mode.world import World, build_world

RUN = 240.0


@pytest.fixture
def world() -> Iterator[World]:
    logging.disable(logging.CRITICAL)
    try:
        with build_world(handlers=False) as built:
            yield built
    finally:
        logging.disable(logging.NOTSET)


def _start(world: World, node: str, rank: int, *, size: int = 2, attempt: str | None = None,
           job: str = "j1") -> str:
    tags = {C.TAG_JOB_ID: job, C.TAG_RANK: str(rank), C.TAG_WORLD_SIZE: str(size)}
    if attempt is not None:
        tags[C.TAG_ATTEMPT] = attempt
    definition = world.ecs.register_training_task_definition("train", gpus=8)
    answer: dict[str, Any] = aws.client("ecs").start_task(
        cluster=world.aws.cluster_name, taskDefinition=definition,
        containerInstances=[world.ecs.node(node).container_instance_arn], startedBy="test",
        tags=[{"key": k, "value": v} for k, v in tags.items()])
    assert answer["failures"] == [], answer
    return str(answer["tasks"][0]["taskArn"])


def _stopped_at(world: World, arn: str) -> float | None:
    return world.ecs.tasks[arn].stopped_at


def test_a_late_rank_holds_its_gang_and_all_finish_a_run_after_it(world: World) -> None:
    sim = world.ecs
    for node in ("n0", "n1"):
        sim.add_node(node, gpus=8)
    sim.plan_family("train", run_seconds=RUN, gang=True)
    t0 = sim.now()
    early = _start(world, "n0", 0)
    sim.run_for(300)  # longer than the run: alone, rank 0 would have finished
    assert _stopped_at(world, early) is None
    late = _start(world, "n1", 1)
    sim.run_for(30)
    late_running = sim.tasks[late].started_at
    assert late_running is not None and late_running > t0 + 300
    sim.run_for(RUN)
    assert _stopped_at(world, early) == _stopped_at(world, late) == late_running + RUN
    assert sim.tasks[early].containers[0].get("exitCode") == 0


def test_attempts_meet_apart_and_a_plan_without_gang_runs_from_its_own_start(world: World) -> None:
    sim = world.ecs
    for node in ("n0", "n1", "n2"):
        sim.add_node(node, gpus=8)
    sim.plan_family("train", run_seconds=RUN, gang=True)
    first = _start(world, "n0", 0, attempt="2")
    other = _start(world, "n1", 1, attempt="3")  # another attempt: no rendezvous with rank 0
    sim.run_for(RUN + 60)
    assert _stopped_at(world, first) is None and _stopped_at(world, other) is None
    sim.plan_family("train", run_seconds=RUN)  # no gang: each from its own RUNNING
    alone = _start(world, "n2", 0, job="j2", size=2)
    sim.run_for(RUN + 30)
    started = sim.tasks[alone].started_at
    assert started is not None and _stopped_at(world, alone) == started + RUN


def test_a_rank_replanned_while_it_waits_keeps_its_own_plan(world: World) -> None:
    """A fault planned on a waiting rank (``plan_task``) is its end; the rendezvous does not
    schedule a second one for it, and still counts it as RUNNING."""
    sim = world.ecs
    for node in ("n0", "n1"):
        sim.add_node(node, gpus=8)
    sim.plan_family("train", run_seconds=RUN, gang=True)
    waiting = _start(world, "n0", 0)
    sim.run_for(30)
    sim.plan_task(waiting, run_seconds=600, exit_code=1)
    other = _start(world, "n1", 1)
    sim.run_for(60)
    other_running = sim.tasks[other].started_at
    assert other_running is not None
    sim.run_for(RUN)
    assert _stopped_at(world, other) == other_running + RUN
    assert _stopped_at(world, waiting) is None
    sim.run_for(600)
    assert sim.tasks[waiting].containers[0].get("exitCode") == 1
