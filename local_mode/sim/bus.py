"""``EventBus``: the one EventBridge of both simulated worlds, with its SQS event sources and
Lambda's asynchronous retry policy.

What the bus owns, for both worlds:

* **rules** ``(name, pattern, target)``: the *deployed* patterns from
  ``gpu_recovery.event_patterns``, matched with moto's EventBridge matcher (here only) on
  the event with its arrays of objects crushed as EventBridge's matcher does
  (:func:`pattern_matches`);
* **at-least-once copies**: every event reaches every matching rule's target ``copies``
  times (2: EventBridge's duplicates, the same ``id``);
* **schedules** (``rate()`` rules): "Scheduled Event" events every ``every_seconds``;
* **Lambda's asynchronous retry policy** (:func:`async_retry_delay`, from
  ``deployment.AsyncRetries``: 2 retries about 1 and 2 minutes apart, within the maximum
  event age) and the **dead letters** it ends in (:class:`DeadLetter`, one record for both);
* **SQS event-source semantics** shared by both event sources: the records a batch is
  delivered as (``events.sqs_record``) and what a partial batch response fails
  (:func:`failed_message_ids`).

How a delivery happens is the pluggable part, the bus's ``timing``:

* ``None`` (the moto world): **synchronous, in process**. ``put_events`` invokes each matching
  target at once with a Lambda-shaped context; a failure is logged in ``deliveries``
  (ok=False), never stops the bus, is retried per the rule's ``retries`` as the simulated
  clock passes (the driver in ``sim.ecs_core`` calls :meth:`EventBus.fire_due`), then
  dead-lettered; schedules and the queues of :meth:`EventBus.add_queue` (the shared queue
  model, :class:`~local_mode.sim.sqs_model.MessageQueue`, read by an
  :class:`InProcessEventSource`: batch size, partial batch response; visibility, receive
  counts and redrive are the model's) fire in ``fire_due`` too.
* a :class:`~local_mode.sim.lambdas.EngineTiming` (the scale world): **timed on the engine**.
  Each copy reaches Lambda after its own seeded random delay and is invoked asynchronously
  by :class:`~local_mode.sim.lambdas.LambdaService` (concurrency, containers, timeouts, the
  same retry policy and dead letters); schedules run on the engine; the queues are
  :class:`~local_mode.sim.sqs.SqsQueue` (the same queue model) with Lambda's poller.

``local_mode.sim.wiring`` (moto world) and ``local_mode.scale_recovery`` (scale world) put
the recovery functions on it from ``local_mode.sim.deployment``.
"""

from __future__ import annotations

import copy
import heapq
import json
import threading
import time as _time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from moto.events.models import EventPattern

from .. import events as ev
from .deployment import AsyncRetries
from .lambda_context import simulated_context
from .sqs_model import Message, MessageQueue

if TYPE_CHECKING:
    from collections.abc import Iterable

Target = Callable[[dict[str, Any], Any], Any]
#: a target's timeout when its rule names none (the context's time left counts down from it)
DEFAULT_TIMEOUT_SECONDS = 300.0


# ===================================================================== the shared semantics
def async_retry_delay(retries: AsyncRetries | None, attempt: int, age: float,
                      jitter: Callable[[], float] | None = None) -> float | None:
    """Lambda's asynchronous invocation after attempt ``attempt`` failed, ``age`` seconds after
    the event first reached it: the delay before the next attempt, or None (dead letter: the
    retries are spent, or the next attempt would be past the maximum event age).
    ``jitter`` draws the extra delay (the scale world's "about a minute")."""
    if retries is None or attempt > retries.attempts:
        return None
    delay = retries.delays[min(attempt, len(retries.delays)) - 1]
    if jitter is not None:
        delay += jitter()
    if age + delay > retries.max_event_age_seconds:
        return None
    return delay


def failed_message_ids(ok: bool, result: Any, ids: Iterable[str], *,
                       report_batch_item_failures: bool = True) -> set[str]:
    """The messages of an SQS batch the event source does not delete: all of them when the
    invocation failed; else those the partial batch response names (``batchItemFailures``),
    the whole batch if it names one not in the batch, none without one."""
    batch = set(ids)
    if not ok:
        return batch
    reported = (result.get("batchItemFailures") if isinstance(result, dict) else None) \
        if report_batch_item_failures else None
    if reported is None:
        return set()
    failed = {str(f.get("itemIdentifier")) for f in reported}
    return failed if failed <= batch else batch


# ===================================================================== records
@dataclass
class Rule:
    name: str
    pattern: dict[str, Any]
    target: Target | None  # the in-process handler (None: the engine's function ``target_name``)
    target_name: str
    retries: AsyncRetries | None = None  # Lambda's async retries of the target (in process)
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS  # the target function's (its context's time left)
    _matcher: Any = field(repr=False, default=None)

    @property
    def arn(self) -> str:
        return f"arn:aws:events:{ev.REGION}:{ev.ACCOUNT_ID}:rule/{self.name}"

    def matches(self, event: dict[str, Any], *, crushed: dict[str, Any] | None = None,
                flat: dict[str, Any] | None = None) -> bool:
        """``crushed``: :func:`crush_object_arrays` of ``event``; ``flat``: its
        :func:`flattened` form (when the caller has them: one event, every rule)."""
        if self._matcher is None:
            self._matcher = EventPattern.load(json.dumps(self.pattern))
        matcher = self._matcher
        if flat is None:
            return bool(matcher.matches_event(crush_object_arrays(event) if crushed is None else crushed))
        # moto's matches_event, past its per-call round trip and flattening of the event
        return not matcher._pattern or bool(matcher._does_event_match(flat, matcher._pattern))


def flattened(crushed: dict[str, Any]) -> dict[str, Any]:
    """What moto's ``EventPattern.matches_event`` matches a pattern against: the (crushed)
    event through a JSON round trip, flattened to dotted keys. The same for every rule, so
    :meth:`EventBus.matching_rules` makes it once per event (it was most of the matching)."""
    return EventPattern._flatten_dict(json.loads(json.dumps(crushed)))


def crush_object_arrays(node: Any) -> Any:
    """The event as EventBridge's matcher (Event Ruler) sees it: an array of objects is
    "crushed out", each field of its elements becoming the list of that field's values
    (aws/event-ruler README, "JSON Array Matching": ``{"employees": {"firstName": ["Anna"]}}``
    matches an event whose ``employees`` array has an element with that first name). moto's
    matcher does not descend into arrays; on the crushed event it does. (Event Ruler's newer
    matching also refuses two fields met by two different elements; no deployed pattern
    names two fields of one array, see ``gpu_recovery.event_patterns``.)"""
    if isinstance(node, dict):
        return {k: crush_object_arrays(v) for k, v in node.items()}
    if isinstance(node, list) and any(isinstance(v, dict) for v in node):
        merged: dict[str, list[Any]] = {}
        for element in node:
            if isinstance(element, dict):
                for key, value in element.items():
                    merged.setdefault(key, []).append(value)
        return {k: crush_object_arrays(_flat(v)) for k, v in merged.items()}
    return node


def _flat(values: list[Any]) -> Any:
    """One field's values across the elements: nested objects merged again, lists joined."""
    if all(isinstance(v, dict) for v in values):
        return values  # an array of objects again: crushed by the caller
    out: list[Any] = []
    for value in values:
        out.extend(value if isinstance(value, list) else [value])
    return out


def pattern_matches(pattern: dict[str, Any], event: dict[str, Any]) -> bool:
    """Whether EventBridge matches ``event`` to ``pattern`` (as :meth:`Rule.matches`)."""
    return bool(EventPattern.load(json.dumps(pattern)).matches_event(crush_object_arrays(event)))


@dataclass
class Schedule:
    name: str
    every_seconds: float
    target: Target | None
    target_name: str
    next_due: float
    retries: AsyncRetries | None = None  # Lambda's async retries of a failed tick (in process)
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS  # the target function's (its context's time left)

    @property
    def arn(self) -> str:
        return f"arn:aws:events:{ev.REGION}:{ev.ACCOUNT_ID}:rule/{self.name}"


@dataclass
class Delivery:
    """One in-process invocation of a target (the bus's delivery log)."""

    event_id: str
    detail_type: str
    rule: str
    target: str
    ok: bool
    error: str | None = None
    time: float | None = None
    duplicate: bool = False
    result: Any = None
    attempt: int = 1  # 2, 3...: a retry of a failed delivery


@dataclass
class DeadLetter:
    """An event whose retries are spent (an asynchronous target's DLQ) or an SQS message
    received ``max receives`` times (its queue's redrive), in either world."""

    rule: str  # the rule, schedule or ``sqs:<queue>`` it came through ("" on the engine)
    target: str  # the function
    event: Any
    error: str
    attempts: int = 1
    at: float = 0.0
    traceback: str = ""

    @property
    def function(self) -> str:
        return self.target

    @property
    def payload(self) -> Any:
        return self.event


@dataclass(order=True)
class _Retry:
    due: float
    seq: int
    rule: Rule | Schedule = field(compare=False)
    event: dict[str, Any] = field(compare=False)
    attempt: int = field(compare=False)
    received_at: float = field(compare=False, default=0.0)
    request_id: str | None = field(compare=False, default=None)  # the failed attempt's, kept


@dataclass
class InProcessEventSource:
    """The moto world's Lambda event source mapping on one queue: :meth:`EventBus.fire_due`
    receives up to ``batch_size`` visible messages of ``queue`` (the shared model,
    :class:`~local_mode.sim.sqs_model.MessageQueue`: visibility, receive counts, redrive) and
    invokes ``target`` with them at once, in process. (The scale world's, polled on the
    engine, is :class:`~local_mode.sim.sqs.SqsEventSource`.)"""

    queue: MessageQueue
    target: Target
    target_name: str
    batch_size: int = 1

    @property
    def name(self) -> str:
        return self.queue.name

    @property
    def arn(self) -> str:
        return self.queue.arn

    @property
    def sent(self) -> int:
        return self.queue.sent

    def record(self, message: Message) -> dict[str, Any]:
        return ev.sqs_record(message.message_id, message.body, self.queue.arn,
                             receive_count=message.receive_count, sent_at=message.sent_at)


class Timing(Protocol):
    """A bus's timed delivery (the engine's): when and how a copy or a schedule reaches Lambda."""

    def deliver(self, rule: Rule, event: dict[str, Any]) -> None: ...

    def start_schedule(self, schedule: Schedule) -> None: ...


def _name_of(target: Target) -> str:
    module = getattr(target, "__module__", "") or ""
    name = getattr(target, "__name__", type(target).__name__)
    if name == "lambda_handler" and module:
        return module.rsplit(".", 1)[-1]
    return name


# ===================================================================== the bus
class EventBus:
    """EventBridge with its schedules and SQS event sources (see the module docstring);
    thread-safe in process."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] | None = None,
        duplicate_delivery: bool = False,
        copies: int | None = None,
        raise_errors: bool = False,
        timing: Timing | None = None,
        keep_events: bool = True,
    ) -> None:
        self.clock = clock or _time.time
        #: every event reaches each matching target this many times (EventBridge: at least once)
        self.copies = copies if copies is not None else (2 if duplicate_delivery else 1)
        #: re-raise target exceptions (handy while debugging a handler)
        self.raise_errors = raise_errors
        self.timing = timing
        self.keep_events = keep_events
        self.rules: list[Rule] = []
        self.schedules: list[Schedule] = []
        self.deliveries: list[Delivery] = []
        self.dead_letters: list[DeadLetter] = []
        self.events: list[dict[str, Any]] = []  # every event put, in order (keep_events)
        self._retries: list[_Retry] = []
        self._retry_seq = 0
        self.queues: dict[str, InProcessEventSource] = {}
        #: called after every invocation (a campaign's invariant checks), in delivery order
        self.observers: list[Callable[[Delivery], None]] = []
        self._lock = threading.RLock()

    @property
    def duplicate_delivery(self) -> bool:
        return self.copies > 1

    @duplicate_delivery.setter
    def duplicate_delivery(self, value: bool) -> None:
        self.copies = 2 if value else 1

    # --- configuration -----------------------------------------------------------
    def add_rule(self, name: str, pattern: dict[str, Any], target: Target | str,
                 target_name: str | None = None, retries: AsyncRetries | None = None,
                 timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> Rule:
        """A rule to ``target``: a handler (in process) or the engine's function of that name."""
        handler = None if isinstance(target, str) else target
        label = target_name or (target if isinstance(target, str) else _name_of(target))
        rule = Rule(name, pattern, handler, label, retries, timeout_seconds)
        rule.matches({"source": "probe"})  # fail fast on a pattern moto cannot load
        with self._lock:
            self.rules.append(rule)
        return rule

    def add_schedule(self, name: str, every_seconds: float, target: Target | str,
                     target_name: str | None = None, first_at: float | None = None,
                     retries: AsyncRetries | None = None,
                     timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> Schedule:
        """A ``rate(...)`` rule: first fires at ``first_at`` (default now + period); in process,
        a failed tick is retried per ``retries`` (None: a dead letter at once)."""
        due = first_at if first_at is not None else self.clock() + every_seconds
        handler = None if isinstance(target, str) else target
        label = target_name or (target if isinstance(target, str) else _name_of(target))
        sched = Schedule(name, every_seconds, handler, label, due, retries, timeout_seconds)
        with self._lock:
            self.schedules.append(sched)
        if self.timing is not None:
            self.timing.start_schedule(sched)
        return sched

    def add_queue(self, name: str, target: Target, target_name: str | None = None, *,
                  batch_size: int = 1, visibility_timeout: float = 300.0,
                  max_receive_count: int = 5) -> InProcessEventSource:
        """An SQS queue (with its dead-letter queue, ``<name>-dlq``) and its event source, in
        process (on the engine: ``sim.sqs.SqsQueue.attach``). A message the queue redrives is
        also a :class:`DeadLetter` of the bus."""
        label = target_name or _name_of(target)
        dead = MessageQueue(f"{name}-dlq", clock=self.clock, visibility_timeout=visibility_timeout)
        queue = MessageQueue(name, clock=self.clock, visibility_timeout=visibility_timeout,
                             max_receive_count=max_receive_count, dead_letter=dead)
        source = InProcessEventSource(queue, target, label, batch_size)
        queue.on_dead_letter = partial(self._queue_dead_letter, source)
        with self._lock:
            self.queues[name] = source
        return source

    def _queue_dead_letter(self, source: InProcessEventSource, message: Message) -> None:
        self.dead_letters.append(DeadLetter(
            f"sqs:{source.name}", source.target_name, {"Records": [source.record(message)]},
            f"RuntimeError: received {message.receive_count} times", message.receive_count, self.clock()))

    def send(self, queue_name: str, bodies: list[str], delay_seconds: float = 0.0) -> list[str]:
        """SendMessage(Batch): the messages become visible ``delay_seconds`` from now."""
        with self._lock:
            queue = self.queues[queue_name].queue
            return [queue.send(body, max(0.0, delay_seconds)).message_id for body in bodies]

    # --- delivery ----------------------------------------------------------------
    def matching_rules(self, event: dict[str, Any]) -> list[Rule]:
        with self._lock:
            rules = list(self.rules)
        crushed = crush_object_arrays(event)
        flat = flattened(crushed)
        return [r for r in rules if r.matches(event, crushed=crushed, flat=flat)]

    def put_events(self, event: dict[str, Any]) -> list[Delivery]:
        """Deliver ``event`` to every matching rule's target, ``copies`` times; the in-process
        deliveries (none on the engine, where each copy is only scheduled)."""
        with self._lock:
            if self.keep_events:
                self.events.append(event)
        out: list[Delivery] = []
        for rule in self.matching_rules(event):
            for i in range(self.copies):
                if self.timing is not None:
                    self.timing.deliver(rule, event)
                else:
                    out.append(self._invoke(rule.name, rule.target, rule.target_name, event, i > 0,
                                            rule=rule))
        return out

    def _invoke(self, rule_name: str, target: Target | None, target_name: str, event: dict[str, Any],
                dup: bool, *, rule: Rule | Schedule | None = None, attempt: int = 1,
                received_at: float | None = None, request_id: str | None = None) -> Delivery:
        assert target is not None, f"{rule_name}: no in-process target"
        payload = copy.deepcopy(event)  # each invocation gets its own JSON-decoded copy
        context = simulated_context(target_name, request_id=request_id, clock=self.clock,
                                    timeout_seconds=rule.timeout_seconds if rule is not None
                                    else DEFAULT_TIMEOUT_SECONDS)
        now = self.clock()
        received = now if received_at is None else received_at
        delivery = Delivery(event_id=event.get("id", ""), detail_type=event.get("detail-type", ""),
                            rule=rule_name, target=target_name, ok=True, time=now, duplicate=dup,
                            attempt=attempt)
        try:
            delivery.result = target(payload, context)
        except Exception as exc:
            delivery.ok = False
            delivery.error = f"{type(exc).__name__}: {exc}"
            with self._lock:
                delay = (async_retry_delay(rule.retries, attempt, self.clock() - received)
                         if rule is not None else None)
                if rule is not None and delay is not None:
                    self._retry_seq += 1
                    heapq.heappush(self._retries, _Retry(self.clock() + delay, self._retry_seq, rule, event,
                                                         attempt + 1, received, context.aws_request_id))
                elif rule_name.startswith("sqs:"):
                    pass  # the queue redelivers it (or dead-letters it after its receives)
                else:
                    self.dead_letters.append(DeadLetter(rule_name, target_name, event, delivery.error,
                                                        attempt, self.clock(), traceback.format_exc()))
            if self.raise_errors:
                with self._lock:
                    self.deliveries.append(delivery)
                raise
        with self._lock:
            self.deliveries.append(delivery)
        for observe in list(self.observers):
            observe(delivery)
        return delivery

    # --- the in-process clock's due work ----------------------------------------------
    def next_schedule_due(self) -> float | None:
        """When the next schedule, retry or queued message is due (in process; on the engine,
        the engine holds them)."""
        if self.timing is not None:
            return None
        with self._lock:
            times = [s.next_due for s in self.schedules]
            if self._retries:
                times.append(self._retries[0].due)
            times += [t for t in (q.queue.next_visible() for q in self.queues.values()) if t is not None]
            return min(times, default=None)

    def queued(self) -> int:
        with self._lock:
            return sum(len(q.queue) for q in self.queues.values())

    def pending_retries(self) -> int:
        with self._lock:
            return len(self._retries)

    def fire_due(self, now: float | None = None) -> list[Delivery]:
        """Fire every schedule, retry and queued message due at or before ``now`` (in time order)."""
        if self.timing is not None:
            raise RuntimeError("a bus timed on the engine fires its own schedules")
        now = self.clock() if now is None else now
        out: list[Delivery] = []
        while True:
            with self._lock:
                due = [s for s in self.schedules if s.next_due <= now]
                retry = self._retries[0] if self._retries and self._retries[0].due <= now else None
                if retry is not None and (not due or retry.due <= min(s.next_due for s in due)):
                    heapq.heappop(self._retries)
                else:
                    retry = None
                visible = [(t, q) for q in self.queues.values()
                           if (t := q.queue.next_visible()) is not None and t <= now]
                source = min(visible, key=lambda tq: tq[0])[1] if visible else None
                first = min([s.next_due for s in due] + ([retry.due] if retry else []), default=None)
                received = False
                batch: list[Message] = []
                if source is not None and (first is None or min(t for t, _ in visible) <= first):
                    if retry is not None:  # not yet: the queued message is older
                        heapq.heappush(self._retries, retry)
                        retry = None
                    batch = source.queue.receive(source.batch_size, now)
                    received = True
                if retry is None and not due and not received:
                    return out
            if batch and source is not None:
                out.extend(self._deliver_queue(source, batch))
                continue
            if received:
                continue  # the receive only redrove messages to the dead-letter queue
            if retry is not None:
                out.append(self._invoke(retry.rule.name, retry.rule.target, retry.rule.target_name,
                                        retry.event, False, rule=retry.rule, attempt=retry.attempt,
                                        received_at=retry.received_at, request_id=retry.request_id))
                continue
            with self._lock:
                sched = min(due, key=lambda s: s.next_due)
                fire_at = sched.next_due
                sched.next_due += sched.every_seconds
            event = ev.scheduled_event(sched.arn, time=fire_at)
            with self._lock:
                if self.keep_events:
                    self.events.append(event)
            out.append(self._invoke(sched.name, sched.target, sched.target_name, event, False, rule=sched))

    def _deliver_queue(self, source: InProcessEventSource, batch: list[Message]) -> list[Delivery]:
        """One event source mapping invocation (each copy when duplicating; the first decides):
        the messages it does not fail are deleted, the others come back when their visibility
        timeout ends (and are redriven on the receive after their last)."""
        event = {"Records": [source.record(m) for m in batch]}
        out: list[Delivery] = []
        failed: set[str] = set()
        for copy_ in range(self.copies):
            delivery = self._invoke(f"sqs:{source.name}", source.target, source.target_name, event,
                                    copy_ > 0)
            out.append(delivery)
            if copy_ == 0:
                failed = failed_message_ids(delivery.ok, delivery.result, (m.message_id for m in batch))
        with self._lock:
            for message in batch:
                if message.message_id not in failed:
                    source.queue.delete(message.message_id)
        return out

    def redrive(self, letter: DeadLetter) -> Delivery:
        """The DLQ runbook's redrive of an event rule's ``letter`` (in process): taken off the
        dead letters and delivered to its rule's target once more (failing, it is retried and
        dead-lettered again as any delivery)."""
        rule = next(r for r in self.rules if r.name == letter.rule)
        with self._lock:
            self.dead_letters.remove(letter)
        return self._invoke(rule.name, rule.target, rule.target_name, letter.event, False, rule=rule,
                            attempt=letter.attempts + 1)

    # --- inspection --------------------------------------------------------------
    def failures(self) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if not d.ok]

    def delivered_to(self, target_name: str) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if d.target == target_name]
