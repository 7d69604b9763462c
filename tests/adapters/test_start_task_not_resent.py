"""StartTask has no idempotency token: an attempt that may have started its task is not sent
again by botocore's retry (``gpu_recovery.adapters.aws.NOT_RESENT_ONCE_SENT``); its error reaches
the caller, which looks the task up by its startedBy first. The clients are the stack's own
(``aws.client``), their HTTP answered by a ``before-send`` hook that counts what is sent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from gpu_recovery.adapters import aws

CLUSTER = "arn:aws:ecs:us-east-1:123456789012:cluster/gpu"
START = {"cluster": CLUSTER, "taskDefinition": "train:1", "containerInstances": ["ci-1"],
         "startedBy": "gpurec-j-a1-r0"}
DESCRIBE = {"cluster": CLUSTER, "tasks": ["arn:aws:ecs:us-east-1:123456789012:task/gpu/t1"]}


def _answer(status: int, body: bytes) -> AWSResponse:
    class Raw:
        def stream(self, **_: Any) -> Iterator[bytes]:
            yield body

    return AWSResponse("https://ecs.us-east-1.amazonaws.com/", status, HTTPHeaders(), Raw())


class Sent:
    """Answers every attempt with ``outcome`` and counts the attempts."""

    def __init__(self, outcome: str) -> None:
        self.outcome = outcome
        self.attempts = 0

    def __call__(self, request: Any, **_: Any) -> AWSResponse | None:
        self.attempts += 1
        if self.outcome == "answer lost":
            raise ReadTimeoutError(endpoint_url=request.url)
        if self.outcome == "never connected":
            raise EndpointConnectionError(endpoint_url=request.url)
        if self.outcome == "server error":
            return _answer(500, b'{"__type":"ServerException","message":"internal"}')
        return _answer(400, b'{"__type":"ThrottlingException","message":"Rate exceeded"}')


@pytest.fixture
def ecs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("botocore.endpoint.time.sleep", lambda _: None)  # the back-off
    aws.reset()
    try:
        yield aws.client("ecs")
    finally:
        aws.reset()


def _call(ecs: Any, outcome: str, operation: str) -> tuple[int, Exception]:
    sent = Sent(outcome)
    ecs.meta.events.register_first(f"before-send.ecs.{operation}", sent)
    with pytest.raises(Exception) as raised:
        if operation == "StartTask":
            ecs.start_task(**START)
        else:
            ecs.describe_tasks(**DESCRIBE)
    return sent.attempts, raised.value


@pytest.mark.parametrize("outcome", ["answer lost", "server error"])
def test_a_start_task_that_may_have_started_its_task_is_not_sent_again(ecs: Any, outcome: str) -> None:
    attempts, error = _call(ecs, outcome, "StartTask")
    assert attempts == 1
    assert isinstance(error, ReadTimeoutError if outcome == "answer lost" else ClientError)


@pytest.mark.parametrize("outcome", ["throttled", "never connected"])
def test_a_start_task_that_did_nothing_is_retried_as_any_call(ecs: Any, outcome: str) -> None:
    attempts, error = _call(ecs, outcome, "StartTask")
    assert attempts == aws.MAX_RETRIES + 1
    assert isinstance(error, ClientError if outcome == "throttled" else EndpointConnectionError)


@pytest.mark.parametrize("outcome", ["answer lost", "server error"])
def test_other_calls_keep_the_standard_retries(ecs: Any, outcome: str) -> None:
    attempts, _ = _call(ecs, outcome, "DescribeTasks")
    assert attempts == aws.MAX_RETRIES + 1
