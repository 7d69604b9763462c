"""The answers AWS documents and the adapters and the repository must handle (issue 40,
defects 6 to 8 and the ECS ``failures`` check): a transaction cancelled for throttling, a
BatchGetItem that leaves keys unprocessed, GetLogEvents pages that are empty or partial while
more events exist, and ECS calls that answer HTTP 200 with ``failures``. Each answer is the
one the simulation layer gives (``local_mode.sim.answers``, ``local_mode.sim.log_pages``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

from gpu_recovery import clock
from gpu_recovery.adapters.ecs import EcsActionFailed, EcsAdapter
from gpu_recovery.adapters.ecs_budget import RateLimited
from gpu_recovery.adapters.logs import TrainingLogReader, VerdictLogReader
from gpu_recovery.constants import HEALTH_CHECK_CONTAINER_NAME, HEALTH_CHECK_LOG_STREAM_PREFIX
from gpu_recovery.repository import base
from gpu_recovery.repository.base import DynamoGateway, UnprocessedKeysLeft, Update
from local_mode.sim.answers import DocumentedAnswers
from local_mode.sim.dynamo import MemoryDynamo
from local_mode.sim.log_pages import LogPaging, log_page
from tests.fixtures.clock import ManualClock
from tests.fixtures.memory_repository import INSTANCES, JOBS

KEY = "job_id_rank"


@pytest.fixture
def sleeps() -> Iterator[list[float]]:
    """The installed clock: a manual one whose sleeps advance it and are recorded."""
    now = ManualClock(1_800_000_000.0)
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now.advance(seconds)

    clock.set_clock(now, sleep)
    yield slept
    clock.reset_clock()


def _gateway() -> tuple[DynamoGateway, MemoryDynamo]:
    store = MemoryDynamo({JOBS: "job", INSTANCES: "instance"})
    return DynamoGateway(store), store


def _answer_first(store: MemoryDynamo, operation: str, times: int,
                  answer: Callable[[dict[str, Any]], Any]) -> list[int]:
    """The store's client answers its first ``times`` calls of ``operation`` with ``answer``."""
    client = store.meta.client
    real = getattr(client, operation)
    calls = [0]

    def scripted(**params: Any) -> Any:
        calls[0] += 1
        return answer(params) if calls[0] <= times else real(**params)

    setattr(client, operation, scripted)
    return calls


# ------------------------------------------------------------------ defect 6: throttled transactions
def _throttled(params: dict[str, Any]) -> Any:
    _, parsed = DocumentedAnswers._throttled_transaction(len(params["TransactItems"]))
    raise ClientError(parsed, "TransactWriteItems")


def _two_writes() -> list[Update]:
    return [Update(JOBS, {KEY: "j#JOB"}, set_fields={"state": "RUNNING"},
                   condition="attribute_not_exists(#k)", condition_names={"#k": KEY}),
            Update(JOBS, {KEY: "j#0"}, set_fields={"state": "RUNNING"})]


@pytest.mark.parametrize("reason", ["ThrottlingError", "ProvisionedThroughputExceeded",
                                    "TransactionConflict"])
def test_a_transaction_cancelled_for_contention_is_tried_again_after_a_growing_jittered_pause(
        sleeps: list[float], reason: str) -> None:
    """Given TransactWriteItems answers TransactionCanceledException whose reasons name
    throttling (DynamoDB's codes: ThrottlingError, ProvisionedThroughputExceeded, not the
    ``...Exception`` spellings) twice, When the repository writes, Then it waits (on the
    installed clock, bounded, jittered) and writes: both items written."""
    db, store = _gateway()

    def cancelled(params: dict[str, Any]) -> Any:
        _, parsed = DocumentedAnswers._throttled_transaction(len(params["TransactItems"]))
        parsed["CancellationReasons"][0]["Code"] = reason
        raise ClientError(parsed, "TransactWriteItems")

    calls = _answer_first(store, "transact_write_items", 2, cancelled)
    assert db.transact(_two_writes()) is True
    assert calls[0] == 3 and len(sleeps) == 2
    assert all(0 <= s <= base.CONTENTION_BASE_SECONDS * 2 ** i for i, s in enumerate(sleeps))
    assert store.peek(JOBS, {KEY: "j#JOB"}) is not None and store.peek(JOBS, {KEY: "j#0"}) is not None


def test_a_throttled_transaction_is_retried_a_bounded_number_of_times_then_raised(
        sleeps: list[float]) -> None:
    db, store = _gateway()
    calls = _answer_first(store, "transact_write_items", 100, _throttled)
    with pytest.raises(ClientError) as raised:
        db.transact(_two_writes())
    assert raised.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert calls[0] == base.CONTENTION_RETRIES + 1
    assert all(s <= base.CONTENTION_CAP_SECONDS for s in sleeps)


def test_a_cancellation_naming_a_failed_condition_is_the_intent_refused_not_retried(
        sleeps: list[float]) -> None:
    """ConditionalCheckFailed beside a throttled item: the condition decides (False, as
    today), nothing retried; a ValidationError is raised, never retried."""
    db, store = _gateway()

    def condition_and_throttle(params: dict[str, Any]) -> Any:
        _, parsed = DocumentedAnswers._throttled_transaction(2)
        parsed["CancellationReasons"][1] = {"Code": "ConditionalCheckFailed",
                                            "Message": "The conditional request failed"}
        raise ClientError(parsed, "TransactWriteItems")

    calls = _answer_first(store, "transact_write_items", 1, condition_and_throttle)
    assert db.transact(_two_writes()) is False and calls[0] == 1 and sleeps == []

    def invalid(params: dict[str, Any]) -> Any:
        _, parsed = DocumentedAnswers._throttled_transaction(2)
        parsed["CancellationReasons"][1] = {"Code": "ValidationError", "Message": "Item size has exceeded"}
        raise ClientError(parsed, "TransactWriteItems")

    calls = _answer_first(store, "transact_write_items", 1, invalid)
    with pytest.raises(ClientError):
        db.transact(_two_writes())
    assert calls[0] == 1 and sleeps == []


def _counted_writes() -> list[Update]:
    """A first write (its condition holds once) and a count: a transaction applied twice would
    fail its condition, or count 2."""
    return [Update(JOBS, {KEY: "j#JOB"}, set_fields={"state": "RUNNING"},
                   condition="attribute_not_exists(#k)", condition_names={"#k": KEY}),
            Update(JOBS, {KEY: "j#0"}, increments={"writes": 1})]


def test_a_transaction_whose_answer_was_lost_after_it_committed_is_asked_again_with_its_token(
        sleeps: list[float]) -> None:
    """Given TransactWriteItems commits and its answer is lost (ReadTimeoutError), When the
    repository writes, Then it asks again with the same ClientRequestToken and hears success:
    True (not the condition failing on a second run), the items written once."""
    db, store = _gateway()
    tokens: list[str] = []

    def committed_then_lost(params: dict[str, Any]) -> Any:
        tokens.append(params["ClientRequestToken"])
        real(**params)
        raise ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")

    real = store.meta.client.transact_write_items
    calls = _answer_first(store, "transact_write_items", 1, committed_then_lost)
    assert db.transact(_counted_writes()) is True
    assert calls[0] == 2 and len(sleeps) == 1
    assert store.peek(JOBS, {KEY: "j#0"})["writes"] == 1

    # A new transaction of the same items is a new token: its condition decides.
    assert db.transact(_counted_writes()) is False
    assert store.peek(JOBS, {KEY: "j#0"})["writes"] == 1 and len(set(tokens)) == 1


def test_a_transaction_whose_connection_closed_before_it_ran_runs_on_the_second_ask(
        sleeps: list[float]) -> None:
    db, store = _gateway()

    def closed(params: dict[str, Any]) -> Any:
        raise ConnectionClosedError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")

    calls = _answer_first(store, "transact_write_items", 1, closed)
    assert db.transact(_counted_writes()) is True
    assert calls[0] == 2 and store.peek(JOBS, {KEY: "j#0"})["writes"] == 1


def test_an_answer_lost_every_time_is_raised_after_a_bounded_number_of_asks(sleeps: list[float]) -> None:
    """The event's redelivery then finishes what the transaction started (it reads the items)."""
    db, store = _gateway()

    def lost(params: dict[str, Any]) -> Any:
        raise ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")

    calls = _answer_first(store, "transact_write_items", 100, lost)
    with pytest.raises(ReadTimeoutError):
        db.transact(_counted_writes())
    assert calls[0] == base.OUTCOME_RETRIES + 1


def test_the_emulator_keeps_a_committed_transactions_token_for_ten_minutes() -> None:
    """As DynamoDB does (TransactWriteItems API reference, ClientRequestToken): the same token
    and items within 10 minutes succeed with no effect; other items under it are
    IdempotentParameterMismatchException; after 10 minutes the token is a new request."""
    now = ManualClock(1_800_000_000.0)
    store = MemoryDynamo({JOBS: "job", INSTANCES: "instance"}, now=now)
    client = store.meta.client
    items = [u.transact_item() for u in _counted_writes()]
    client.transact_write_items(TransactItems=items, ClientRequestToken="t-1")
    now.advance(599)
    client.transact_write_items(TransactItems=items, ClientRequestToken="t-1")
    assert store.peek(JOBS, {KEY: "j#0"})["writes"] == 1
    with pytest.raises(ClientError) as mismatch:
        client.transact_write_items(TransactItems=[*items[1:], items[0]], ClientRequestToken="t-1")
    assert mismatch.value.response["Error"]["Code"] == "IdempotentParameterMismatchException"
    now.advance(2)
    with pytest.raises(ClientError) as anew:
        client.transact_write_items(TransactItems=items, ClientRequestToken="t-1")
    assert anew.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert store.peek(JOBS, {KEY: "j#0"})["writes"] == 1


# ------------------------------------------------------------------ defect 7: unprocessed keys
def _partial(store: MemoryDynamo) -> Callable[[dict[str, Any]], Any]:
    real = store.meta.client.batch_get_item

    def answer(params: dict[str, Any]) -> Any:
        parsed = real(**params)
        DocumentedAnswers._leave_unprocessed(parsed, params)
        return parsed

    return answer


def _items(store: MemoryDynamo, count: int) -> list[dict[str, Any]]:
    keys = [{KEY: f"j#{i}"} for i in range(count)]
    for key in keys:
        store.Table(JOBS).put_item(Item={**key, "state": "RUNNING"})
    return keys


def test_unprocessed_keys_are_asked_again_after_an_exponential_jittered_back_off(sleeps: list[float]) -> None:
    """Given BatchGetItem leaves half its keys unprocessed nine times in a row (a throttled
    table), When the repository reads 8 items, Then it backs off between rounds (growing,
    jittered, capped, on the installed clock) and returns every item; before, it asked again
    at once, eight times, then raised."""
    db, store = _gateway()
    keys = _items(store, 8)
    calls = _answer_first(store, "batch_get_item", 9, _partial(store))
    found = db.batch_get(JOBS, keys)
    assert sorted(i[KEY] for i in found) == sorted(k[KEY] for k in keys)
    assert calls[0] > 8 and len(sleeps) == calls[0] - 1
    assert all(s <= min(base.BATCH_GET_CAP_SECONDS, base.BATCH_GET_BASE_SECONDS * 2 ** i)
               for i, s in enumerate(sleeps))
    assert sum(sleeps) <= base.BATCH_GET_PATIENCE_SECONDS


def test_unprocessed_keys_are_not_waited_for_past_the_invocation_deadline(sleeps: list[float]) -> None:
    """Given the invocation ends in 6 s (its entry point said so), When BatchGetItem keeps
    leaving keys unprocessed, Then the read gives up before the deadline's margin and raises
    (the invocation fails and is tried again), having waited less than a second."""
    db, store = _gateway()
    keys = _items(store, 4)
    _answer_first(store, "batch_get_item", 100, _partial(store))
    started = clock.now()
    with clock.invocation_ends(lambda: 6.0), pytest.raises(UnprocessedKeysLeft):
        db.batch_get(JOBS, keys)
    assert clock.now() - started <= 6.0 - base.BATCH_GET_MARGIN_SECONDS and sleeps
    assert clock.deadline() is None  # the entry point's block ended


# ------------------------------------------------------------------ defect 8: log pages
class PagedLogs:
    """A CloudWatch Logs client answering GetLogEvents over ``lines`` as the service pages
    (``log_pages``: ``page_events`` a page, every ``empty_every``-th call empty)."""

    class exceptions:  # boto3's attribute
        class ResourceNotFoundException(Exception):
            pass

    def __init__(self, lines: list[str], paging: LogPaging, now: float = 2_000_000_000.0) -> None:
        self.events = [{"timestamp": 1_000_000_000_000 + i, "message": line, "ingestedAt": 1_000_000_000.0}
                       for i, line in enumerate(lines)]
        self.paging, self.now, self.calls = paging, now, 0

    def get_log_events(self, **params: Any) -> dict[str, Any]:
        self.calls += 1
        every = self.paging.empty_every
        return log_page(self.events, params, now=self.now, paging=self.paging,
                        empty=bool(every and self.calls % every == 0), nonce=self.calls)


VERDICT = '{"verdict": "replace", "exit_code": 2, "failed_tests": ["memory"]}'


def test_the_verdict_line_is_found_behind_empty_and_partial_pages() -> None:
    """Given the check's stream ends with its verdict then 7 lines of teardown, read 2 a page
    with an empty page every second call, When the verdict is read, Then the backward token
    is followed to it (the first, empty, page is not the end)."""
    logs = PagedLogs(["starting", VERDICT, *(f"teardown {i}" for i in range(7))],
                     LogPaging(page_events=2, empty_every=2, visible_after=0))
    logs.calls = 1  # the first call answers an empty page
    assert VerdictLogReader(logs, "/ecs/gpu-health-check").read_verdict("arn:task/c/abc") == \
        {"verdict": "replace", "exit_code": 2, "failed_tests": ["memory"]}


def test_no_verdict_line_yet_is_none_after_the_token_comes_back_unchanged() -> None:
    logs = PagedLogs([VERDICT], LogPaging(page_events=5, empty_every=0, visible_after=30))
    logs.now = logs.events[0]["ingestedAt"] + 10  # written 10 s ago, readable after 30
    reader = VerdictLogReader(logs, "/ecs/gpu-health-check")
    assert reader.read_verdict("arn:task/c/abc") is None and logs.calls == 2
    logs.now += 30
    assert reader.read_verdict("arn:task/c/abc") is not None


def test_the_verdict_stream_is_the_health_checks_own() -> None:
    seen: list[dict[str, Any]] = []

    class Recorder(PagedLogs):
        def get_log_events(self, **params: Any) -> dict[str, Any]:
            seen.append(params)
            return super().get_log_events(**params)

    VerdictLogReader(Recorder([VERDICT], LogPaging()), "g").read_verdict("arn:aws:ecs:r:1:task/c/abc")
    assert seen[0]["logStreamName"] == f"{HEALTH_CHECK_LOG_STREAM_PREFIX}/{HEALTH_CHECK_CONTAINER_NAME}/abc"


def test_an_empty_page_of_a_training_log_is_not_its_end() -> None:
    """The training log reader gives one page and its token; the page's emptiness says
    nothing: the same token comes back only at the end."""
    logs = PagedLogs(["a", "b", "c"], LogPaging(page_events=2, empty_every=1, visible_after=0))
    page = TrainingLogReader(logs).read_stream("g", "s", limit=100)
    assert page["events"] == [] and page["next_token"]
    logs.paging = LogPaging(page_events=2, empty_every=0, visible_after=0)
    token, lines = page["next_token"], []
    while True:
        page = TrainingLogReader(logs).read_stream("g", "s", limit=100, next_token=token)
        lines += [e["message"] for e in page["events"]]
        if page["next_token"] == token:
            break
        token = page["next_token"]
    assert lines == ["a", "b", "c"]


# ------------------------------------------------------------------ ECS failures in a 200
class Ecs:
    """An ECS client answering from ``answers`` (operation -> list of responses, in turn)."""

    def __init__(self, **answers: list[dict[str, Any]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Callable[..., dict[str, Any]]:
        def call(**params: Any) -> dict[str, Any]:
            self.calls.append(name)
            return self.answers[name].pop(0)
        return call


ARN = "arn:aws:ecs:us-east-1:123456789012:container-instance/c/abc"


def test_a_drain_ecs_answers_with_a_failure_is_not_a_drain() -> None:
    """UpdateContainerInstancesState answers 200 with ``failures``: drain() raises (the
    quarantine is not recorded; the sweep tries again), unless ECS says MISSING / INACTIVE
    and the instance's description agrees it is not registered (nothing can be placed on it)."""
    ok = {"containerInstances": [{"containerInstanceArn": ARN, "status": "DRAINING"}], "failures": []}
    assert EcsAdapter(Ecs(update_container_instances_state=[ok]), "c").drain(ARN) == "draining"
    missing = {"containerInstances": [], "failures": [{"arn": ARN, "reason": "MISSING"}]}
    still_there = {"containerInstances": [{"containerInstanceArn": ARN, "status": "ACTIVE"}], "failures": []}
    ecs = Ecs(update_container_instances_state=[dict(missing)], describe_container_instances=[still_there])
    with pytest.raises(EcsActionFailed, match="MISSING"):
        EcsAdapter(ecs, "c").drain(ARN)
    gone = {"containerInstances": [], "failures": [{"arn": ARN, "reason": "MISSING"}]}
    ecs = Ecs(update_container_instances_state=[dict(missing)], describe_container_instances=[gone])
    assert EcsAdapter(ecs, "c").drain(ARN) == "deregistered"
    inactive = {"containerInstances": [{"containerInstanceArn": ARN, "status": "INACTIVE"}], "failures": []}
    ecs = Ecs(update_container_instances_state=[{"failures": [{"arn": ARN, "reason": "INACTIVE"}]}],
              describe_container_instances=[inactive])
    assert EcsAdapter(ecs, "c").drain(ARN) == "deregistered"
    odd = {"containerInstances": [], "failures": [{"arn": ARN, "reason": "OTHER", "detail": "x"}]}
    with pytest.raises(EcsActionFailed, match="OTHER"):
        EcsAdapter(Ecs(update_container_instances_state=[odd]), "c").drain(ARN)


def test_describe_calls_answer_missing_as_not_found_and_raise_other_failures() -> None:
    task = "arn:aws:ecs:us-east-1:123456789012:task/c/t1"
    missing = {"tasks": [], "failures": [{"arn": task, "reason": "MISSING"}]}
    assert EcsAdapter(Ecs(describe_tasks=[missing]), "c").describe_task(task) is None
    assert EcsAdapter(Ecs(describe_tasks=[missing]), "c").describe_tasks([task]) == []
    with pytest.raises(EcsActionFailed):
        EcsAdapter(Ecs(describe_tasks=[{"tasks": [], "failures": [{"arn": task, "reason": "OTHER"}]}]),
                   "c").describe_task(task)
    gone = {"containerInstances": [], "failures": [{"arn": ARN, "reason": "MISSING"}]}
    assert EcsAdapter(Ecs(describe_container_instances=[gone]), "c").describe_container_instance(ARN) is None


def test_is_agent_connected_reads_ecs_and_takes_a_describe_token_first() -> None:
    """ECS's ``agentConnected`` (None: the node MISSING); a Describe budget with no token makes no
    call at all (the caller reads that as no answer)."""

    class Counted:
        def __init__(self, refuse: bool = False) -> None:
            self.taken, self.refuse = 0, refuse

        def acquire(self, calls: int, *, in_turn_within: float | None = None) -> None:
            if self.refuse:
                raise RateLimited(1.0)
            self.taken += calls

    node = {"containerInstanceArn": ARN, "status": "ACTIVE", "agentConnected": False}
    away = {"containerInstances": [node], "failures": []}
    gone = {"containerInstances": [], "failures": [{"arn": ARN, "reason": "MISSING"}]}
    budget = Counted()
    ecs = Ecs(describe_container_instances=[away, gone])
    adapter = EcsAdapter(ecs, "c", describe_budget=budget)
    assert adapter.is_agent_connected(ARN) is False and adapter.is_agent_connected(ARN) is None
    assert budget.taken == 2
    refused = Ecs()
    with pytest.raises(RateLimited):
        EcsAdapter(refused, "c", describe_budget=Counted(refuse=True)).is_agent_connected(ARN)
    assert refused.calls == []


def test_a_start_task_refused_on_one_of_its_instances_reports_what_was_placed() -> None:
    """StartTask on two instances, one refused in ``failures``: the result says which
    instance got which task, and which failed (the gang restart registers the one placed
    and retries the other; a single-instance start with no task is a placement failure)."""
    other = ARN.replace("abc", "def")
    answer = {"tasks": [{"taskArn": "arn:task/c/t1", "containerInstanceArn": ARN}],
              "failures": [{"arn": other, "reason": "RESOURCE:GPU"}]}
    result = EcsAdapter(Ecs(start_task=[answer]), "c").start_task(task_definition="td",
                                                                   container_instance_arns=[ARN, other])
    assert result.placed == {ARN: "arn:task/c/t1"} and not result.placement_failed
    assert [f["reason"] for f in result.failures] == ["RESOURCE:GPU"]
    refused = EcsAdapter(Ecs(start_task=[{"tasks": [], "failures": [{"arn": ARN, "reason": "AGENT"}]}]),
                         "c").start_task(task_definition="td", container_instance_arn=ARN)
    assert refused.placement_failed and refused.task_arns == []
