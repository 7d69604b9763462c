"""The scale simulator's engine: simulated time, Lambda, EventBridge and SQS, and the
client-side behaviour of AWS calls (latency, account-wide token buckets, botocore's
standard retries), for recoveries of thousands of ranks in seconds of wall time.

The recovery code runs for real (``RecoveryService``, its stages, the real ``Repository``
on :class:`~local_mode.sim.dynamo.MemoryDynamo`, the real adapters on the stand-in
clients of ``local_mode/scale_aws.py``); this module decides *when* each piece runs.

**Time.** A discrete-event simulation (:class:`Simulation`): a heap of timed actions and
*processes*. Every Lambda invocation is a process: a thread that runs only while the
simulation hands it control, one process at a time, so runs are deterministic for a seed.
A process gives control back at every AWS call (the call takes effect at once; the caller
then waits the call's modelled latency) and at every ``gpu_recovery.clock.sleep`` (retry
back-off, pacing); meanwhile other invocations and the data plane run. Invocations
therefore interleave at AWS-call boundaries, as concurrent Lambdas do; the Python code
between two calls takes no simulated time (CPU time is not modelled).
``gpu_recovery.clock.now()`` is the simulation's time.

**Lambda** (:class:`LambdaService`): asynchronous invocations (EventBridge targets) and
synchronous ones (an SQS event source); an account concurrency limit (1,000: an
invocation beyond it waits for a free slot, as Lambda's async queue does); a container per
concurrent invocation, reused afterwards (per-container state: the service object, its
clients and their retry quota); the function timeout ends an invocation at its next AWS
call or sleep past the deadline (:class:`LambdaTimeout`, which ``except Exception`` cannot
catch, as Lambda's kill cannot be caught); a failed asynchronous invocation is retried
twice, about 1 and then 2 minutes later (up to 5 s of jitter), unless older than the
maximum event age, then dead-lettered (counted, kept).

**EventBridge** (:class:`EventBus`): rules matched with the *deployed* patterns (moto's
matcher, as ``local_mode/sim/bus.py``), every event delivered ``copies`` times (2:
at-least-once), each copy after its own random delivery delay (seeded), so a burst
arrives in random order; ``rate()`` schedules.

**SQS** (:class:`SqsQueue`, :meth:`SqsQueue.attach`): ``SendMessageBatch`` (10 entries,
256 KB a message, ``DelaySeconds``), a Lambda event source (batch size, maximum
concurrency, visibility timeout, ``ReportBatchItemFailures``, ``ApproximateReceiveCount``,
redrive to a dead-letter queue after ``maxReceiveCount`` receives).

**AWS call behaviour** (:class:`SimClient`): parameters validated against botocore's
model of the service; a per-call latency (:class:`Latencies`); account-wide token
buckets (:class:`AccountRateLimit`: ECS's RunTask/StartTask/StopTask/
UpdateContainerInstancesState share burst 100, 40 per second; DescribeTasks/ListTasks/
DescribeContainerInstances/ListContainerInstances burst 100, 20 per second); a call over
the bucket gets ThrottlingException and botocore's *standard* retry mode applies as the
adapters configure it (``max_attempts`` 5 retries: up to 6 attempts; back-off
``random() * min(1 s * 2**(attempt-1), 20 s)`` for throttling; a retry quota of 500 per
client, 5 per throttled retry), sleeping in simulated time, then ClientError.

Limits: invocations interleave only at AWS calls and sleeps; no CPU time; Lambda scales
to the concurrency limit at once (no burst ramp-up); EventBridge and Lambda's async
queue deliver within a fixed random delay; no cold starts.
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
import threading
import time as _time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import botocore.session
from botocore.exceptions import ClientError, ParamValidationError
from botocore.validate import ParamValidator

from gpu_recovery import clock as gr_clock
from gpu_recovery.adapters.aws import MAX_RETRIES

DEFAULT_START = datetime(2026, 11, 20, 14, 0, 0, tzinfo=UTC).timestamp()
ACCOUNT_ID = "123456789012"
REGION = "us-east-1"
# Lambda asynchronous invocation: 2 retries, the first about a minute after the failure,
# the second about two minutes after that (infra/recovery.py keeps the default 2).
ASYNC_RETRY_DELAYS: tuple[float, ...] = (60.0, 120.0)
# "About" a minute: Lambda's internal queue does not replay failures in lockstep (an
# assumption of the model; exact delays would make every retry of a burst collide again).
ASYNC_RETRY_JITTER = 5.0
LAMBDA_CONCURRENCY = 1000  # the account's default concurrent executions
THREAD_STACK_BYTES = 4 * 1024 * 1024


class LambdaTimeout(BaseException):
    """The invocation reached its function timeout: Lambda ends it. A BaseException, so
    the code under test cannot catch it (``except Exception``), as it cannot catch the kill."""


class _Closed(BaseException):
    """The simulation ended while this process waited: unwind quietly."""


# ================================================================== simulation core
class Process:
    """One simulated thread of control (a Lambda invocation, a setup step)."""

    def __init__(self, sim: Simulation, body: Callable[[], Any], *, name: str, label: str,
                 deadline: float | None) -> None:
        self.sim = sim
        self.body = body
        self.name = name
        self.label = label  # metering label (the function's name)
        self.deadline = deadline
        self.started_at = sim.now
        self.finished_at: float | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.timed_out = False
        self.finished = False
        self.on_done: list[Callable[[Process], None]] = []
        self._go = threading.Semaphore(0)
        self._abort = False
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)

    def _main(self) -> None:
        self._go.acquire()
        try:
            if self._abort:
                raise _Closed
            self.result = self.body()
        except _Closed:
            self.error = None
        except LambdaTimeout as error:
            self.timed_out = True
            self.error = error
        except BaseException as error:
            self.error = error
        self.finished = True
        self.finished_at = self.sim.now
        self.sim._back.release()

    @property
    def duration(self) -> float:
        return (self.finished_at if self.finished_at is not None else self.sim.now) - self.started_at

    def wait(self, seconds: float) -> None:
        """Give control back for ``seconds`` of simulated time (from this process only)."""
        sim = self.sim
        wake = sim.now + max(0.0, seconds)
        kill = self.deadline is not None and wake > self.deadline
        if kill:
            wake = max(sim.now, self.deadline or sim.now)
        if sim._nothing_due_before(wake):
            # Nobody else would run before we wake: skip the thread switch.
            sim.now = wake
        else:
            sim._push(wake, lambda: sim._resume(self), f"resume {self.name}")
            sim._back.release()
            self._go.acquire()
            if self._abort:
                raise _Closed
        if kill:
            raise LambdaTimeout(f"{self.name}: timed out after {self.deadline - self.started_at:.1f} s"
                                if self.deadline is not None else self.name)


class Simulation:
    """Simulated time: timed actions and processes, one running at a time (see the
    module docstring). ``run`` drives it; ``install_clock`` points gpu_recovery's clock
    at it."""

    def __init__(self, *, start: float = DEFAULT_START, seed: int = 0) -> None:
        self.start = start
        self.now = start
        self.rng = random.Random(seed)
        self._heap: list[tuple[float, int, str, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._back = threading.Semaphore(0)
        self.current: Process | None = None
        self._live: set[Process] = set()
        self.actions_run = 0
        self._ids = itertools.count(1)
        self._closing = False

    # --- scheduling --------------------------------------------------------------------
    def _push(self, when: float, action: Callable[[], None], label: str) -> None:
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), label, action))

    def at(self, when: float, action: Callable[[], None], label: str = "") -> None:
        """Run ``action`` (no simulated time passes inside it) at ``when``."""
        self._push(when, action, label)

    def after(self, delay: float, action: Callable[[], None], label: str = "") -> None:
        self._push(self.now + max(0.0, delay), action, label)

    def _nothing_due_before(self, when: float) -> bool:
        return not self._heap or self._heap[0][0] > when

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pending(self) -> int:
        return len(self._heap)

    def token(self, nbytes: int = 16) -> str:
        """Seeded hex (ARNs, ids): runs are reproducible."""
        return f"{self.rng.getrandbits(nbytes * 8):0{nbytes * 2}x}"

    # --- processes ---------------------------------------------------------------------
    def spawn(self, body: Callable[[], Any], *, name: str = "", label: str = "",
              timeout: float | None = None, on_done: Callable[[Process], None] | None = None) -> Process:
        """Start ``body`` as a process now (it runs when the schedule reaches it)."""
        if self._closing:
            raise RuntimeError("the simulation is closed")
        number = next(self._ids)
        process = Process(self, body, name=name or f"process-{number}", label=label or name,
                          deadline=self.now + timeout if timeout is not None else None)
        if on_done is not None:
            process.on_done.append(on_done)
        previous = threading.stack_size(THREAD_STACK_BYTES)
        try:
            process.thread.start()
        finally:
            threading.stack_size(previous)
        self._live.add(process)
        self._push(self.now, lambda: self._resume(process), f"start {process.name}")
        return process

    def _resume(self, process: Process) -> None:
        previous = self.current
        self.current = process
        process._go.release()
        self._back.acquire()
        self.current = previous
        if process.finished:
            self._live.discard(process)
            process.thread.join()
            if not self._closing:
                for callback in process.on_done:
                    callback(process)

    def sleep(self, seconds: float) -> None:
        """``gpu_recovery.clock.sleep``: the running process waits in simulated time."""
        if self.current is None:
            raise RuntimeError("clock.sleep outside a simulated process: run the code with "
                               "Simulation.spawn / run_process")
        self.current.wait(seconds)

    def pause(self, seconds: float) -> None:
        """An AWS call's latency: the running process waits; outside a process (setup code
        called directly) no time passes."""
        if self.current is not None and seconds > 0:
            self.current.wait(seconds)

    def install_clock(self) -> None:
        gr_clock.set_clock(lambda: self.now, self.sleep)

    # --- driving -----------------------------------------------------------------------
    def step(self) -> bool:
        if not self._heap:
            return False
        when, _, _, action = heapq.heappop(self._heap)
        self.now = max(self.now, when)
        self.actions_run += 1
        action()
        return True

    def run(self, until: float | None = None, *, stop: Callable[[], bool] | None = None,
            wall_seconds: float | None = None, check_every: int = 1, check_seconds: float = 1.0) -> str:
        """Run until simulated time ``until``, ``stop()`` holds (checked every
        ``check_every`` actions, and whenever ``check_seconds`` of simulated time passed since
        the last check), the schedule is empty, or ``wall_seconds`` of real time passed.
        Returns why it stopped: "until", "stop", "idle" or "wall"."""
        started = _time.monotonic()
        count = 0
        checked_at = self.now
        while True:
            if stop is not None and (count % check_every == 0 or self.now - checked_at >= check_seconds):
                checked_at = self.now
                if stop():
                    return "stop"
            nxt = self.next_time()
            if nxt is None:
                if until is not None:
                    self.now = max(self.now, until)
                return "idle"
            if until is not None and nxt > until:
                self.now = max(self.now, until)
                return "until"
            if wall_seconds is not None and _time.monotonic() - started > wall_seconds:
                return "wall"
            self.step()
            count += 1

    def run_process(self, body: Callable[[], Any], *, name: str = "setup", label: str = "setup") -> Any:
        """Run ``body`` as a process to its end (everything scheduled before it ends runs
        too); its result, or its exception raised here."""
        process = self.spawn(body, name=name, label=label)
        while not process.finished and self.step():
            pass
        if process.error is not None:
            raise process.error
        return process.result

    def close(self) -> None:
        """End every waiting process (their threads exit; nothing they would start
        afterwards runs) and drop the schedule."""
        self._closing = True
        for process in list(self._live):
            process._abort = True
            self._resume(process)
        self._live.clear()
        self._heap.clear()


# ================================================================== AWS call behaviour
@dataclass
class Latencies:
    """Modelled duration of one AWS call (seconds), by service / kind of call."""

    dynamodb: float = 0.004
    dynamodb_transaction: float = 0.010
    ecs_control: float = 0.050  # RunTask, StartTask, StopTask, UpdateContainerInstancesState
    ecs_read: float = 0.030  # Describe*, List*
    sqs: float = 0.010
    sns: float = 0.020
    logs: float = 0.030
    ec2: float = 0.050
    ssm: float = 0.050
    autoscaling: float = 0.050

    def dynamodb_call(self, operation: str) -> float:
        return self.dynamodb_transaction if operation.startswith("Transact") else self.dynamodb


@dataclass
class AccountRateLimit:
    """AWS's side of an account-wide API rate limit (its state; not the stack's own budget,
    ``gpu_recovery.domain.rate_limit.TokenBucket``): ``burst`` tokens, refilled at ``rate``
    per second."""

    burst: float
    rate: float
    tokens: float = -1.0
    last: float | None = None
    taken: int = 0
    refused: int = 0

    def take(self, now: float) -> bool:
        if self.last is None:
            self.tokens, self.last = self.burst, now
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.last) * self.rate)
        self.last = max(self.last, now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            self.taken += 1
            return True
        self.refused += 1
        return False

    def floor_seconds(self, calls: int) -> float:
        """Time this bucket alone needs for ``calls`` from full: max(0, (calls - burst) / rate)."""
        return max(0.0, (calls - self.burst) / self.rate)


class RetryQuota:
    """botocore's retry quota (``botocore.retries.quota``): 500 per client, a throttled
    retry costs 5, a success without retry gives 1 back."""

    INITIAL = 500
    THROTTLED_RETRY_COST = 5
    NO_RETRY_INCREMENT = 1

    def __init__(self) -> None:
        self.available = self.INITIAL

    def acquire(self, amount: int) -> bool:
        if amount > self.available:
            return False
        self.available -= amount
        return True

    def release(self, amount: int) -> None:
        self.available = min(self.INITIAL, self.available + amount)


@dataclass
class CallStats:
    """Every attempt of every AWS call (not DynamoDB: MemoryDynamo meters that)."""

    calls: Counter[str] = field(default_factory=Counter)  # "service:Operation" -> attempts
    throttled: Counter[str] = field(default_factory=Counter)  # attempts refused by a bucket
    failed: Counter[str] = field(default_factory=Counter)  # calls that raised after retries
    by_label: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def reset(self) -> None:
        self.calls.clear()
        self.throttled.clear()
        self.failed.clear()
        self.by_label.clear()


_model_lock = threading.Lock()
_models: dict[str, Any] = {}


def _botocore(service: str) -> Any:
    """A client that is never called: botocore's model, paginators and modeled errors."""
    with _model_lock:
        client = _models.get(service)
        if client is None:
            client = botocore.session.get_session().create_client(
                service, region_name=REGION, aws_access_key_id="simulated",
                aws_secret_access_key="simulated")  # noqa: S106 - never sent anywhere
            _models[service] = client
        return client


class _UnmodeledErrors:
    """``client.exceptions`` of a service without modeled errors (EC2): plain ClientError."""

    ClientError = ClientError

    @staticmethod
    def from_code(code: str) -> type[ClientError]:
        return ClientError


class Account:
    """The simulated account: its clock, latencies, account-wide rate limits and the
    statistics of every AWS call (DynamoDB excepted: MemoryDynamo meters it)."""

    ECS_CONTROL = frozenset({"RunTask", "StartTask", "StopTask", "UpdateContainerInstancesState"})
    ECS_READ = frozenset({"DescribeTasks", "ListTasks", "DescribeContainerInstances",
                          "ListContainerInstances"})

    def __init__(self, sim: Simulation, latencies: Latencies | None = None, *,
                 ecs_control: tuple[float, float] = (100, 40), ecs_read: tuple[float, float] = (100, 20),
                 max_attempts: int = MAX_RETRIES + 1) -> None:
        self.sim = sim
        self.latencies = latencies or Latencies()
        self.buckets = {"ecs_control": AccountRateLimit(*ecs_control),
                        "ecs_read": AccountRateLimit(*ecs_read)}
        self.max_attempts = max_attempts
        self.stats = CallStats()

    def bucket_for(self, service: str, operation: str) -> AccountRateLimit | None:
        if service == "ecs":
            if operation in self.ECS_CONTROL:
                return self.buckets["ecs_control"]
            if operation in self.ECS_READ:
                return self.buckets["ecs_read"]
        return None

    def label(self) -> str:
        current = self.sim.current
        return current.label if current is not None else "setup"


class SimClient:
    """Base of the boto3-shaped stand-in clients: ``_call`` validates the parameters
    against botocore's model, applies the account's rate limit and botocore's standard
    retries, runs the operation and waits its latency."""

    service = ""
    #: validate parameters with botocore's model of the service (EC2's model alone takes
    #: seconds to load: its stand-in checks its one operation itself)
    modeled = True

    def __init__(self, account: Account) -> None:
        self.account = account
        self.sim = account.sim
        self.quota = RetryQuota()  # one per client, as botocore keeps it
        self._validator = ParamValidator()
        if self.modeled:
            model_client = _botocore(self.service)
            self.exceptions = model_client.exceptions
            self.meta = model_client.meta
        else:
            self.exceptions = _UnmodeledErrors()
            self.meta = None

    def _latency(self, operation: str) -> float:
        return float(getattr(self.account.latencies, self.service.replace("-", "_")))

    def error(self, operation: str, code: str, message: str, status: int = 400) -> ClientError:
        response = {"Error": {"Code": code, "Message": message},
                    "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}, "RetryAttempts": 0}}
        cls = self.exceptions.from_code(code)
        return cls(response, operation)  # type: ignore[no-any-return]

    def _call(self, operation: str, params: Mapping[str, Any],
              execute: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        if self.meta is not None:
            model = self.meta.service_model.operation_model(operation)
            report = self._validator.validate(dict(params), model.input_shape)
            if report.has_errors():
                raise ParamValidationError(report=report.generate_report())
        account, sim = self.account, self.sim
        stats, key, label = account.stats, f"{self.service}:{operation}", account.label()
        bucket = account.bucket_for(self.service, operation)
        latency = self._latency(operation)
        attempt, acquired = 0, 0
        while True:
            attempt += 1
            stats.calls[key] += 1
            stats.by_label[label][key] += 1
            if bucket is not None and not bucket.take(sim.now):
                stats.throttled[key] += 1
                sim.pause(latency)
                if attempt < account.max_attempts and self.quota.acquire(RetryQuota.THROTTLED_RETRY_COST):
                    acquired = RetryQuota.THROTTLED_RETRY_COST
                    # botocore standard mode: random() * min(1 s * 2**(attempt-1), 20 s) for throttling
                    sim.pause(sim.rng.random() * min(2.0 ** (attempt - 1), 20.0))
                    continue
                stats.failed[key] += 1
                raise self.error(operation, "ThrottlingException", "Rate exceeded")
            try:
                result = execute(dict(params))
            except ClientError:
                stats.failed[key] += 1
                sim.pause(latency)
                raise
            sim.pause(latency)
            self.quota.release(acquired or RetryQuota.NO_RETRY_INCREMENT)
            result["ResponseMetadata"] = {"HTTPStatusCode": 200, "HTTPHeaders": {},
                                          "RetryAttempts": attempt - 1}
            return result

    def can_paginate(self, operation_name: str) -> bool:
        return bool(_botocore(self.service).can_paginate(operation_name))

    def get_paginator(self, operation_name: str) -> Any:
        """botocore's own Paginator over this client's method."""
        from botocore import xform_name
        from botocore.paginate import Paginator

        model_client = _botocore(self.service)
        if not model_client.can_paginate(operation_name):
            raise ValueError(f"{operation_name} cannot be paginated")
        operation = next(op for op in self.meta.service_model.operation_names
                         if xform_name(op) == operation_name)
        config = botocore.session.get_session().get_paginator_model(self.service).get_paginator(operation)
        return Paginator(getattr(self, operation_name), config,
                         self.meta.service_model.operation_model(operation))


# ================================================================== Lambda
@dataclass
class Invocation:
    """One run of a function (a retry is a new Invocation with ``attempt`` + 1)."""

    function: str
    payload: Any
    attempt: int
    received_at: float  # when the event first reached Lambda (for the maximum event age)
    queued_at: float
    started_at: float | None = None
    ended_at: float | None = None
    ok: bool = False
    timed_out: bool = False
    error: str = ""
    result: Any = None
    synchronous: bool = False

    @property
    def duration(self) -> float:
        if self.started_at is None or self.ended_at is None:
            return 0.0
        return self.ended_at - self.started_at


@dataclass
class FunctionStats:
    invocations: int = 0
    errors: int = 0
    timeouts: int = 0
    retries: int = 0
    dead_letters: int = 0
    max_duration: float = 0.0
    total_duration: float = 0.0
    max_wait: float = 0.0  # queued behind the concurrency limit

    def as_dict(self, timeout: float) -> dict[str, Any]:
        return {"invocations": self.invocations, "errors": self.errors, "timeouts": self.timeouts,
                "retries": self.retries, "dead_letters": self.dead_letters,
                "longest_s": round(self.max_duration, 2), "timeout_s": timeout,
                "mean_s": round(self.total_duration / self.invocations, 3) if self.invocations else 0.0,
                "max_queue_wait_s": round(self.max_wait, 2)}


@dataclass
class LambdaFunction:
    name: str
    handler: Callable[[Any, Any], Any]  # (container, payload) -> result
    timeout: float
    make_container: Callable[[], Any]
    async_retries: int = 2
    retry_delays: tuple[float, ...] = ASYNC_RETRY_DELAYS
    max_event_age: float = 7200.0
    idle: list[Any] = field(default_factory=list)
    stats: FunctionStats = field(default_factory=FunctionStats)


@dataclass
class DeadInvocation:
    """An asynchronous invocation whose retries are spent (the function's DLQ); the moto
    world's bus keeps ``local_mode.sim.bus.DeadLetter`` records of the same failures."""

    function: str
    payload: Any
    error: str
    attempts: int
    at: float


class LambdaService:
    """Lambda in the simulated account (see the module docstring)."""

    def __init__(self, sim: Simulation, *, concurrency: int = LAMBDA_CONCURRENCY,
                 keep_invocations: bool = True, retry_jitter: float = ASYNC_RETRY_JITTER) -> None:
        self.sim = sim
        self.concurrency = concurrency
        self.retry_jitter = retry_jitter
        self.functions: dict[str, LambdaFunction] = {}
        self.running = 0
        self.max_running = 0
        self.throttled = 0  # invocations that waited for a free slot
        self._waiting: list[tuple[Invocation, Callable[[Invocation], None] | None]] = []
        self._waiting_head = 0
        self.dead_letters: list[DeadInvocation] = []
        self.keep_invocations = keep_invocations
        self.invocations: list[Invocation] = []
        self._numbers = itertools.count(1)  # invocation ids (the conflict model tells them apart)

    def add_function(self, name: str, handler: Callable[[Any, Any], Any], *, timeout: float,
                     make_container: Callable[[], Any] | None = None, async_retries: int = 2,
                     max_event_age: float = 7200.0) -> LambdaFunction:
        function = LambdaFunction(name, handler, timeout, make_container or (lambda: None),
                                  async_retries=async_retries, max_event_age=max_event_age)
        self.functions[name] = function
        return function

    def reset_stats(self) -> None:
        for function in self.functions.values():
            function.stats = FunctionStats()
        self.dead_letters.clear()
        self.invocations.clear()
        self.max_running = self.running
        self.throttled = 0

    # --- invoking ----------------------------------------------------------------------
    def invoke_async(self, name: str, payload: Any, *, received_at: float | None = None,
                     attempt: int = 1) -> None:
        """An asynchronous invocation (an EventBridge target, a schedule)."""
        now = self.sim.now
        invocation = Invocation(name, payload, attempt, received_at if received_at is not None else now, now)
        self._admit(invocation, None)

    def invoke(self, name: str, payload: Any, on_done: Callable[[Invocation], None]) -> None:
        """A synchronous invocation (an SQS event source): no Lambda retries; ``on_done``
        gets the outcome."""
        now = self.sim.now
        self._admit(Invocation(name, payload, 1, now, now, synchronous=True), on_done)

    def _admit(self, invocation: Invocation, on_done: Callable[[Invocation], None] | None) -> None:
        if self.running >= self.concurrency:
            self.throttled += 1
            self._waiting.append((invocation, on_done))
            return
        self._start(invocation, on_done)

    def _start(self, invocation: Invocation, on_done: Callable[[Invocation], None] | None) -> None:
        function = self.functions[invocation.function]
        container = function.idle.pop() if function.idle else function.make_container()
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        invocation.started_at = self.sim.now
        function.stats.max_wait = max(function.stats.max_wait, invocation.started_at - invocation.queued_at)

        def finished(process: Process) -> None:
            self.running -= 1
            invocation.ended_at = self.sim.now
            invocation.result = process.result
            invocation.timed_out = process.timed_out
            invocation.ok = process.error is None
            if process.error is not None:
                invocation.error = f"{type(process.error).__name__}: {process.error}"[:500]
            if not process.timed_out:  # a timed-out environment is not reused
                function.idle.append(container)
            self._account(function, invocation)
            if on_done is not None:
                on_done(invocation)
            elif not invocation.ok:
                self._retry_or_dead_letter(function, invocation)
            self._start_waiting()

        self.sim.spawn(lambda: function.handler(container, invocation.payload),
                       name=f"{function.name}#{next(self._numbers)}", label=function.name,
                       timeout=function.timeout, on_done=finished)
        if self.keep_invocations:
            self.invocations.append(invocation)

    def _start_waiting(self) -> None:
        while self.running < self.concurrency and self._waiting_head < len(self._waiting):
            invocation, on_done = self._waiting[self._waiting_head]
            self._waiting_head += 1
            self._start(invocation, on_done)
        if self._waiting_head > 1024 and self._waiting_head * 2 > len(self._waiting):
            del self._waiting[:self._waiting_head]
            self._waiting_head = 0

    @staticmethod
    def _account(function: LambdaFunction, invocation: Invocation) -> None:
        stats = function.stats
        stats.invocations += 1
        stats.total_duration += invocation.duration
        stats.max_duration = max(stats.max_duration, invocation.duration)
        if invocation.timed_out:
            stats.timeouts += 1
        if not invocation.ok:
            stats.errors += 1

    def _retry_or_dead_letter(self, function: LambdaFunction, invocation: Invocation) -> None:
        attempt = invocation.attempt
        if attempt <= function.async_retries:
            delay = function.retry_delays[min(attempt, len(function.retry_delays)) - 1]
            delay += self.sim.rng.uniform(0.0, self.retry_jitter)
            if self.sim.now + delay - invocation.received_at <= function.max_event_age:
                function.stats.retries += 1
                self.sim.after(delay, lambda: self.invoke_async(
                    function.name, invocation.payload, received_at=invocation.received_at,
                    attempt=attempt + 1), f"retry {function.name}")
                return
        function.stats.dead_letters += 1
        self.dead_letters.append(DeadInvocation(function.name, invocation.payload, invocation.error, attempt,
                                            self.sim.now))

    def summary(self) -> dict[str, Any]:
        return {"functions": {name: f.stats.as_dict(f.timeout) for name, f in sorted(self.functions.items())},
                "max_concurrency": self.max_running, "waited_for_concurrency": self.throttled,
                "dead_letters": len(self.dead_letters)}


# ================================================================== EventBridge
@dataclass
class _Rule:
    name: str
    pattern: dict[str, Any]
    function: str
    matcher: Any


class EventBus:
    """EventBridge: rules with the deployed patterns, at-least-once delivery, schedules."""

    def __init__(self, sim: Simulation, lambdas: LambdaService, *, copies: int = 2,
                 delivery_delay: tuple[float, float] = (0.05, 0.5)) -> None:
        self.sim = sim
        self.lambdas = lambdas
        self.copies = copies
        self.delivery_delay = delivery_delay
        self.rules: list[_Rule] = []
        self.events_put = 0
        self.deliveries = 0

    def add_rule(self, name: str, pattern: dict[str, Any], function: str) -> None:
        from moto.events.models import EventPattern

        self.rules.append(_Rule(name, pattern, function, EventPattern.load(json.dumps(pattern))))

    def add_schedule(self, name: str, every_seconds: float, function: str, *,
                     first_at: float | None = None) -> None:
        """A ``rate()`` rule: a Scheduled Event to ``function`` every ``every_seconds``."""
        from local_mode import events as ev

        arn = f"arn:aws:events:{REGION}:{ACCOUNT_ID}:rule/{name}"

        def fire() -> None:
            event = ev.scheduled_event(arn, time=self.sim.now, account=ACCOUNT_ID, region=REGION)
            self.lambdas.invoke_async(function, event)
            self.sim.after(every_seconds, fire, f"schedule {name}")

        self.sim.at(first_at if first_at is not None else self.sim.now + every_seconds, fire,
                    f"schedule {name}")

    def put(self, event: dict[str, Any]) -> int:
        """Deliver ``event`` to every matching rule, ``copies`` times; returns the deliveries."""
        self.events_put += 1
        count = 0
        for rule in self.rules:
            if not rule.matcher.matches_event(event):
                continue
            for _ in range(self.copies):
                received = self.sim.now
                delay = self.sim.rng.uniform(*self.delivery_delay)
                payload = json.loads(json.dumps(event))  # each target gets its own decoded copy
                self.sim.after(delay, lambda f=rule.function, p=payload, r=received:
                               self.lambdas.invoke_async(f, p, received_at=r), f"deliver to {rule.function}")
                count += 1
        self.deliveries += count
        return count


# ================================================================== SQS
SQS_MAX_MESSAGE_BYTES = 256 * 1024  # the long-standing limit (stricter than today's 1 MiB)
SQS_MAX_BATCH = 10
SQS_MAX_DELAY_SECONDS = 900


@dataclass
class _Message:
    message_id: str
    body: str
    sent_at: float
    visible_at: float
    receive_count: int = 0
    first_received_at: float | None = None


class SqsClient(SimClient):
    """``send_message_batch`` / ``send_message`` to the simulated queues of an account."""

    service = "sqs"

    def __init__(self, account: Account, queues: Mapping[str, SqsQueue]) -> None:
        super().__init__(account)
        self._queues = queues

    def _queue(self, operation: str, url: str) -> SqsQueue:
        queue = self._queues.get(url)
        if queue is None:
            raise self.error(operation, "AWS.SimpleQueueService.NonExistentQueue",
                             "The specified queue does not exist.")
        return queue

    def send_message_batch(self, **params: Any) -> dict[str, Any]:
        return self._call("SendMessageBatch", params, self._send_batch)

    def send_message(self, **params: Any) -> dict[str, Any]:
        def one(p: dict[str, Any]) -> dict[str, Any]:
            queue = self._queue("SendMessage", p["QueueUrl"])
            body = p["MessageBody"]
            if len(body.encode()) > SQS_MAX_MESSAGE_BYTES:
                raise self.error("SendMessage", "InvalidParameterValue",
                                 f"One or more parameters are invalid. Reason: Message must be shorter than "
                                 f"{SQS_MAX_MESSAGE_BYTES} bytes.")
            message = queue._enqueue(body, int(p.get("DelaySeconds") or 0))
            return {"MessageId": message.message_id}

        return self._call("SendMessage", params, one)

    def _send_batch(self, p: dict[str, Any]) -> dict[str, Any]:
        queue = self._queue("SendMessageBatch", p["QueueUrl"])
        entries = p["Entries"]
        if not entries:
            raise self.error("SendMessageBatch", "AWS.SimpleQueueService.EmptyBatchRequest",
                             "There should be at least one SendMessageBatchRequestEntry in the request.")
        if len(entries) > SQS_MAX_BATCH:
            raise self.error("SendMessageBatch", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                             f"Maximum number of entries per request are {SQS_MAX_BATCH}. You have sent "
                             f"{len(entries)}.")
        ids = [e["Id"] for e in entries]
        if len(set(ids)) != len(ids):
            raise self.error("SendMessageBatch", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
                             "Id must be distinct among batch entries.")
        if sum(len(e["MessageBody"].encode()) for e in entries) > SQS_MAX_MESSAGE_BYTES:
            raise self.error("SendMessageBatch", "AWS.SimpleQueueService.BatchRequestTooLong",
                             f"Batch requests cannot be longer than {SQS_MAX_MESSAGE_BYTES} bytes.")
        successful = []
        for entry in entries:
            delay = int(entry.get("DelaySeconds") or 0)
            if not 0 <= delay <= SQS_MAX_DELAY_SECONDS:
                raise self.error("SendMessageBatch", "InvalidParameterValue",
                                 f"Value {delay} for parameter DelaySeconds is invalid. Reason: must be "
                                 f"between 0 and {SQS_MAX_DELAY_SECONDS}, if provided.")
            message = queue._enqueue(entry["MessageBody"], delay)
            successful.append({"Id": entry["Id"], "MessageId": message.message_id})
        return {"Successful": successful, "Failed": []}


class SimQueuePort:
    """The fan-out queue port (``send(bodies, delay_seconds)``): JSON bodies, sent 10 per
    SendMessageBatch through a :class:`SqsClient`."""

    def __init__(self, client: SqsClient, queue_url: str) -> None:
        self._client = client
        self.queue_url = queue_url

    def send(self, bodies: list[dict[str, Any]], delay_seconds: int = 0) -> None:
        for start in range(0, len(bodies), SQS_MAX_BATCH):
            chunk = bodies[start:start + SQS_MAX_BATCH]
            response = self._client.send_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(i), "MessageBody": json.dumps(body, sort_keys=True),
                          "DelaySeconds": delay_seconds} for i, body in enumerate(chunk)])
            if response.get("Failed"):
                raise RuntimeError(f"SendMessageBatch failed for {response['Failed']}")


class SqsQueue:
    """A standard queue with an optional dead-letter queue (see the module docstring)."""

    def __init__(self, sim: Simulation, account: Account, name: str, *, visibility_timeout: float = 30.0,
                 max_receive_count: int | None = None, dead_letter: SqsQueue | None = None) -> None:
        if (max_receive_count is None) != (dead_letter is None):
            raise ValueError("a redrive policy needs both max_receive_count and dead_letter")
        self.sim = sim
        self.account = account
        self.name = name
        self.url = f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT_ID}/{name}"
        self.arn = f"arn:aws:sqs:{REGION}:{ACCOUNT_ID}:{name}"
        self.visibility_timeout = visibility_timeout
        self.max_receive_count = max_receive_count
        self.dead_letter = dead_letter
        self.messages: dict[str, _Message] = {}
        self.sent = 0
        self.deleted = 0
        self.moved_to_dead_letter = 0
        self._source: SqsEventSource | None = None

    def reset_stats(self) -> None:
        self.sent = self.deleted = self.moved_to_dead_letter = 0
        if self._source is not None:
            self._source.reset_stats()
        if self.dead_letter is not None:
            self.dead_letter.reset_stats()

    def stats(self) -> dict[str, Any]:
        """Sent, deleted, redriven; the event source's batches and failures; what is left
        (and of it, how much was received more than once: failing again and again)."""
        source = self._source
        left = list(self.messages.values())
        return {"sent": self.sent, "deleted": self.deleted, "moved_to_dead_letter": self.moved_to_dead_letter,
                "in_queue": len(left),
                "in_queue_received_twice_or_more": sum(1 for m in left if m.receive_count > 1),
                "max_receive_count": max((m.receive_count for m in left), default=0),
                "batches": source.batches if source else 0,
                "failed_items": source.failed_items if source else 0,
                "failed_batches": source.failed_batches if source else 0,
                "max_concurrency": source.max_active if source else 0,
                "dead_letter_queue": len(self.dead_letter.messages) if self.dead_letter else 0}

    def client(self, queues: Mapping[str, SqsQueue] | None = None) -> SqsClient:
        return SqsClient(self.account, queues or {self.url: self})

    def port(self) -> SimQueuePort:
        return SimQueuePort(self.client(), self.url)

    def _enqueue(self, body: str, delay: int) -> _Message:
        now = self.sim.now
        message = _Message(f"{self.sim.token(4)}-{self.sim.token(2)}-{self.sim.token(2)}-{self.sim.token(6)}",
                           body, now, now + delay)
        self.messages[message.message_id] = message
        self.sent += 1
        if self._source is not None:
            self._source.wake(message.visible_at)
        return message

    def visible(self) -> list[_Message]:
        now = self.sim.now
        return [m for m in self.messages.values() if m.visible_at <= now]

    def attach(self, lambdas: LambdaService, function: str, *, batch_size: int = 10,
               max_concurrency: int | None = None, report_batch_item_failures: bool = True,
               poll_delay: float = 0.2) -> SqsEventSource:
        """A Lambda event source mapping from this queue to ``function``."""
        timeout = lambdas.functions[function].timeout
        if self.visibility_timeout < timeout:
            raise ValueError(f"queue {self.name}: visibility timeout {self.visibility_timeout} s is shorter "
                             f"than the function timeout {timeout} s (Lambda refuses the mapping)")
        if max_concurrency is not None and not 2 <= max_concurrency <= 1000:
            raise ValueError("maximum concurrency is 2..1000")
        self._source = SqsEventSource(self, lambdas, function, batch_size, max_concurrency,
                                      report_batch_item_failures, poll_delay)
        self._source.wake(self.sim.now)
        return self._source


class SqsEventSource:
    """Lambda's poller for one queue: batches of visible messages to the function."""

    def __init__(self, queue: SqsQueue, lambdas: LambdaService, function: str, batch_size: int,
                 max_concurrency: int | None, report_batch_item_failures: bool, poll_delay: float) -> None:
        if not 1 <= batch_size <= 10_000:
            raise ValueError("batch size is 1..10,000")
        self.queue = queue
        self.lambdas = lambdas
        self.function = function
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency or lambdas.concurrency
        self.report_batch_item_failures = report_batch_item_failures
        self.poll_delay = poll_delay
        self.active = 0
        self.max_active = 0
        self.batches = 0
        self.failed_items = 0
        self.failed_batches = 0
        self._wake_at: float | None = None

    def reset_stats(self) -> None:
        self.batches = self.failed_items = self.failed_batches = 0
        self.max_active = self.active

    def wake(self, when: float) -> None:
        """Poll at ``when`` (plus the poller's delay) unless a poll is due earlier."""
        due = max(when, self.queue.sim.now) + self.poll_delay
        if self._wake_at is not None and self._wake_at <= due:
            return
        self._wake_at = due
        self.queue.sim.at(due, lambda d=due: self._poll(d), f"poll {self.queue.name}")

    def _poll(self, due: float) -> None:
        if self._wake_at != due:
            return  # superseded by an earlier poll
        self._wake_at = None
        queue, sim = self.queue, self.queue.sim
        while self.active < self.max_concurrency:
            batch = self._receive()
            if not batch:
                break
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.batches += 1
            records = [{"messageId": m.message_id, "receiptHandle": m.message_id, "body": m.body,
                        "attributes": {"ApproximateReceiveCount": str(m.receive_count),
                                       "SentTimestamp": str(int(m.sent_at * 1000)),
                                       "ApproximateFirstReceiveTimestamp":
                                           str(int((m.first_received_at or sim.now) * 1000))},
                        "messageAttributes": {}, "eventSource": "aws:sqs", "eventSourceARN": queue.arn,
                        "awsRegion": REGION} for m in batch]
            self.lambdas.invoke(self.function, {"Records": records},
                                lambda inv, ids=[m.message_id for m in batch]: self._done(inv, ids))
        pending = [m.visible_at for m in queue.messages.values() if m.visible_at > sim.now]
        if pending and self.active < self.max_concurrency:
            self.wake(min(pending))

    def _receive(self) -> list[_Message]:
        queue, now = self.queue, self.queue.sim.now
        batch: list[_Message] = []
        for message in sorted(queue.visible(), key=lambda m: (m.visible_at, m.sent_at)):
            if len(batch) >= self.batch_size:
                break
            if queue.max_receive_count is not None and message.receive_count >= queue.max_receive_count:
                # Received maxReceiveCount times already: SQS redrives it instead.
                del queue.messages[message.message_id]
                queue.moved_to_dead_letter += 1
                assert queue.dead_letter is not None
                moved = queue.dead_letter._enqueue(message.body, 0)
                moved.receive_count = 0
                continue
            message.receive_count += 1
            message.first_received_at = message.first_received_at or now
            message.visible_at = now + queue.visibility_timeout
            batch.append(message)
        return batch

    def _done(self, invocation: Invocation, ids: list[str]) -> None:
        self.active -= 1
        queue = self.queue
        failed: set[str] = set(ids)
        if invocation.ok:
            result = invocation.result if isinstance(invocation.result, dict) else {}
            reported = result.get("batchItemFailures") if self.report_batch_item_failures else None
            if reported is None:
                failed = set()
            else:
                failed = {str(f.get("itemIdentifier")) for f in reported}
                if not failed <= set(ids):
                    failed = set(ids)  # an identifier not in the batch fails the whole batch
        else:
            self.failed_batches += 1
        self.failed_items += len(failed & set(ids))
        for message_id in ids:
            if message_id not in failed and message_id in queue.messages:
                del queue.messages[message_id]
                queue.deleted += 1
        # Failed messages come back when their visibility timeout ends.
        self.wake(queue.sim.now if not failed else min(
            (queue.messages[i].visible_at for i in failed if i in queue.messages), default=queue.sim.now))
        if queue.visible():
            self.wake(queue.sim.now)


def sqs_batch_handler(handle: Callable[[dict[str, Any], int], Any]) -> Callable[[Any, Any], dict[str, Any]]:
    """A worker function's handler for an SQS event source with ReportBatchItemFailures:
    ``handle(body, receive_count)`` per record, in order; a record whose ``handle`` raises is
    reported as failed (it comes back after the visibility timeout), the others are deleted.
    The container argument is ignored (per-container state lives in ``handle``'s closure)."""

    def handler(_container: Any, event: dict[str, Any]) -> dict[str, Any]:
        failures = []
        for record in event.get("Records", []):
            try:
                handle(json.loads(record["body"]), int(record["attributes"]["ApproximateReceiveCount"]))
            except Exception:
                failures.append({"itemIdentifier": record["messageId"]})
        return {"batchItemFailures": failures}

    return handler

