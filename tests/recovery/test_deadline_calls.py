"""Calls against AWS's deadline (``recovery.deadline_calls``): a rank on a node AWS takes is
asked to stop at once, and the ECS budget's own bookkeeping failing does not hold that back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpu_recovery import clock
from gpu_recovery.adapters.ecs import EcsAdapter
from gpu_recovery.adapters.ecs_budget import EcsCallBudget, RateLimited
from gpu_recovery.domain.models import Rank
from gpu_recovery.domain.rate_limit import Reservation, TokenBucket, reserve
from gpu_recovery.domain.states import RankState
from gpu_recovery.recovery.deadline_calls import stop_first
from tests.recovery.fakes import LostResponse, throttled


class _Budget:
    """The budget's item: its read or write fails ``failing`` times (a lost answer or a throttle),
    then it reserves as the repository does."""

    def __init__(self, failing: list[Exception]) -> None:
        self.failing = failing
        self.tat: float | None = None

    def reserve(self, tokens: int, bucket: TokenBucket, now: float, ahead: float = 0.0) -> Reservation:
        if self.failing:
            raise self.failing.pop(0)
        decided = reserve(self.tat, now, tokens, bucket, ahead)
        if decided.granted:
            self.tat = decided.tat
        return decided


class _Ecs:
    def __init__(self) -> None:
        self.stopped: list[str] = []

    def stop_task(self, **params: Any) -> dict[str, Any]:
        self.stopped.append(params["task"])
        return {"task": {"taskArn": params["task"]}}


class _Marks:
    def __init__(self) -> None:
        self.marked: list[int] = []

    def request_rank_stop(self, rank: Rank, why: str, now: float, *, watched: bool = False) -> bool:
        self.marked.append(rank.rank)
        return True


@pytest.fixture(autouse=True)
def frozen_clock() -> Iterator[None]:
    t = [1000.0]

    def sleep(seconds: float) -> None:
        t[0] += seconds

    clock.set_clock(lambda: t[0], sleep)
    yield
    clock.reset_clock()


def _rank() -> Rank:
    return Rank(job_id="j", rank=1, state=RankState.RUNNING, attempt=1, task_arn="arn:task/1",
                task_definition_arn="train:1", container_inst_id="ci-announced")


@pytest.mark.parametrize("failure", [LostResponse("UpdateItem: response lost"), throttled("GetItem")],
                         ids=["lost", "throttled"])
def test_a_rank_on_a_node_aws_takes_is_stopped_though_the_budgets_item_fails(failure: Exception) -> None:
    """Given the ECS budget's item failing at both tries (its read throttled, or its write's answer
    lost: the token may be taken)
    When the rank on the node AWS takes is asked to stop first
    Then its StopTask reaches ECS at the first try: the next try (the sweep's minute) may come
    after the node is gone."""
    client = _Ecs()
    budget = EcsCallBudget(_Budget([failure, failure]), TokenBucket(rate=40, burst=100))
    marks = _Marks()
    stop_first([_rank()], "suspended: AWS takes the node", marks, EcsAdapter(client, "gpu", budget=budget))
    assert marks.marked == [1]
    assert client.stopped == ["arn:task/1"]


def test_a_spent_budget_still_holds_a_deadline_stop_back() -> None:
    """Given the ECS budget spent (the stack's calls use the account's whole rate)
    When a rank on a node AWS takes is asked to stop
    Then nothing reaches ECS: the budget is kept; only its own item failing is not a reason."""
    client = _Ecs()
    budget = EcsCallBudget(_Budget([]), TokenBucket(rate=1, burst=1), max_wait_seconds=0.0)
    ecs = EcsAdapter(client, "gpu", budget=budget)
    ecs.stop_task_before_deadline("arn:task/0", "first")  # the one token
    with pytest.raises(RateLimited):
        ecs.stop_task_before_deadline("arn:task/1", "second")
    assert client.stopped == ["arn:task/0"]


def test_a_rank_first_asked_under_a_spent_budget_is_left_marked_to_the_stop_that_follows() -> None:
    """Given the ECS budget spent
    When the rank on a node AWS takes is asked to stop first
    Then it is marked asked and nothing is raised: the move goes on to the gang's stop, and the
    notice's sweep asks a marked rank again."""
    client = _Ecs()
    budget = EcsCallBudget(_Budget([]), TokenBucket(rate=1, burst=1), max_wait_seconds=0.0)
    ecs = EcsAdapter(client, "gpu", budget=budget)
    ecs.stop_task_before_deadline("arn:task/0", "the one token")
    marks = _Marks()
    stop_first([_rank()], "suspended: AWS takes the node", marks, ecs)
    assert marks.marked == [1]
    assert client.stopped == ["arn:task/0"]


def test_an_ordinary_stop_is_held_back_by_the_budgets_item_failing() -> None:
    """Given the ECS budget's item failing
    When a stop with no deadline (a gang's paced stop) is asked for
    Then nothing reaches ECS and the caller's retry (its batch, the sweep) sends it."""
    client = _Ecs()
    budget = EcsCallBudget(_Budget([throttled("UpdateItem")]), TokenBucket(rate=40, burst=100))
    with pytest.raises(ClientError):
        EcsAdapter(client, "gpu", budget=budget).stop_task("arn:task/1", "paced")
    assert client.stopped == []
