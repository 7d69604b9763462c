"""The CPU-only shortcuts around each simulated AWS call change no answer: the fault injector's
call sites (``broken_calls._call_site``) and the store-served DynamoDB client's event emission
(``botocore_backend.StoreTransport``); and the grants guard reads the run's settings for every
call (what a cache of its policies would have to keep)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

import boto3
import pytest

from gpu_recovery import constants as C
from local_mode.api_hooks import hook_answer
from local_mode.sim import broken_calls
from local_mode.sim.contract.grants import GrantDenied, GrantsGuard, expecting_denials
from local_mode.sim.dynamo import MemoryDynamo
from local_mode.sim.dynamo.botocore_backend import serve_client

JOBS = "jobs"
KEY = {"job_id_rank": {"S": "job-1#job"}}


# ================================================================ the fault injector's call sites
def _defined_in(filename: str, name: str, body: str, namespace: dict[str, Any]) -> Callable[[], Any]:
    """A function named ``name`` whose code says it lives in ``filename``."""
    exec(compile(f"def {name}():\n    return {body}\n", filename, "exec"), namespace)  # noqa: S102
    return namespace[name]  # type: ignore[no-any-return]


def test_a_call_site_is_each_recovery_function_s_own_through_a_shared_mechanism() -> None:
    """A site is the innermost frame of the recovery code outside the shared mechanisms, named
    by its file and its own function: two functions of one file keep their own names, asked
    again (answered from what the first walk remembered of each file), and a Windows path is
    the same file."""
    namespace: dict[str, Any] = {"_call_site": broken_calls._call_site}
    _defined_in("/src/lambdas/gpu_recovery/adapters/ecs.py", "start_task", "_call_site()", namespace)
    _defined_in("/src/lambdas/gpu_recovery/repository/jobs.py", "save", "start_task()", namespace)
    issue = _defined_in("/src/lambdas/gpu_recovery/recovery/reboots.py", "issue", "save()", namespace)
    retry = _defined_in("/src/lambdas/gpu_recovery/recovery/reboots.py", "retry", "start_task()", namespace)
    gang = _defined_in("C:\\src\\lambdas\\gpu_recovery\\recovery\\gangs.py", "restart", "start_task()",
                       namespace)
    outside = _defined_in("/src/local_mode/sim/ecs.py", "serve", "start_task()", namespace)
    for _ in range(2):
        assert [issue(), retry(), gang(), outside()] == [
            "recovery/reboots.py:issue", "recovery/reboots.py:retry", "recovery/gangs.py:restart", "?"]


def test_a_call_tried_again_at_once_or_made_in_a_lambda_is_named_by_the_function_that_made_it() -> None:
    """``once_more`` is a shared mechanism: a call through it is its caller's, named with the way
    it went (``issue.twice``), apart from the calls its caller makes itself (the crash
    campaigns' sample breaks the first of each). A ``lambda``'s call is named by its enclosing
    function (``_assess.<lambda>``), not ``<lambda>`` of its file."""
    namespace: dict[str, Any] = {"_call_site": broken_calls._call_site}
    _defined_in("/src/lambdas/gpu_recovery/repository/jobs.py", "save", "_call_site()", namespace)
    exec(compile("def twice(step):\n    return step()\n",  # noqa: S102
                 "/src/lambdas/gpu_recovery/once_more.py", "exec"), namespace)
    issue = _defined_in("/src/lambdas/gpu_recovery/recovery/reboots.py", "issue", "twice(save)", namespace)
    confirm = _defined_in("/src/lambdas/gpu_recovery/recovery/reboots.py", "confirm", "save()", namespace)
    assess = _defined_in("/src/lambdas/gpu_recovery/recovery/task_events.py", "_assess",
                         "twice(lambda: save())", namespace)
    assert [issue(), confirm(), assess()] == [
        "recovery/reboots.py:issue.twice", "recovery/reboots.py:confirm",
        "recovery/task_events.py:_assess.<lambda>"]


# ================================================================ the grants guard's policies
class _Facts:
    region, account, cluster = "us-east-1", "123456789012", "gpu-cluster"

    def partition_key(self, table: str) -> str | None:
        return None


def test_a_variant_s_grants_follow_the_settings_of_each_call() -> None:
    """A variant's statements count while the run's settings choose it, and only for the
    functions it names: the settings are read again for every call (a function without a
    variant is refused whatever they say)."""
    get_item = {"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": "*"}
    data = {"functions": {m: {"function": m, "statements": [], "platform": []}
                          for m in ("ecs_task_handler", "jobs_api")},
            "variants": {"replace_action=terminate_in_asg": {"ecs_task_handler": [get_item]}}}
    env: dict[str, str] = {}
    guard = GrantsGuard(_Facts(), lambda text: text, data=data, env=env)  # type: ignore[arg-type]

    def allowed(function: str) -> bool:
        with expecting_denials() as denied, contextlib.suppress(GrantDenied):
            guard.check("dynamodb", "GetItem", {"TableName": JOBS, "Key": KEY}, function=function)
        return not denied

    chosen = json.dumps({"replace_action": "terminate_in_asg"})
    seen = []
    for settings in ("", chosen, "", chosen):
        env[C.ENV_REMEDIATION_SETTINGS] = settings
        seen.append((allowed("ecs_task_handler"), allowed("jobs_api")))
    assert seen == [(False, False), (True, False), (False, False), (True, False)]


# ================================================================ the store-served client's events
EVENTS = ("provide-client-params", "before-parameter-build", "before-call", "before-send",
          "needs-retry", "after-call")


def _client() -> Any:
    session = boto3.session.Session(region_name="us-east-1", aws_access_key_id="testing",
                                    aws_secret_access_key="testing")
    return serve_client(session.client("dynamodb"), MemoryDynamo({JOBS: "job"}))


def _recorded_calls(client: Any) -> list[tuple[str, str, tuple[str, ...]]]:
    """Every handler call of two GetItems and two PutItems: (event, handler, its arguments)."""
    seen: list[tuple[str, str, tuple[str, ...]]] = []

    def recorder(name: str) -> Callable[..., None]:
        def record(**kwargs: Any) -> None:
            seen.append((kwargs["event_name"], name, tuple(sorted(kwargs))))
        return record

    for event in EVENTS:
        client.meta.events.register(event, recorder(f"{event} 1"))
        client.meta.events.register(event, recorder(f"{event} 2"))
    for n in ("1", "2"):  # the first looked up by botocore, the second from its cache
        client.get_item(TableName=JOBS, Key=KEY)
        client.put_item(TableName=JOBS, Item={**KEY, "n": {"N": n}})
    return seen


def test_the_handlers_are_called_as_botocore_s_emitter_calls_them(caplog: pytest.LogCaptureFixture) -> None:
    """The same handlers, in the same order, with the same arguments, as botocore's own
    emission (which runs while its debug log is on: it logs each handler call)."""
    fast = _recorded_calls(_client())
    with caplog.at_level(logging.DEBUG, logger="botocore.hooks"):
        by_botocore = _recorded_calls(_client())
    logged = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("Event before-call.dynamodb.GetItem: calling handler") for m in logged)
    assert fast == by_botocore
    assert [event for event, name, _ in fast[:12] if name.endswith(" 1")] == [
        f"{event}.dynamodb.GetItem" for event in EVENTS]


def test_a_handler_registered_or_unregistered_between_calls_is_seen_at_once() -> None:
    """Registering and unregistering empty botocore's lookup cache: the next calls see the
    handlers as they are then (the first looked up by botocore, the second from its cache),
    and a before-call answer stops the handlers after it."""
    client = _client()
    for _ in range(2):  # every event of a GetItem looked up, then answered from the cache
        client.get_item(TableName=JOBS, Key=KEY)
    seen: list[str] = []

    def answer(**_: Any) -> Any:
        seen.append("answer")
        return hook_answer("dynamodb", {"Item": {"answered": {"S": "by a hook"}}})

    def later(**_: Any) -> None:
        seen.append("later")

    client.meta.events.register("before-call.dynamodb.GetItem", answer)
    client.meta.events.register("before-call.dynamodb.GetItem", later)
    for _ in range(2):
        assert client.get_item(TableName=JOBS, Key=KEY)["Item"] == {"answered": {"S": "by a hook"}}
    assert seen == ["answer", "answer"]
    client.meta.events.unregister("before-call.dynamodb.GetItem", answer)
    for _ in range(2):
        assert "Item" not in client.get_item(TableName=JOBS, Key=KEY)
    assert seen == ["answer", "answer", "later", "later"]
