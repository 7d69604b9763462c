"""The answers AWS documents and moto never gives, given by the moto world
(``LocalAws.answers``, botocore hooks on the handlers' session): the stack must handle each.

Always on (``LocalAws(log_paging=...)`` to change them):

* **GetLogEvents** pages as CloudWatch Logs does (``local_mode.sim.log_pages``): partial and
  empty pages with their tokens, lines readable some seconds after they were written; read
  from moto's CloudWatch Logs, answered here. When a line was written in simulated time is
  recorded from the PutLogEvents calls of the sessions it watches (``ingest``); a line
  written otherwise is readable at once.

In a documented failure shape (:data:`SHAPES`), when asked for: the crash campaigns break a
call in its operation's shape (``CallFaults.arm(n, shape)``), ``every[shape] = n`` answers
every n-th call of each operation in it (tests, the soak):

* ``cancelled_throttled`` — **TransactWriteItems** refused as DynamoDB refuses a transaction
  it throttled: TransactionCanceledException with one reason per item (``ThrottlingError``
  for the first, ``None`` for the others; TransactWriteItems API reference), nothing written;
* ``unprocessed_keys`` — **BatchGetItem** answering a partial batch: the later half of the
  keys (at least one) in ``UnprocessedKeys`` instead of ``Responses`` (BatchGetItem API
  reference: throttling, 1 MB per partition, an internal failure);
* ``empty_log_page`` — **GetLogEvents** answering an empty page whose tokens move on;
* ``ecs_failures`` — HTTP 200 with ``failures`` ("API failure reasons", ECS developer
  guide): **StartTask** places nothing on its last container instance (``RESOURCE:GPU``),
  **DescribeTasks** / **DescribeContainerInstances** answer their last resource ``MISSING``
  (ECS is eventually consistent), **UpdateContainerInstancesState** changes nothing and
  answers ``MISSING``;
* ``batch_entry_failed`` — **SendMessageBatch** answering HTTP 200 with its last entry in
  ``Failed`` (a ``BatchResultErrorEntry``, ``SenderFault`` false: the service's fault, not
  the request's; the SQS API Reference names no codes, ``InternalError`` is used), the others
  sent.

A shape is answered the same on moto's DynamoDB and on the in-memory store (the same
botocore events reach both); ``given`` lists every shaped answer.
"""

from __future__ import annotations

import copy
import json
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from moto.logs.models import logs_backends

from gpu_recovery import clock as gr_clock

from ..api_hooks import PARAMS_KEY, hook_answer, hook_error
from ..events import ACCOUNT_ID, REGION
from .log_pages import InvalidLogToken, LogPaging, log_page

#: the context key a call's requested shape travels in (set before the call is answered)
SHAPE_KEY = "local_mode_answer_shape"
_CALLER_KEY = "local_mode_caller_request"  # the caller's own parameters (before boto3's mapping)
_START_FAILURE_KEY = "local_mode_refused_instance"
_FAILED_ENTRY_KEY = "local_mode_failed_entry"

CANCELLED_THROTTLED = "cancelled_throttled"
UNPROCESSED_KEYS = "unprocessed_keys"
EMPTY_LOG_PAGE = "empty_log_page"
ECS_FAILURES = "ecs_failures"
BATCH_ENTRY_FAILED = "batch_entry_failed"
SHAPE_MODES = (CANCELLED_THROTTLED, UNPROCESSED_KEYS, EMPTY_LOG_PAGE, ECS_FAILURES, BATCH_ENTRY_FAILED)
#: (botocore service id, operation) -> the documented failure shape its answer can take
SHAPES: dict[tuple[str, str], str] = {
    ("dynamodb", "TransactWriteItems"): CANCELLED_THROTTLED,
    ("dynamodb", "BatchGetItem"): UNPROCESSED_KEYS,
    ("cloudwatch-logs", "GetLogEvents"): EMPTY_LOG_PAGE,
    ("ecs", "StartTask"): ECS_FAILURES,
    ("ecs", "DescribeTasks"): ECS_FAILURES,
    ("ecs", "DescribeContainerInstances"): ECS_FAILURES,
    ("ecs", "UpdateContainerInstancesState"): ECS_FAILURES,
    ("sqs", "SendMessageBatch"): BATCH_ENTRY_FAILED,
}
#: what DynamoDB says of a throttled item of an on-demand table (TransactionCanceledException)
THROTTLED_ITEM_MESSAGE = ("Throughput exceeds the current capacity of your table or index. DynamoDB is "
                          "automatically scaling your table or index so please try again shortly.")


def shape_for(service: str, operation: str) -> str | None:
    """The failure shape an operation's answer can take (None: none modelled)."""
    return SHAPES.get((service, operation))


def _key(model: Any) -> tuple[str, str]:
    return model.service_model.service_id.hyphenize(), model.name


def _body(request: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-protocol request's parameters (moto's: serialized; the in-memory store's: as is)."""
    body = request.get("body")
    if isinstance(body, dict):
        return body
    return json.loads(body or b"{}") if isinstance(body, bytes | str) else {}


def _matches(item: Mapping[str, Any], key: Mapping[str, Any]) -> bool:
    return all(item.get(name) == value for name, value in key.items())


@dataclass
class DocumentedAnswers:
    """The moto world's documented answers (module docstring); ``install`` hooks them on a
    botocore event system after ``CallFaults``' before-call hook and before its after-call one."""

    paging: LogPaging = field(default_factory=LogPaging)
    #: shape -> every n-th call of an operation that can take it is answered in it (0: never)
    every: dict[str, int] = field(default_factory=dict)
    #: (service, operation, shape) of every answer given in a shape, in order
    given: list[tuple[str, str, str]] = field(default_factory=list)
    now: Callable[[], float] = gr_clock.now  # the installed clock's (simulated time in a world)
    _calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: (group, stream) -> (timestamp, message) -> when it was written (simulated seconds)
    _written: dict[tuple[str, str], dict[tuple[int, str], float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def install(self, events: Any) -> None:
        events.register_first("before-parameter-build.dynamodb.BatchGetItem", self.before_parameter_build)
        events.register_first("before-call", self.before_call)
        events.register_last("after-call", self.after_call)
        self.watch_writes(events)

    def watch_writes(self, events: Any) -> None:
        """Record when the lines that ``events``' clients write are written (PutLogEvents)."""
        events.register("before-parameter-build.cloudwatch-logs.PutLogEvents", self.ingest)

    def ingest(self, params: Mapping[str, Any], **_: Any) -> None:
        stream = (str(params.get("logGroupName")), str(params.get("logStreamName")))
        now = self.now()
        with self._lock:
            written = self._written.setdefault(stream, {})
            for event in params.get("logEvents") or []:
                written.setdefault((int(event["timestamp"]), str(event["message"])), now)

    # ------------------------------------------------------------------ which shape
    def _shape(self, key: tuple[str, str], context: dict[str, Any]) -> str | None:
        shape = SHAPES.get(key)
        with self._lock:
            self._calls[key] += 1
            every = self.every.get(shape or "", 0)
            asked = context.get(SHAPE_KEY)
            if shape is None or (asked != shape and not (every and self._calls[key] % every == 0)):
                return None
            context[SHAPE_KEY] = shape
            self.given.append((*key, shape))
        return shape

    # ------------------------------------------------------------------ botocore hooks
    def before_parameter_build(self, params: Mapping[str, Any], context: Any = None, **_: Any) -> None:
        """BatchGetItem's keys as the caller gave them (a resource's Python types, or DynamoDB
        JSON): its unprocessed keys go back to it in the same form."""
        if context is not None:
            context[_CALLER_KEY] = copy.deepcopy(dict(params))

    def before_call(self, model: Any, params: Any, context: Any = None, **_: Any) -> Any:
        if context is None:
            return None
        key = _key(model)
        if key not in SHAPES:
            return None
        shape = self._shape(key, context)
        if key == ("cloudwatch-logs", "GetLogEvents"):
            return self._log_events(_body(params), empty=shape == EMPTY_LOG_PAGE)
        if shape is None:
            return None
        if key == ("dynamodb", "TransactWriteItems"):
            return self._throttled_transaction(len(_body(params).get("TransactItems") or []))
        if key == ("ecs", "UpdateContainerInstancesState"):
            arns = _body(params).get("containerInstances") or []
            return hook_answer("ecs", {"containerInstances": [],
                                       "failures": [{"arn": arn, "reason": "MISSING"} for arn in arns]})
        if key == ("ecs", "StartTask"):
            return self._refuse_last_instance(params, context)
        if key == ("sqs", "SendMessageBatch"):
            return self._fail_last_entry(params, context)
        return None  # reshaped after the call (BatchGetItem, Describe*)

    def after_call(self, http_response: Any = None, parsed: Any = None, model: Any = None,
                   context: Any = None, **_: Any) -> None:
        if context is None or parsed is None or getattr(http_response, "status_code", 200) >= 300:
            return
        shape, key = context.get(SHAPE_KEY), _key(model)
        if shape is None or SHAPES.get(key) != shape:
            return
        if key == ("dynamodb", "BatchGetItem"):
            self._leave_unprocessed(parsed, context.get(_CALLER_KEY) or {})
        elif key == ("ecs", "DescribeTasks"):
            self._answer_missing(parsed, "tasks", "taskArn")
        elif key == ("ecs", "DescribeContainerInstances"):
            self._answer_missing(parsed, "containerInstances", "containerInstanceArn")
        elif key == ("ecs", "StartTask") and context.get(_START_FAILURE_KEY):
            parsed.setdefault("failures", []).append(
                {"arn": context[_START_FAILURE_KEY], "reason": "RESOURCE:GPU"})
        elif key == ("sqs", "SendMessageBatch") and context.get(_FAILED_ENTRY_KEY):
            parsed.setdefault("Failed", []).append(_failed_entry(context[_FAILED_ENTRY_KEY]))

    # ------------------------------------------------------------------ the answers
    def _log_events(self, params: Mapping[str, Any], *, empty: bool) -> Any:
        try:
            backend = logs_backends[ACCOUNT_ID][REGION]
            group = backend.groups.get(str(params.get("logGroupName") or params.get("logGroupIdentifier")))
            stream = group.streams.get(str(params.get("logStreamName"))) if group is not None else None
            if stream is None:
                what = "log group" if group is None else "log stream"
                return hook_error("logs", "ResourceNotFoundException",
                                  f"The specified {what} does not exist.")
            with self._lock:
                nonce = self._calls[("cloudwatch-logs", "GetLogEvents")]
                written = self._written.get((str(stream.log_group.name), str(stream.log_stream_name)), {})
                # moto's lines, and the simulation's own: moto drops a line more than 14 days
                # older than the wall clock, and simulated time starts on a fixed day.
                moto_lines = (event.to_response_dict() for event in stream.events)
                stored = {(e["timestamp"], e["message"]): e for e in moto_lines}
                for line in written:
                    stored.setdefault(line, {"timestamp": line[0], "message": line[1]})
                events = sorted(({**e, "ingestedAt": written.get(line)} for line, e in stored.items()),
                                key=lambda e: e["timestamp"])
            every = self.paging.empty_every
            empty = empty or bool(every and nonce % every == 0)
            return hook_answer("logs", log_page(events, params, now=self.now(), paging=self.paging,
                                                empty=empty, nonce=nonce))
        except InvalidLogToken as error:
            return hook_error("logs", "InvalidParameterException", str(error))

    @staticmethod
    def _throttled_transaction(items: int) -> Any:
        reasons: list[dict[str, Any]] = [{"Code": "ThrottlingError", "Message": THROTTLED_ITEM_MESSAGE}]
        reasons += [{"Code": "None"} for _ in range(max(items, 1) - 1)]
        codes = ", ".join(r["Code"] for r in reasons)
        http, parsed = hook_error("dynamodb", "TransactionCanceledException",
                                  f"Transaction cancelled, please refer cancellation reasons for specific "
                                  f"reasons [{codes}]")
        parsed["CancellationReasons"] = reasons
        parsed["Message"] = parsed["Error"]["Message"]
        return http, parsed

    @staticmethod
    def _refuse_last_instance(request: dict[str, Any], context: dict[str, Any]) -> Any:
        """StartTask places nothing on its last instance: answered at once for a single one,
        else the call goes on without it (the simulated data plane places the others)."""
        body = _body(request)
        instances = list(body.get("containerInstances") or [])
        if len(instances) <= 1:
            return hook_answer("ecs", {"tasks": [], "failures": [{"arn": arn, "reason": "RESOURCE:GPU"}
                                                                 for arn in instances]})
        refused = instances.pop()
        body["containerInstances"] = instances
        request["body"] = body if isinstance(request.get("body"), dict) else json.dumps(body).encode()
        stashed = context.get(PARAMS_KEY)
        if isinstance(stashed, dict) and stashed.get("containerInstances"):
            stashed["containerInstances"] = [i for i in stashed["containerInstances"] if i != refused]
        context[_START_FAILURE_KEY] = refused
        return None

    @staticmethod
    def _fail_last_entry(request: dict[str, Any], context: dict[str, Any]) -> Any:
        """SendMessageBatch sends all but its last entry, which is answered ``Failed``: at
        once for a batch of one, else the call goes on without it."""
        body = _body(request)
        entries = list(body.get("Entries") or [])
        if len(entries) <= 1:
            return hook_answer("sqs", {"Successful": [], "Failed": [_failed_entry(e["Id"]) for e in entries]})
        failed = entries.pop()
        body["Entries"] = entries
        request["body"] = body if isinstance(request.get("body"), dict) else json.dumps(body).encode()
        stashed = context.get(PARAMS_KEY)
        if isinstance(stashed, dict) and stashed.get("Entries"):
            stashed["Entries"] = [e for e in stashed["Entries"] if e.get("Id") != failed["Id"]]
        context[_FAILED_ENTRY_KEY] = failed["Id"]
        return None

    @staticmethod
    def _leave_unprocessed(parsed: dict[str, Any], caller: Mapping[str, Any]) -> None:
        requests = caller.get("RequestItems") or {}
        unprocessed: dict[str, Any] = {}
        for table, request in requests.items():
            keys = list(request.get("Keys") or [])
            left = keys[len(keys) // 2:]
            if not left:
                continue
            unprocessed[table] = {**request, "Keys": left}
            found = parsed.get("Responses", {}).get(table, [])
            parsed.setdefault("Responses", {})[table] = [
                item for item in found if not any(_matches(item, k) for k in left)]
        parsed["UnprocessedKeys"] = unprocessed

    @staticmethod
    def _answer_missing(parsed: dict[str, Any], member: str, arn_field: str) -> None:
        described = parsed.get(member) or []
        if described:
            gone = described.pop()
            parsed.setdefault("failures", []).append({"arn": gone.get(arn_field, ""), "reason": "MISSING"})


def _failed_entry(entry_id: str) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": False, "Code": "InternalError",
            "Message": "The request processing has failed because of an unknown error, exception or failure."}
