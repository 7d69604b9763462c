"""The stack's ECS budget (``adapters.ecs_budget``): callers of a burst served in turn."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpu_recovery import clock
from gpu_recovery.adapters.ecs import EcsAdapter
from gpu_recovery.adapters.ecs_budget import EcsCallBudget, RateLimited
from gpu_recovery.adapters.errors import not_sent
from gpu_recovery.domain.rate_limit import Reservation, TokenBucket, reserve
from tests.recovery.fakes import throttled


class _Store:
    """The bucket's item in memory (one TAT), reserved as the repository does."""

    def __init__(self) -> None:
        self.tat: float | None = None
        self.writes = 0

    def reserve(self, tokens: int, bucket: TokenBucket, now: float, ahead: float = 0.0) -> Reservation:
        decided = reserve(self.tat, now, tokens, bucket, ahead)
        if decided.granted:
            self.tat, self.writes = decided.tat, self.writes + 1
        return decided


def _budget_item() -> tuple[Any, Any]:
    """The in-memory DynamoDB (its meter counts the calls) and the repository's budget item."""
    from gpu_recovery import constants as C
    from gpu_recovery.repository import Repository
    from gpu_recovery.repository.rate_limit import RateLimitRepository
    from local_mode.sim.dynamo import MemoryDynamo

    jobs, instances = C.DEFAULT_JOB_TABLE_NAME, C.DEFAULT_INSTANCE_TABLE_NAME
    db = MemoryDynamo({jobs: "job", instances: "instance"})
    return db, RateLimitRepository(Repository(db, jobs, instances).tables)


@pytest.fixture
def now() -> Iterator[list[float]]:
    t = [1000.0]

    def sleep(seconds: float) -> None:
        t[0] += seconds

    clock.set_clock(lambda: t[0], sleep)
    yield t
    clock.reset_clock()


def test_callers_in_turn_wait_for_their_own_token_one_write_each(now: list[float]) -> None:
    store = _Store()
    budget = EcsCallBudget(store, TokenBucket(rate=4, burst=2))
    called_at = []
    for _ in range(6):  # one after another, each as if it had come at 1000.0
        now[0] = 1000.0 + budget.waited_seconds
        budget.acquire(1, in_turn_within=1.0)
        called_at.append(now[0])
    assert called_at == pytest.approx([1000.0, 1000.0, 1000.25, 1000.5, 1000.75, 1001.0])
    assert store.writes == 6
    now[0] = 1000.0  # a seventh at once: its token is due in 1.25 s, past its patience
    with pytest.raises(RateLimited) as refused:
        budget.acquire(1, in_turn_within=1.0)
    assert refused.value.wait_seconds == pytest.approx(0.25) and now[0] == 1000.0


def test_without_a_turn_the_budget_waits_as_before(now: list[float]) -> None:
    budget = EcsCallBudget(_Store(), TokenBucket(rate=4, burst=2), max_wait_seconds=0.3)
    budget.acquire(2)
    budget.acquire(1)  # 0.25 s
    assert now[0] == pytest.approx(1000.25)
    with pytest.raises(RateLimited):
        budget.acquire(2)  # 0.5 s: past its 0.3 s


def test_the_budget_item_serves_a_burst_in_turn_with_one_write_each(now: list[float]) -> None:
    """The repository's reservation ahead against the in-memory DynamoDB: a TAT moved by an
    atomic ADD (no read first) while the turn is within reach; one further off is refused
    with its wait, the item unchanged."""
    db, store = _budget_item()
    bucket = TokenBucket(rate=4, burst=2)
    waits = [store.reserve(1, bucket, 1000.0, 1.0) for _ in range(6)]
    assert all(w.granted for w in waits)
    assert [w.wait_seconds for w in waits] == pytest.approx([0.0, 0.0, 0.25, 0.5, 0.75, 1.0])
    refused = store.reserve(1, bucket, 1000.0, 1.0)
    assert not refused.granted and refused.wait_seconds == pytest.approx(1.25)
    assert store.reserve(1, bucket, 1000.0 + 0.25, 1.0).granted  # a token's time later: in reach again
    assert db.meter.total.calls["GetItem"] == 1  # the refusal's read only
    # A caller that does not take a turn reads the TAT the ADDs left (more digits than a
    # float: steps of 1/36 s on an epoch time) and moves it from there once its token is due.
    other = type(store)(store.base, "RATE#test-mixed")
    account = TokenBucket(rate=36, burst=3)
    t0 = 1_800_000_000.1
    assert all(other.reserve(1, account, t0, 5.0).granted for _ in range(20))
    assert not other.reserve(1, account, t0 + 0.1).granted  # not due yet
    later = other.reserve(1, account, t0 + 10.0)
    assert later.granted and later.wait_seconds == 0.0
    assert other.reserve(1, account, t0 + 10.0).granted


class _Unwritable(_Store):
    """The budget's item cannot be written (its UpdateItem throttled)."""

    def reserve(self, tokens: int, bucket: TokenBucket, now: float, ahead: float = 0.0) -> Reservation:
        raise throttled("UpdateItem")


class _Ecs:
    def __init__(self) -> None:
        self.sent = 0

    def start_task(self, **_: Any) -> dict[str, Any]:
        self.sent += 1
        return {"tasks": [], "failures": []}


def test_a_call_whose_budget_could_not_be_written_says_it_was_never_sent(now: list[float]) -> None:
    """Given the budget's own write failing
    When StartTask is asked for
    Then nothing reaches ECS and the error says so (a caller has nothing to look up)."""
    client = _Ecs()
    ecs = EcsAdapter(client, "gpu", budget=EcsCallBudget(_Unwritable(), TokenBucket(rate=1, burst=1)))
    with pytest.raises(ClientError) as raised:
        ecs.start_task(task_definition="train:1", container_instance_arn="ci-1")
    assert not_sent(raised.value) and client.sent == 0
    assert not not_sent(throttled("StartTask"))  # ECS's own refusal was sent


def test_a_call_whose_budget_is_spent_says_it_was_never_sent(now: list[float]) -> None:
    """Given the budget spent and no wait allowed
    When StartTask is asked for again
    Then it does not reach ECS and the error says so."""
    client = _Ecs()
    budget = EcsCallBudget(_Store(), TokenBucket(rate=1, burst=1), max_wait_seconds=0.0)
    ecs = EcsAdapter(client, "gpu", budget=budget)
    ecs.start_task(task_definition="train:1", container_instance_arn="ci-1")  # the one token
    with pytest.raises(RateLimited) as raised:
        ecs.start_task(task_definition="train:1", container_instance_arn="ci-1")
    assert not_sent(raised.value) and client.sent == 1


def test_callers_without_a_turn_of_their_own_reserve_ahead_and_never_poll_the_item(now: list[float]) -> None:
    """Given one budget item and callers that each take one token with the default patience
    When six come at the same instant and a seventh whose token is further off than its patience
    Then each is served in turn at the bucket's rate with one write of the item (two for the
    first: no item yet), none reads it, and the seventh is refused after one read, the item
    unchanged: a thousand-rank stop's workers once polled it ~700 times a rank."""
    db, store = _budget_item()
    budget = EcsCallBudget(store, TokenBucket(rate=4, burst=2), max_wait_seconds=1.0)
    called_at = []
    for _ in range(6):
        now[0] = 1000.0 + budget.waited_seconds  # each as if it had come at 1000.0
        budget.acquire(1)
        called_at.append(now[0])
    assert called_at == pytest.approx([1000.0, 1000.0, 1000.25, 1000.5, 1000.75, 1001.0])
    calls = db.meter.total.calls
    assert calls["UpdateItem"] == 7 and calls["GetItem"] == 0
    now[0] = 1000.0
    with pytest.raises(RateLimited) as refused:
        budget.acquire(1)
    assert refused.value.wait_seconds == pytest.approx(0.25) and now[0] == 1000.0
    assert calls["GetItem"] == 1 and calls["UpdateItem"] == 9  # two refused conditions, one read


def test_no_turn_is_waited_for_past_the_invocations_end(now: list[float]) -> None:
    """Given a busy budget (a token due every 0.25 s) and an invocation that ends 11 s from now
    When callers with a patience of 5 s take their turns one after another
    Then they are served while a turn comes before the end less the call margin (10 s), and the
    next is refused at once, nothing reserved or waited: a large cascade's attribute puts once
    waited their turns into their handler's timeout (179 at 2,048 tasks). Outside an invocation
    the same turn is waited for."""
    from gpu_recovery.adapters.ecs_budget import CALL_MARGIN_SECONDS

    store = _Store()
    budget = EcsCallBudget(store, TokenBucket(rate=4, burst=1), max_wait_seconds=5.0)
    with clock.invocation_ends(lambda: CALL_MARGIN_SECONDS + 1.0):
        served = 0
        with pytest.raises(RateLimited) as refused:
            for _ in range(10):
                budget.acquire(1)
                served += 1
        assert served == 5 and now[0] == pytest.approx(1001.0)  # at 1000, 1000.25, ... 1001.0
        assert store.writes == 5 and refused.value.wait_seconds > 0
    budget.acquire(1)  # the same turn, no invocation: waited for
    assert store.writes == 6 and now[0] == pytest.approx(1001.25)
