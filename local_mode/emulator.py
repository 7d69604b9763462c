"""``LocalAws``: the embedded AWS emulator (moto) that local mode and tests run against.

Entering the context:

* starts ``moto.mock_aws()`` and sets fake credentials and region (us-east-1,
  account 123456789012), with AWS config files pointed at /dev/null;
* creates what the stack deploys: the DynamoDB tables (``table_definitions()``,
  PAY_PER_REQUEST: jobs, container instances, node tokens; and the jobs API's
  idempotency table, PK ``id``, TTL ``expiration``), the SNS topic
  ``gpu-training-notifications`` with an SQS queue subscribed (envelope delivery,
  so subject and message attributes survive), the ECS cluster and the DCGM
  health-check task definition (GPU resource requirement);
* sets every environment variable the Lambda handlers read (heartbeat settings
  included: stale 180 s, NODE_LOST fail 1800 s, hang detection off unless
  ``hang_seconds``, hang action ``notify``);
* resets ``gpu_recovery.adapters.aws`` and registers **dispatching** botocore hooks
  on its session before any handler client exists, so :class:`ApiHooks` listeners
  (the simulated ECS data plane) and :class:`~local_mode.faults.ApiFaults` (error
  injection) can be added at any time afterwards;
* makes botocore's retry back-off a no-op (delays are recorded in ``retry_sleeps``)
  so injected throttling costs no wall time;
* serializes DynamoDB attribute values in moto's responses directly (the same bytes as
  moto's generic serializer, a fraction of its CPU: see
  ``_serialize_attribute_values_directly``).

DynamoDB has two backends (``LocalAws(dynamodb=...)``):

* ``"moto"`` (the default): moto's DynamoDB, exact API behaviour for the tests that pin it;
* ``"memory"``: the in-memory store of ``local_mode.sim.dynamo`` behind real boto3
  clients (``local_mode.sim.dynamo.botocore_backend``), several times cheaper per call: the crash
  campaigns and the soak. The handlers' DynamoDB resource and client and the internal ones
  (``resource("dynamodb")``, ``client("dynamodb")``) read the same store, whose tables are
  created as above; every call goes through the same botocore events as a moto call, so the
  hooks, ``call_faults`` and ``faults`` see and break it alike (same service "dynamodb",
  operation and call site, same order; injected errors retried by botocore's standard
  retries). Not modelled there: TTL expiry (moto does not expire items either), streams,
  PartiQL, operations the stack does not use.

Exiting restores the environment, the clock and the adapters. Example::

    with LocalAws(max_recovery_attempts=2) as local:
        ...
        for n in local.notifications():
            print(n["subject"], n["attributes"].get("event_kind"))

``local.client("ecs")`` is an *internal* client (no hooks, no faults) for setup and
inspection; handlers use ``gpu_recovery.adapters.aws.client`` which sees the hooks.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import threading
import time as _time
from collections.abc import Callable
from typing import Any

import boto3
import botocore.endpoint
from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders
from moto import mock_aws
from moto.moto_api import state_manager

from gpu_recovery import clock as gr_clock
from gpu_recovery import constants as C
from gpu_recovery.adapters import aws

from .faults import ApiFaults, CallFaults
from .sim.dynamo import MemoryDynamo
from .sim.dynamo.botocore_backend import serve_dynamodb_from

ACCOUNT_ID = "123456789012"
REGION = "us-east-1"
TOPIC_NAME = "gpu-training-notifications"
QUEUE_NAME = "gpu-training-notifications-inbox"
GANG_QUEUE_NAME = "gpu-recovery-gang-batches"  # the gang fan-out's queue (see LocalEventBus.add_queue)
HEALTH_CHECK_LOG_GROUP = "/ecs/gpu-health-check"
PARAMS_KEY = "local_mode_params"
#: ``LocalAws(dynamodb=...)``: moto (exact API behaviour, the default) or the in-memory store
DYNAMODB_BACKENDS = ("moto", "memory")

BeforeCall = Callable[[dict[str, Any], dict[str, Any]], Any]
AfterCall = Callable[[dict[str, Any], int, dict[str, Any], dict[str, Any]], None]


def hook_answer(service: str, parsed: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A 200 answer a before-call hook returns instead of letting the call reach the emulator
    (the caller gets ``parsed``)."""
    http = AWSResponse(f"https://{service}.{REGION}.amazonaws.com/", 200, HTTPHeaders(), None)  # type: ignore[arg-type]
    metadata = {"HTTPStatusCode": 200, "HTTPHeaders": {}, "RetryAttempts": 0}
    return http, {**parsed, "ResponseMetadata": metadata}


class ApiHooks:
    """Per-operation listeners behind the botocore hooks ``LocalAws`` registers.

    * ``on_before_call(service, operation, fn)``: ``fn(params, context)`` sees the
      API parameters (as the caller passed them) before the call; returning
      ``(http_response, parsed)`` short-circuits it (the caller gets ``parsed``).
    * ``on_after_call(service, operation, fn)``: ``fn(params, status, parsed,
      context)`` sees every completed call (``parsed`` may be modified in place).

    ``service`` is the botocore service id in event-name form ("ecs", "ec2", "ssm").
    ``context`` is botocore's per-call dict: before- and after-call share it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._before: dict[tuple[str, str], list[BeforeCall]] = {}
        self._after: dict[tuple[str, str], list[AfterCall]] = {}

    def on_before_call(self, service: str, operation: str, fn: BeforeCall) -> None:
        with self._lock:
            self._before.setdefault((service, operation), []).append(fn)

    def on_after_call(self, service: str, operation: str, fn: AfterCall) -> None:
        with self._lock:
            self._after.setdefault((service, operation), []).append(fn)

    def clear(self) -> None:
        with self._lock:
            self._before.clear()
            self._after.clear()

    # --- botocore handlers -------------------------------------------------------
    @staticmethod
    def _key(model: Any) -> tuple[str, str]:
        return model.service_model.service_id.hyphenize(), model.name

    def stash_params(self, params: dict[str, Any], model: Any, context: Any = None, **_: Any):
        """The parameters as the caller passed them, for this call's listeners (none: no copy;
        listeners are registered while the world is set up, before the calls they watch)."""
        if context is None:
            return
        key = self._key(model)
        with self._lock:
            if key not in self._before and key not in self._after:
                return
        try:
            context[PARAMS_KEY] = copy.deepcopy(params)
        except Exception:  # streaming bodies and the like
            context[PARAMS_KEY] = dict(params)

    def before_call(self, model: Any, params: Any, context: Any = None, **_: Any) -> Any:
        with self._lock:
            fns = list(self._before.get(self._key(model), ()))
        if not fns or context is None:
            return None
        context["local_mode_request"] = params
        api_params = context.get(PARAMS_KEY, {})
        for fn in fns:
            result = fn(api_params, context)
            if result is not None:
                return result
        return None

    def after_call(
        self, http_response: Any, parsed: Any, model: Any, context: Any = None, **_: Any
    ) -> None:
        with self._lock:
            fns = list(self._after.get(self._key(model), ()))
        if not fns or context is None:
            return
        status = getattr(http_response, "status_code", 200)
        api_params = context.get(PARAMS_KEY, {})
        for fn in fns:
            fn(api_params, status, parsed, context)


_loader_lock = threading.Lock()
_shared_loader: Any = None


def _share_model_loader(session: boto3.session.Session) -> None:
    """Let every session reuse one botocore data loader: service models are parsed
    once per process instead of once per ``LocalAws`` (tests create many)."""
    global _shared_loader
    with _loader_lock:
        if _shared_loader is None:
            _shared_loader = session._session.get_component("data_loader")
        else:
            session._session.register_component("data_loader", _shared_loader)


class _NoSleepTime:
    """Stand-in for ``time`` inside botocore.endpoint: retry back-off is recorded."""

    def __init__(self, record: Callable[[float], None]) -> None:
        self._record = record

    def sleep(self, seconds: float) -> None:
        self._record(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(_time, name)


_DYNAMODB_WRITES = ("put_item", "update_item", "delete_item", "transact_write_items",
                    "batch_write_item",
                    # Reads too: moto iterates a table's item dict to answer them, and a write
                    # from another thread meanwhile raises "dictionary changed size during
                    # iteration" (seen once in CI with 8 ranks failing from 8 threads).
                    "get_item", "query", "scan", "batch_get_item", "transact_get_items")
_dynamodb_lock = threading.RLock()


def _make_dynamodb_writes_atomic() -> None:
    """Serialize moto's DynamoDB writes (and reads, which must not see a write half-done).

    moto evaluates a ConditionExpression and then writes, without a lock, so two
    threads can both pass the same condition. Real DynamoDB applies a conditional
    write atomically per item; the recovery loop's exactly-once guarantees rest on
    that, so the emulator must provide it too. Idempotent: wraps each method once.
    """
    from moto.dynamodb.models import DynamoDBBackend

    for name in _DYNAMODB_WRITES:
        method = getattr(DynamoDBBackend, name)
        if getattr(method, "_atomic", False):
            continue

        def atomic(self: Any, *args: Any, __method: Any = method, **kwargs: Any) -> Any:
            with _dynamodb_lock:
                return __method(self, *args, **kwargs)

        atomic._atomic = True  # type: ignore[attr-defined]
        atomic.__name__ = name
        setattr(DynamoDBBackend, name, atomic)


class _Generic:
    """Marker: this value needs moto's generic, model-driven serialization."""


_GENERIC = _Generic()
_ATTRIBUTE_VALUE_MEMBERS = ("S", "N", "B", "SS", "NS", "BS", "M", "L", "NULL", "BOOL")
_ATTRIBUTE_VALUE_KEYS = frozenset(_ATTRIBUTE_VALUE_MEMBERS)


def _attribute_value_wire(value: Any, base64: Callable[[Any], str]) -> Any:
    """A DynamoDB ``AttributeValue`` dict as moto's JSON serializer writes it, or _GENERIC.

    moto 5.2 serializes every response through the service model, member by member, with
    an alias lookup per member; for items (10 members per attribute, nested) that is most
    of the emulator's CPU time. This is the same walk for the one shape that dominates:
    members in model order, strings as they are, blobs base64-encoded by the serializer's
    own encoder, booleans raw, maps and lists recursively (a None map value dropped, a None
    list item kept). Anything else (an unknown key, a non-str string, a non-dict value)
    returns _GENERIC and goes through moto's path, so the output is byte-for-byte moto's.
    """
    if type(value) is not dict or not value.keys() <= _ATTRIBUTE_VALUE_KEYS:
        return _GENERIC
    wire: dict[str, Any] = {}
    for name in _ATTRIBUTE_VALUE_MEMBERS:
        member = value.get(name)
        if member is None:
            continue
        if name in ("S", "N"):
            if type(member) is not str:
                return _GENERIC
            wire[name] = member
        elif name in ("NULL", "BOOL"):
            wire[name] = member
        elif name == "B":
            if not isinstance(member, bytes | str):
                return _GENERIC
            wire[name] = base64(member)
        elif name in ("SS", "NS"):
            if type(member) is not list or any(type(m) is not str for m in member):
                return _GENERIC
            wire[name] = list(member)
        elif name == "BS":
            if type(member) is not list or not all(isinstance(m, bytes | str) for m in member):
                return _GENERIC
            wire[name] = [base64(m) for m in member]
        elif name == "M":
            if type(member) is not dict:
                return _GENERIC
            entries = {}
            for key, item in member.items():
                if item is None:
                    continue
                item_wire = _attribute_value_wire(item, base64)
                if item_wire is _GENERIC:
                    return _GENERIC
                entries[key] = item_wire
            wire[name] = entries
        else:  # "L"
            if type(member) is not list:
                return _GENERIC
            items = []
            for item in member:
                item_wire = None if item is None else _attribute_value_wire(item, base64)
                if item_wire is _GENERIC:
                    return _GENERIC
                items.append(item_wire)
            wire[name] = items
    return wire


def _serialize_attribute_values_directly() -> None:
    """Route moto's JSON serialization of DynamoDB ``AttributeValue`` structures through
    :func:`_attribute_value_wire` (same bytes, a fraction of the CPU). Idempotent.

    Only the response serializer changes: request parsing, errors (ConditionalCheckFailed,
    TransactionCanceledException with its CancellationReasons) and every other shape and
    service keep moto's code. ``tests/local_mode/test_emulator_serialization.py`` compares
    the response bodies with and without it for every operation the repositories use.
    """
    from moto.core.serialize import BaseJSONSerializer

    generic = BaseJSONSerializer._serialize_type_structure
    if getattr(generic, "_attribute_values_direct", False):
        return

    def serialize_structure(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
        if key and shape.name == "AttributeValue" and self.service_model.service_name == "dynamodb":
            wire = _attribute_value_wire(value, self._base64)
            if wire is not _GENERIC:
                self._default_serialize(serialized, wire, shape, key)
                return
        generic(self, serialized, value, shape, key)

    serialize_structure._attribute_values_direct = True  # type: ignore[attr-defined]
    serialize_structure._generic = generic  # type: ignore[attr-defined]
    BaseJSONSerializer._serialize_type_structure = serialize_structure  # type: ignore[method-assign]



def _cache_moto_dispatch_tables() -> None:
    """moto lists a response class's methods with ``inspect.getmembers`` on every request
    (``call_action``: is the action implemented?): a quarter of a small call's CPU. The
    classes do not change while the emulator runs, so the list is computed once per
    class. Idempotent."""
    import moto.core.responses as responses

    listing = responses.method_names_from_class
    if getattr(listing, "_cached", False):
        return
    cached = functools.lru_cache(maxsize=None)(listing)
    cached._cached = True  # type: ignore[attr-defined]
    responses.method_names_from_class = cached  # type: ignore[assignment]


def _load_only_moto_default_amis() -> None:
    """Each EC2 backend (one per emulator) builds moto's 44 default AMIs plus 2,558
    per-region "latest" and ECS-optimized ones: ~0.15 s of CPU per emulator. Nothing
    here looks images up (the simulated nodes launch moto default ``ami-12c6146b``), so
    the emulator's EC2 knows the 44 defaults only. Idempotent."""
    from moto.ec2.models import amis

    if getattr(amis.AmiBackend._load_amis, "_defaults_only", False):
        return

    def load_default_amis(self: Any) -> None:
        for spec in amis.AMIS:  # what moto's _load_amis does before the per-region files
            spec["owner_alias"] = "amazon"
            if (created := spec.get("creation_date")) and isinstance(created, str):
                spec["creation_date"] = amis.parse_timestamp(created)
            self.amis[spec["ami_id"]] = amis.Ami(self, **spec)

    load_default_amis._defaults_only = True  # type: ignore[attr-defined]
    amis.AmiBackend._load_amis = load_default_amis  # type: ignore[method-assign]


def _keep_moto_tables_sorted() -> None:
    """moto answers every Query (of a table or of an index) by sorting *all* the table's
    items first (``Table.all_items``), then filtering: O(n log n) Python comparisons per
    Query, the top of the profile once a test's table holds a few thousand items. The
    sorted list only changes when an item is added or removed (``put_item`` /
    ``delete_item``; an update keeps the keys), so it is kept until then. Callers get a
    copy, as before. Idempotent."""
    from moto.dynamodb.models.table import Table

    if getattr(Table.all_items, "_kept_sorted", False):
        return
    sort_all_items, put_item, delete_item = Table.all_items, Table.put_item, Table.delete_item

    def bump(table: Any) -> None:
        table._sorted_version = getattr(table, "_sorted_version", 0) + 1

    def put_and_bump(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return put_item(self, *args, **kwargs)
        finally:
            bump(self)  # after the change: a list sorted meanwhile is not kept

    def delete_and_bump(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return delete_item(self, *args, **kwargs)
        finally:
            bump(self)

    def all_items(self: Any) -> list[Any]:
        key = (id(self.items), getattr(self, "_sorted_version", 0))
        kept = getattr(self, "_sorted_items", None)
        if kept is None or kept[0] != key:
            kept = self._sorted_items = (key, sort_all_items(self))
        return list(kept[1])

    all_items._kept_sorted = True  # type: ignore[attr-defined]
    Table.all_items = all_items  # type: ignore[method-assign]
    Table.put_item = put_and_bump  # type: ignore[method-assign]
    Table.delete_item = delete_and_bump  # type: ignore[method-assign]


def _share_botocore_data_loader() -> None:
    """Every botocore session builds its own data loader, which parses the service models'
    JSON again (ec2's alone is several MB): ~60 ms per model per session. The project makes
    a session per handler reset and the emulator one per run, so a test run parsed the same
    files thousands of times. All sessions with the same data path now share one loader
    (botocore caches what it loads per loader; the models are read-only). Idempotent."""
    from botocore import loaders, session

    register = session.Session._register_data_loader
    if getattr(register, "_shared", False):
        return
    shared: dict[Any, loaders.Loader] = {}
    lock = threading.Lock()

    def shared_loader(data_path: Any) -> loaders.Loader:
        key = str(data_path)
        with lock:
            if key not in shared:
                shared[key] = loaders.create_loader(data_path)
            return shared[key]

    def register_shared(self: Any) -> None:
        self._components.lazy_register_component(
            "data_loader", lambda: shared_loader(self.get_config_variable("data_path")))

    register_shared._shared = True  # type: ignore[attr-defined]
    session.Session._register_data_loader = register_shared  # type: ignore[method-assign]


def _share_moto_sns_signing_key() -> None:
    """moto signs every message an SNS subscription delivers with a 2048-bit RSA key it
    generates for that subscription the first time (~0.1 s of CPU, a random amount): in a
    crash campaign, once per forked run whose first e-mail comes after the fork. One key per
    process signs for every subscription (moto makes the certificate that goes with it per
    message, as before; nothing here checks signatures). Idempotent."""
    from moto.sns.models import Subscription

    if getattr(Subscription.private_key, "_shared", False):
        return
    lock = threading.Lock()
    keys: list[Any] = []

    def private_key(self: Any) -> Any:
        with lock:
            if not keys:
                from cryptography.hazmat.primitives.asymmetric import rsa

                keys.append(rsa.generate_private_key(public_exponent=65537, key_size=2048))
            return keys[0]

    private_key._shared = True  # type: ignore[attr-defined]
    Subscription.private_key = private_key  # type: ignore[method-assign]


def install_emulator_speedups() -> None:
    """The emulator's changes to moto and botocore that only save CPU (same responses)."""
    _share_botocore_data_loader()
    _share_moto_sns_signing_key()
    _serialize_attribute_values_directly()
    _cache_moto_dispatch_tables()
    _load_only_moto_default_amis()
    _keep_moto_tables_sorted()


class LocalAws:
    """Context manager: moto + the stack's resources + handler environment."""

    _active: list[LocalAws] = []

    @classmethod
    def active(cls) -> LocalAws | None:
        """The innermost LocalAws entered (local-mode wiring finds its hooks here)."""
        return cls._active[-1] if cls._active else None

    def __init__(
        self,
        *,
        cluster_name: str = "gpu-cluster",
        max_recovery_attempts: int = 1,
        suspect_exit_codes: tuple[int, ...] | list[int] = (1,),
        reboot_timeout_minutes: int = 15,
        health_check_timeout_minutes: int = 30,
        dcgm_level: int = 2,
        health_check_gpus: int = 8,
        service_name: str = "gpu-recovery",
        heartbeat_stale_seconds: int = 180,
        node_lost_fail_seconds: int = 1800,
        hang_seconds: int = 0,
        hang_action: str = "notify",
        metrics_disabled: bool = False,
        sleep_on_retry: bool = False,
        extra_env: dict[str, str] | None = None,
        dynamodb: str = "moto",
    ) -> None:
        if dynamodb not in DYNAMODB_BACKENDS:
            raise ValueError(f"dynamodb is one of {DYNAMODB_BACKENDS}, not {dynamodb!r}")
        #: where the tables live: "moto" or "memory" (see the module docstring)
        self.dynamodb_backend = dynamodb
        #: the in-memory store (``dynamodb="memory"``), None with moto
        self.memory_dynamodb: MemoryDynamo | None = None
        self.cluster_name = cluster_name
        self.cluster_arn = f"arn:aws:ecs:{REGION}:{ACCOUNT_ID}:cluster/{cluster_name}"
        self.account_id = ACCOUNT_ID
        self.region = REGION
        self.job_table = C.DEFAULT_JOB_TABLE_NAME
        self.instance_table = C.DEFAULT_INSTANCE_TABLE_NAME
        self.node_token_table = C.DEFAULT_NODE_TOKEN_TABLE_NAME
        self.idempotency_table = C.DEFAULT_IDEMPOTENCY_TABLE_NAME
        self.quota_table = C.DEFAULT_QUOTA_TABLE_NAME
        self.health_check_gpus = health_check_gpus
        self.topic_arn = ""
        self.queue_url = ""
        self.health_check_task_definition_arn = ""
        self.gpu_reset_task_definition_arn = ""
        self.hooks = ApiHooks()
        self.faults = ApiFaults()
        #: one fault at the n-th API call (crash-consistency tests)
        self.call_faults = CallFaults()
        #: back-off delays botocore asked for (not slept unless sleep_on_retry)
        self.retry_sleeps: list[float] = []
        self._sleep_on_retry = sleep_on_retry
        self._settings = {
            C.ENV_JOB_TABLE: self.job_table,
            C.ENV_INSTANCE_TABLE: self.instance_table,
            C.ENV_CLUSTER_NAME: cluster_name,
            C.ENV_MAX_RECOVERY_ATTEMPTS: str(max_recovery_attempts),
            C.ENV_SUSPECT_EXIT_CODES: json.dumps(list(suspect_exit_codes)),
            C.ENV_REBOOT_TIMEOUT_MINUTES: str(reboot_timeout_minutes),
            C.ENV_HEALTH_CHECK_TIMEOUT_MINUTES: str(health_check_timeout_minutes),
            C.ENV_DCGM_LEVEL: str(dcgm_level),
            C.ENV_HEALTH_CHECK_GPUS: str(health_check_gpus),
            C.ENV_HEALTH_CHECK_LOG_GROUP: HEALTH_CHECK_LOG_GROUP,
            C.ENV_NODE_TOKEN_TABLE: self.node_token_table,
            C.ENV_IDEMPOTENCY_TABLE: self.idempotency_table,
            C.ENV_QUOTA_TABLE: self.quota_table,
            C.ENV_HEARTBEAT_STALE_SECONDS: str(heartbeat_stale_seconds),
            C.ENV_NODE_LOST_FAIL_SECONDS: str(node_lost_fail_seconds),
            C.ENV_HANG_SECONDS: str(hang_seconds),
            C.ENV_HANG_ACTION: hang_action,
            C.ENV_POWERTOOLS_SERVICE_NAME: service_name,
            C.ENV_POWERTOOLS_METRICS_NAMESPACE: C.METRICS_NAMESPACE,
            "POWERTOOLS_TRACE_DISABLED": "true",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        if metrics_disabled:
            self._settings["POWERTOOLS_METRICS_DISABLED"] = "true"
        self._settings.update(extra_env or {})
        self.node_token_table = self._settings[C.ENV_NODE_TOKEN_TABLE]
        self.idempotency_table = self._settings[C.ENV_IDEMPOTENCY_TABLE]
        self.quota_table = self._settings[C.ENV_QUOTA_TABLE]
        #: tables created on the stack's behalf (see ``_tolerate_create_table``)
        self._provisioned_tables: set[str] = set()
        self.env: dict[str, str] = {}
        self._saved_env: dict[str, str | None] = {}
        self._mock: Any = None
        self._session: boto3.session.Session | None = None
        self._clients: dict[str, Any] = {}
        self._client_lock = threading.Lock()
        self._notif_lock = threading.Lock()
        self._notifications: list[dict[str, Any]] = []
        self._saved_endpoint_time: Any = None

    # --- lifecycle ---------------------------------------------------------------
    def __enter__(self) -> LocalAws:
        self._set_env(self._settings)
        self._mock = mock_aws()
        self._mock.start()
        _make_dynamodb_writes_atomic()
        install_emulator_speedups()
        # moto advances a described task RUNNING -> ... -> STOPPED on its own; the
        # simulated data plane owns task state instead.
        state_manager.set_transition("ecs::task", {"progression": "manual", "times": 10**12})
        self._saved_endpoint_time = botocore.endpoint.time
        if not self._sleep_on_retry:
            botocore.endpoint.time = _NoSleepTime(self.retry_sleeps.append)  # type: ignore[assignment]
        self._session = boto3.session.Session()
        _share_model_loader(self._session)
        if self.dynamodb_backend == "memory":
            # No transaction-conflict model: moto has none, and the two backends answer alike.
            self.memory_dynamodb = MemoryDynamo(tx_conflict_window=0,
                                                arn_prefix=f"arn:aws:dynamodb:{REGION}:{ACCOUNT_ID}")
            serve_dynamodb_from(self._session, self.memory_dynamodb)
        try:
            self._create_resources()
        except Exception:
            self.__exit__(None, None, None)
            raise
        aws.reset()
        _share_model_loader(aws.session())
        events = aws.session().events
        events.register("before-parameter-build", self.hooks.stash_params)
        events.register("before-call", self.hooks.before_call)
        events.register("after-call", self.hooks.after_call)
        events.register_first("before-send", self.faults.before_send)
        events.register_first("before-call", self.call_faults.before_call)
        events.register_last("after-call", self.call_faults.after_call)
        if self.memory_dynamodb is not None:
            # After the hooks: the handlers' DynamoDB clients carry them as moto's would.
            serve_dynamodb_from(aws.session(), self.memory_dynamodb)
        LocalAws._active.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self in LocalAws._active:
            LocalAws._active.remove(self)
        aws.reset()
        gr_clock.reset_clock()
        self.hooks.clear()
        if self._saved_endpoint_time is not None:
            botocore.endpoint.time = self._saved_endpoint_time
            self._saved_endpoint_time = None
        state_manager.unset_transition("ecs::task")
        if self._mock is not None:
            self._mock.stop()
            self._mock = None
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()
        self._clients.clear()
        self.memory_dynamodb = None

    def _set_env(self, values: dict[str, str]) -> None:
        for key, value in values.items():
            if key not in self._saved_env:
                self._saved_env[key] = os.environ.get(key)
            os.environ[key] = value
            self.env[key] = value

    def client(self, service: str) -> Any:
        """Internal client: bypasses the hooks and fault injection."""
        assert self._session is not None, "use inside `with LocalAws()`"
        with self._client_lock:
            if service not in self._clients:
                self._clients[service] = self._session.client(service, region_name=REGION)
            return self._clients[service]

    def resource(self, service: str) -> Any:
        """Internal resource (e.g. DynamoDB tables to inspect): no hooks, no faults."""
        assert self._session is not None, "use inside `with LocalAws()`"
        with self._client_lock:
            key = f"resource:{service}"
            if key not in self._clients:
                self._clients[key] = self._session.resource(service, region_name=REGION)
            return self._clients[key]

    def _create_resources(self) -> None:
        # Setup code written before LocalAws provided the node-token / idempotency tables
        # creates them itself (registered before the first internal client exists).
        self._session.events.register(  # type: ignore[union-attr]
            "before-call.dynamodb.CreateTable", self._tolerate_create_table
        )
        ddb = self.client("dynamodb")
        defs = C.table_definitions()
        for kind, name in (("job", self.job_table), ("instance", self.instance_table),
                           ("node_token", self.node_token_table), ("quota", self.quota_table)):
            ddb.create_table(TableName=name, BillingMode="PAY_PER_REQUEST", **defs[kind])
        ddb.create_table(
            TableName=self.idempotency_table,
            BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        )
        with contextlib.suppress(Exception):  # TTL is optional in the emulator
            ddb.update_time_to_live(
                TableName=self.idempotency_table,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": "expiration"},
            )
        self._provisioned_tables = {self.node_token_table, self.idempotency_table}
        sns, sqs = self.client("sns"), self.client("sqs")
        self.topic_arn = sns.create_topic(Name=TOPIC_NAME)["TopicArn"]
        self.queue_url = sqs.create_queue(QueueName=QUEUE_NAME)["QueueUrl"]
        self.gang_queue_url = sqs.create_queue(QueueName=GANG_QUEUE_NAME)["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        sns.subscribe(
            TopicArn=self.topic_arn,
            Protocol="sqs",
            Endpoint=queue_arn,
            Attributes={"RawMessageDelivery": "false"},
        )
        ecs = self.client("ecs")
        ecs.create_cluster(clusterName=self.cluster_name)
        self.health_check_task_definition_arn = ecs.register_task_definition(
            family=C.DEFAULT_HEALTH_CHECK_FAMILY,
            requiresCompatibilities=["EC2"],
            networkMode="host",
            containerDefinitions=[
                {
                    "name": C.HEALTH_CHECK_CONTAINER_NAME,
                    "image": "nvcr.io/nvidia/cloud-native/dcgm:latest",
                    "memory": 1024,
                    "essential": True,
                    "command": ["/opt/health_check/dcgm_health_check.sh"],
                    "resourceRequirements": [
                        {"type": "GPU", "value": str(self.health_check_gpus)}
                    ],
                    "logConfiguration": {
                        "logDriver": "awslogs",
                        "options": {
                            "awslogs-group": HEALTH_CHECK_LOG_GROUP,
                            "awslogs-region": REGION,
                            "awslogs-stream-prefix": C.HEALTH_CHECK_LOG_STREAM_PREFIX,
                        },
                    },
                }
            ],
        )["taskDefinition"]["taskDefinitionArn"]
        # The GPU reset task (recovery.gpu_resets): every GPU of the node, like the check.
        self.gpu_reset_task_definition_arn = ecs.register_task_definition(
            family=C.DEFAULT_GPU_RESET_FAMILY, requiresCompatibilities=["EC2"], networkMode="host",
            containerDefinitions=[{
                "name": "gpu-reset", "image": "nvcr.io/nvidia/cloud-native/dcgm:latest", "memory": 512,
                "essential": True, "privileged": True, "command": ["/opt/health_check/gpu_reset.sh"],
                "resourceRequirements": [{"type": "GPU", "value": str(self.health_check_gpus)}],
            }],
        )["taskDefinition"]["taskDefinitionArn"]
        self.client("logs").create_log_group(logGroupName=HEALTH_CHECK_LOG_GROUP)
        self._set_env(
            {
                C.ENV_SNS_TOPIC_ARN: self.topic_arn,
                C.ENV_HEALTH_CHECK_TASK: self.health_check_task_definition_arn,
                C.ENV_GPU_RESET_TASK: self.gpu_reset_task_definition_arn,
                C.ENV_GANG_QUEUE_URL: self._settings.get(C.ENV_GANG_QUEUE_URL, self.gang_queue_url),
            }
        )

    def _tolerate_create_table(self, params: dict[str, Any], **_: Any) -> Any:
        """Internal clients: CreateTable of a table LocalAws already provisioned (node
        tokens, idempotency) answers with the existing table instead of
        ResourceInUseException, so older fixtures that create it themselves still work."""
        body = params.get("body")
        try:  # moto's clients send JSON; the memory store's get the parameters themselves
            name = (body if isinstance(body, dict) else json.loads(body or b"{}")).get("TableName")
        except (TypeError, ValueError, AttributeError):
            return None
        if name not in self._provisioned_tables:
            return None
        description = self._table_description(name)
        if description is None:
            return None  # gone (deleted by the caller): a real CreateTable
        return hook_answer("dynamodb", {"TableDescription": description})

    def _table_description(self, name: str) -> dict[str, Any] | None:
        if self.memory_dynamodb is not None:
            status, described = self.memory_dynamodb.respond("DescribeTable", {"TableName": name})
            return described["Table"] if status == 200 else None
        try:
            from moto.dynamodb.models import dynamodb_backends

            table = dynamodb_backends[ACCOUNT_ID][REGION].get_table(name)
        except Exception:
            return None
        return table.describe(base_key="TableDescription")["TableDescription"]  # type: ignore[no-any-return]

    # --- notifications -----------------------------------------------------------
    def notifications(self) -> list[dict[str, Any]]:
        """Every SNS notification published so far, oldest first.

        Each is ``{"subject", "message", "attributes", "message_id", "timestamp"}``;
        ``message`` is JSON-decoded when it is JSON, ``attributes`` maps name -> value.
        """
        sqs = self.client("sqs")
        with self._notif_lock:
            while True:
                resp = sqs.receive_message(
                    QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
                )
                msgs = resp.get("Messages", [])
                if not msgs:
                    break
                for m in msgs:
                    env = json.loads(m["Body"])
                    message: Any = env.get("Message", "")
                    with contextlib.suppress(TypeError, ValueError):
                        message = json.loads(message)
                    self._notifications.append(
                        {
                            "subject": env.get("Subject"),
                            "message": message,
                            "attributes": {
                                k: v.get("Value")
                                for k, v in (env.get("MessageAttributes") or {}).items()
                            },
                            "message_id": env.get("MessageId"),
                            "timestamp": env.get("Timestamp"),
                        }
                    )
                    sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=m["ReceiptHandle"])
            return list(self._notifications)
