"""How an AWS call behaves from the caller's side, in the scale simulator: the base of its
boto3-shaped stand-in clients (:class:`SimClient`) and the simulated account they call
(:class:`Account`).

Every call's parameters are validated against botocore's model of the service; the call
takes a modelled latency (:class:`Latencies`) in simulated time; account-wide token
buckets (:class:`AccountRateLimit`: ECS's RunTask/StartTask/StopTask/
UpdateContainerInstancesState share burst 100, 40 per second; DescribeTasks/ListTasks/
DescribeContainerInstances/ListContainerInstances burst 100, 20 per second) refuse a call
over the limit with ThrottlingException, and botocore's *standard* retry mode applies as
the adapters configure it (``max_attempts`` 5 retries: up to 6 attempts; back-off
``random() * min(1 s * 2**(attempt-1), 20 s)`` for throttling; a retry quota of 500 per
client, 5 per throttled retry, :class:`RetryQuota`), sleeping in simulated time, then
ClientError. :class:`CallStats` counts every attempt.

:class:`StandInClient` is the base of the stand-ins whose operations raise
:class:`ClientFailure` for an API error (turned into the service's modeled ClientError).
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import botocore.session
from botocore.exceptions import ClientError, ParamValidationError
from botocore.validate import ParamValidator

from gpu_recovery.adapters.aws import MAX_RETRIES

from ..events import REGION
from .engine import Simulation


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


_ClientError: TypeAlias = ClientError


class _UnmodeledErrors:
    """``client.exceptions`` of a service without modeled errors (EC2): plain ClientError."""

    ClientError = ClientError

    @staticmethod
    def from_code(code: str) -> type[_ClientError]:
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
        #: holds every call to what AWS accepts (local_mode/sim/contract/requests.py; the
        #: scale world installs it once its cluster exists)
        self.requests: Any = None
        #: called with (service, operation, params) before every call of a stand-in client
        #: (the grants guard: local_mode.sim.contract); raising refuses the call
        self.call_checks: list[Callable[[str, str, Mapping[str, Any]], None]] = []

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
            if self.account.requests is not None:
                refused = self.account.requests.check(self.meta.service_model.service_name, model, params)
                if refused is not None:
                    raise self.error(operation, *refused)
        account, sim = self.account, self.sim
        for check in account.call_checks:
            check(self.service, operation, params)
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



class ClientFailure(Exception):
    """An API error a stand-in operation raises; :class:`StandInClient` turns it into the
    service's ClientError."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class StandInClient(SimClient):
    """A stand-in client whose operations raise :class:`ClientFailure` for API errors."""

    def _run(self, operation: str, params: dict[str, Any], fn: Callable[[dict[str, Any]], dict[str, Any]]
             ) -> dict[str, Any]:
        def execute(p: dict[str, Any]) -> dict[str, Any]:
            try:
                return fn(p)
            except ClientFailure as failure:
                raise self.error(operation, failure.code, failure.message) from None

        return self._call(operation, params, execute)
