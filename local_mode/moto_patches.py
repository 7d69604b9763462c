"""What ``LocalAws`` changes in botocore and moto, process-wide and idempotently: one
botocore data loader for every session, retry back-off recorded instead of slept, moto's
DynamoDB made atomic per call (as DynamoDB's conditional writes are), moto's StartTask
given its ``networkConfiguration`` (as its RunTask is), its CloudWatch Logs judging an event's
age on the installed clock (a simulated world's, whose day is fixed), attribute values
serialized directly, moto's dispatch tables cached, its default AMIs only, its tables kept
sorted, one SNS signing key, boto3's DynamoDB parameter walks pruned
and its parameter copy made directly, botocore's parameter validation compiled per shape
(``install_emulator_speedups``)."""

from __future__ import annotations

import copy
import functools
import threading
import time as _time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import boto3

_loader_lock = threading.Lock()
_shared_loader: Any = None


def share_model_loader(session: boto3.session.Session) -> None:
    """Let every session reuse one botocore data loader: service models are parsed
    once per process instead of once per ``LocalAws`` (tests create many)."""
    global _shared_loader
    with _loader_lock:
        if _shared_loader is None:
            _shared_loader = session._session.get_component("data_loader")
        else:
            session._session.register_component("data_loader", _shared_loader)


class NoSleepTime:
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


def make_dynamodb_writes_atomic() -> None:
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


def compare_missing_attributes_as_dynamodb_does() -> None:
    """A comparison with an attribute the item does not have: ``=`` is false and ``<>`` true,
    whatever the other side (an ``{"NULL": true}`` value included), as DynamoDB compares the
    types first. moto compares the Python values, so ``missing = :null`` held there: a
    condition on a claim read as absent would pass in the emulator and fail in AWS.
    Idempotent."""
    from moto.dynamodb.comparisons import AttributePath, AttributeValue, OpEqual, OpNotEqual

    def one_side_missing(lhs: Any, rhs: Any, item: Any) -> bool:
        typed = (AttributePath, AttributeValue)  # size() and the like keep moto's rules
        return item is not None and isinstance(lhs, typed) and isinstance(rhs, typed) \
            and (lhs.get_type(item) is None) != (rhs.get_type(item) is None)

    for op, missing in ((OpEqual, False), (OpNotEqual, True)):
        compare = op.expr
        if getattr(compare, "_types_first", False):
            continue

        def expr(self: Any, item: Any, __compare: Any = compare, __missing: bool = missing) -> bool:
            if one_side_missing(self.lhs, self.rhs, item):
                return __missing
            return bool(__compare(self, item))

        expr._types_first = True  # type: ignore[attr-defined]
        op.expr = expr  # type: ignore[method-assign]


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

    def private_key(self: Any) -> Any:
        return shared_sns_signing_key()

    private_key._shared = True  # type: ignore[attr-defined]
    Subscription.private_key = private_key  # type: ignore[assignment]  # replaces an lru_cache


_signing_keys: list[Any] = []
_signing_key_lock = threading.Lock()


def shared_sns_signing_key() -> Any:
    """The one RSA key this process's moto signs SNS deliveries with, made on first use. A
    process that forks many runs (the crash campaigns' fork server) makes it before forking:
    otherwise every forked run whose first e-mail comes after the fork makes its own (a
    tenth of the campaigns' CPU)."""
    with _signing_key_lock:
        if not _signing_keys:
            from cryptography.hazmat.primitives.asymmetric import rsa

            _signing_keys.append(rsa.generate_private_key(public_exponent=65537, key_size=2048))
        return _signing_keys[0]


def judge_log_events_on_the_installed_clock() -> None:
    """moto's CloudWatch Logs takes no event older than 14 days (nor more than 2 hours ahead),
    judged on the wall clock: a simulated world's events, on its own clock (which starts on a
    fixed day), were all refused once that day was two weeks past. Its "now" is the installed
    clock's (``gpu_recovery.clock``: the simulation's in a world, the wall clock otherwise), as
    every other time the emulator answers is (idempotent)."""
    from datetime import UTC, datetime

    from moto.logs import models

    from gpu_recovery import clock as gr_clock

    if getattr(models.utcnow, "_installed_clock", False):
        return

    def installed_now() -> datetime:
        return datetime.fromtimestamp(gr_clock.now(), UTC).replace(tzinfo=None)

    installed_now._installed_clock = True  # type: ignore[attr-defined]
    models.utcnow = installed_now  # type: ignore[assignment]


def pass_start_task_network_configuration() -> None:
    """moto's StartTask drops ``networkConfiguration`` (its RunTask passes it to the task),
    so it refuses every task definition in the ``awsvpc`` mode as if none had been given:
    the request's configuration is handed to the tasks it creates, which then get their
    elastic network interface in its first subnet, as RunTask's do (idempotent)."""
    from moto.ecs import models, responses

    if getattr(responses.EC2ContainerServiceResponse.start_task, "_passes_network", False):
        return
    local = threading.local()
    respond = responses.EC2ContainerServiceResponse.start_task
    create = models.Task.__init__

    @functools.wraps(respond)
    def start_task(self: Any) -> Any:
        local.network = self._get_param("networkConfiguration")
        try:
            return respond(self)
        finally:
            local.network = None

    @functools.wraps(create)
    def task_init(self: Any, *args: Any, networking_configuration: Any = None, **kwargs: Any) -> None:
        kwargs["networking_configuration"] = networking_configuration or getattr(local, "network", None)
        create(self, *args, **kwargs)

    start_task._passes_network = True  # type: ignore[attr-defined]
    responses.EC2ContainerServiceResponse.start_task = start_task  # type: ignore[method-assign]
    models.Task.__init__ = task_init  # type: ignore[method-assign]


def _prune_boto3_dynamodb_transforms() -> None:
    """boto3's DynamoDB resource rewrites each call's parameters three times before botocore
    sees them (conditions to expressions, Python values to AttributeValues; then the answer
    back), each a walk of the parameters along the operation's input shapes that rewrites
    every member whose shape is the target (``ParameterTransformer``). The walk entered every
    member, an item's whole AttributeValue tree included, where no target shape could be:
    the condition walk alone was ~3.5 % of a crash campaign's broken run. It now enters a
    shape only if the target's name is among the shapes below it (computed once per shape and
    target from botocore's model, recursive shapes included): the same rewrites, not the
    fruitless visits (tests/local_mode/test_emulator_speedups.py compares both). Idempotent."""
    from boto3.dynamodb.transform import ParameterTransformer

    walk = ParameterTransformer._transform_parameters
    if getattr(walk, "_pruned", False):
        return
    below: dict[str, frozenset[str]] = {}

    def pruned(self: Any, model: Any, params: Any, transformation: Any, target_shape: str) -> None:
        names = below.get(model.name)  # a shape's name is unique in its service's model
        if names is None:
            names = below[model.name] = shapes_below(model)
        if target_shape in names:
            walk(self, model, params, transformation, target_shape)

    pruned._pruned = True  # type: ignore[attr-defined]
    pruned.__wrapped__ = walk  # type: ignore[attr-defined]
    ParameterTransformer._transform_parameters = pruned  # type: ignore[method-assign]


def _copy_dynamodb_params_directly() -> None:
    """boto3's DynamoDB resource deep-copies every call's parameters first (so its rewrites
    leave the caller's alone) with ``copy.deepcopy`` and a memo that remembers nothing: ~1.6 %
    of a crash campaign's broken run. :func:`copied_params` makes the same copy (dicts and
    lists copied, Python's immutable scalars kept, anything else through that same deepcopy)
    without deepcopy's per-object dispatch. Resources made from now on register it under
    boto3's own handler id. Idempotent."""
    from boto3.dynamodb import transform

    if getattr(transform.copy_dynamodb_params, "_direct", False):
        return
    original = transform.copy_dynamodb_params

    def copy_dynamodb_params(params: Any, **kwargs: Any) -> Any:
        return copied_params(params)

    copy_dynamodb_params._direct = True  # type: ignore[attr-defined]
    copy_dynamodb_params.__wrapped__ = original  # type: ignore[attr-defined]
    transform.copy_dynamodb_params = copy_dynamodb_params


#: the types ``copy.deepcopy`` returns as they are (atomic, or Decimal's own __deepcopy__)
_KEPT = frozenset({str, int, float, bool, type(None), bytes, Decimal})


def copied_params(value: Any) -> Any:
    """``copy.deepcopy(value, memo=boto3's _ForgetfulDict())``, dicts and lists directly."""
    kind = type(value)
    if kind is dict:
        return {k: copied_params(v) for k, v in value.items()}
    if kind is list:
        return [copied_params(v) for v in value]
    if kind in _KEPT:
        return value
    from boto3.dynamodb.transform import _ForgetfulDict

    return copy.deepcopy(value, memo=_ForgetfulDict())


def shapes_below(shape: Any) -> frozenset[str]:
    """The names of every shape reachable below ``shape`` (a botocore shape: its structure
    members, map values and list members, down to the leaves; recursive shapes once)."""
    found: set[str] = set()
    stack, seen = [shape], {(shape.name, shape.type_name)}
    while stack:
        node = stack.pop()
        if node.type_name == "structure":
            children = list(node.members.values())
        elif node.type_name == "map":
            children = [node.value]
        elif node.type_name == "list":
            children = [node.member]
        else:
            children = []
        for child in children:
            found.add(child.name)
            if (child.name, child.type_name) not in seen:
                seen.add((child.name, child.type_name))
                stack.append(child)
    return frozenset(found)


def install_emulator_speedups() -> None:
    """The emulator's changes to moto and botocore that only save CPU (same responses)."""
    _prune_boto3_dynamodb_transforms()
    _copy_dynamodb_params_directly()
    _share_botocore_data_loader()
    _share_moto_sns_signing_key()
    _serialize_attribute_values_directly()
    _cache_moto_dispatch_tables()
    _load_only_moto_default_amis()
    _keep_moto_tables_sorted()
    _compile_param_validation()


def _compile_param_validation() -> None:
    """botocore validates every request's parameters (each client's and the in-memory DynamoDB
    store's) by walking them along the input shape with per-value dispatch: ~7.5 % of a crash
    campaign's broken run. local_mode/sim/param_validation.py compiles once per shape whether
    botocore would report nothing (when it would, botocore's own walk reports); installed only
    over the botocore code it was copied from (its source pinned), once a process. Idempotent."""
    if _param_validation_tried:
        return
    _param_validation_tried.append(True)
    from local_mode.sim.param_validation import compile_param_validation

    compile_param_validation()


_param_validation_tried: list[bool] = []
