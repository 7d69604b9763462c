"""moto's dispatch with its fixed work kept (local_mode/sim/moto_dispatch.py) answers every
call exactly as moto's own: whole flows run both ways, every moto-served answer compared."""

from __future__ import annotations

import copy
import datetime
import itertools
import random
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import botocore.client
import pytest
from botocore.exceptions import ClientError

import local_mode.emulator as emulator
from local_mode.campaigns.catalog import RUNS
from local_mode.sim import moto_dispatch, moto_serializer

#: flows whose moto-served calls cover ECS (container instances, attributes, tasks), EC2,
#: CloudWatch Logs, SNS and SQS
FLOWS = ("node_wedged", "held_autoclose", "gpu_reset")


@pytest.fixture
def moto_own_dispatch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """moto's functions as moto ships them for the test; the kept ones again after it."""
    moto_dispatch.uninstall_moto_dispatch()
    monkeypatch.setattr(emulator, "install_moto_dispatch", lambda: None)
    yield
    monkeypatch.undo()
    moto_dispatch.uninstall_moto_dispatch()


def _moto_served_answers(flow: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every call of ``flow`` that reaches botocore's own ``_make_api_call`` (all but the
    DynamoDB store's): service, operation, parameters and the parsed answer or error."""
    answers: list[tuple[Any, ...]] = []
    make_api_call = botocore.client.BaseClient._make_api_call

    def recorded(client: Any, operation: str, params: dict[str, Any]) -> Any:
        sent = copy.deepcopy(params)
        name = client.meta.service_model.service_name
        try:
            answer = make_api_call(client, operation, params)
        except ClientError as error:
            answers.append((name, operation, sent, "error", _without_metadata(error.response)))
            raise
        answers.append((name, operation, sent, "answer", _without_metadata(answer)))
        return answer

    tokens, hexes = itertools.count(), random.Random(0)
    with monkeypatch.context() as patch:
        patch.setattr(botocore.client.BaseClient, "_make_api_call", recorded)
        # the same in both runs: botocore's idempotency tokens (ClientToken), which moto echoes,
        # and the simulated GPUs' ids (local_mode.sim.ecs_core)
        patch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=next(tokens)))
        patch.setattr(secrets, "token_hex", lambda n=32: f"{hexes.getrandbits(n * 8):0{n * 2}x}")
        RUNS[flow](None)
    return answers


def _without_metadata(answer: dict[str, Any]) -> Any:
    """The answer but its HTTP metadata (the Date header is the wall clock's), each
    timestamp moto took from the wall clock as its type and time zone."""
    return _wall_clock_free({key: value for key, value in answer.items() if key != "ResponseMetadata"})


def _wall_clock_free(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _wall_clock_free(member) for key, member in value.items()}
    if isinstance(value, list):
        return [_wall_clock_free(member) for member in value]
    if isinstance(value, datetime.datetime):
        return ("datetime", type(value.tzinfo))
    return value


@pytest.mark.parametrize("flow", FLOWS)
def test_every_moto_served_answer_is_moto_own(flow: str, moto_own_dispatch: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    own = _moto_served_answers(flow, monkeypatch)
    assert moto_dispatch.memoize_stubber_routes() and moto_dispatch.memoize_serializer_aliases()
    assert moto_serializer.memoize_json_structures()
    kept = _moto_served_answers(flow, monkeypatch)
    services = {answer[0] for answer in own}
    assert {"ecs", "ec2", "sns"} <= services, services
    assert len(kept) == len(own)
    for own_answer, kept_answer in zip(own, kept, strict=True):
        assert kept_answer == own_answer


# --- the kept attribute names: keyed by all they depend on ------------------------------------

def _shapes() -> dict[str, Any]:
    """Two structures and a string member, as moto's model resolves them."""
    from moto.core.model import ShapeResolver

    resolver = ShapeResolver({
        "Task": {"type": "structure", "members": {"taskArn": {"shape": "String"}}},
        "Other": {"type": "structure", "members": {"taskArn": {"shape": "String"}}},
        "String": {"type": "string"}})
    return {name: resolver.get_shape_by_name(name) for name in ("Task", "Other", "String")}


class Cluster:
    """An object moto serializes: ``clusterName`` may be read as ``name`` (class prefix)."""

    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)


class Service(Cluster):
    """Same attributes, another class: no class prefix for ``clusterName``."""


class _Serializer:
    """What ``ResponseSerializer.get_value`` reads of its serializer."""

    def __init__(self, picker: Any) -> None:
        self._value_picker, self.path = picker, ["DescribeClusters", "clusters"]


def _moto_picked(serializer: _Serializer, value: Any, key: str, shape: Any) -> Any:
    """moto's own ``ResponseSerializer.get_value``."""
    from moto.core.serialize import AttributePickerContext

    return serializer._value_picker(AttributePickerContext(
        obj=value, key=key, shape=shape, key_path=".".join(serializer.path)))


@pytest.fixture
def kept_names() -> Iterator[None]:
    moto_dispatch.uninstall_moto_dispatch()
    assert moto_dispatch.memoize_serializer_aliases()
    yield
    moto_dispatch.uninstall_moto_dispatch()


def test_kept_names_are_per_class_shape_and_parent(kept_names: None) -> None:
    from moto.core.serialize import XFormedAttributePicker

    serializer = _Serializer(XFormedAttributePicker())
    shapes = _shapes()
    member = shapes["String"]  # one shape object, its parent set as moto's serializer sets it
    cases = [
        (Cluster(name="by class prefix"), "clusterName", shapes["Other"]),
        (Service(name="not a cluster's"), "clusterName", shapes["Other"]),
        (Cluster(arn="by shape prefix"), "taskArn", shapes["Task"]),
        (Cluster(arn="not a task's"), "taskArn", shapes["Other"]),
        (Cluster(task_arn="plain"), "taskArn", shapes["Other"]),
    ]
    picked: list[Any] = []
    for _ in range(2):  # the second round from what the first kept
        picked.clear()
        for value, key, parent in cases:
            member.parent = parent
            expected = _moto_picked(serializer, value, key, member)
            picked.append(moto_dispatch.serializer_get_value(serializer, value, key, member))
            assert picked[-1] == expected
    assert picked == ["by class prefix", None, "by shape prefix", None, "plain"]


def test_an_object_own_aliases_and_transforms_are_read_live(kept_names: None) -> None:
    from moto.core.serialize import XFormedAttributePicker

    shape = _shapes()["String"]
    serializer = _Serializer(XFormedAttributePicker())
    pick = moto_dispatch.serializer_get_value
    assert pick(serializer, Cluster(status="ACTIVE"), "status", shape) == "ACTIVE"
    aliased = Cluster(status="ACTIVE", state="INACTIVE")
    aliased.Meta = type("Meta", (), {"serialization_aliases": {"status": "state"}})  # type: ignore[attr-defined]
    assert pick(serializer, aliased, "status", shape) == "INACTIVE"
    shouting = _Serializer(XFormedAttributePicker(
        response_transformers={"clusters.status": lambda value: value.upper() + "!"}))
    assert pick(shouting, Cluster(status="active"), "status", shape) == "ACTIVE!"
    for serializer_, value in ((serializer, aliased), (shouting, Cluster(status="active"))):
        assert pick(serializer_, value, "status", shape) == _moto_picked(serializer_, value, "status", shape)


# --- the kept routes: resolved once, keyed by moto's settings ---------------------------------

def _list_topics() -> Any:
    from botocore.awsrequest import AWSPreparedRequest
    from botocore.compat import HTTPHeaders

    headers = HTTPHeaders()
    headers["Content-Type"] = "application/x-www-form-urlencoded; charset=utf-8"
    return AWSPreparedRequest("POST", "https://sns.us-east-1.amazonaws.com/", headers,
                              b"Action=ListTopics&Version=2010-03-31", False)


@pytest.fixture
def kept_routes() -> Iterator[None]:
    from moto import mock_aws

    moto_dispatch.uninstall_moto_dispatch()
    assert moto_dispatch.memoize_stubber_routes()
    with mock_aws():
        yield
    moto_dispatch.uninstall_moto_dispatch()


def test_a_url_is_resolved_once(kept_routes: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """moto rebuilds the matched backend's URL table on every request; kept, it is read once."""
    import boto3
    from moto.core.base_backend import BaseBackend

    tables = []
    urls = BaseBackend.urls

    def counted(backend: Any) -> Any:
        tables.append(type(backend).__name__)
        return urls.fget(backend)  # type: ignore[attr-defined]

    monkeypatch.setattr(BaseBackend, "urls", property(counted))
    ecs = boto3.client("ecs", region_name="us-east-1")
    for name in ("a", "b", "c"):
        ecs.create_cluster(clusterName=name)
    assert sorted(c["clusterName"] for c in ecs.describe_clusters(clusters=["a", "b", "c"])["clusters"]) == [
        "a", "b", "c"]
    assert tables.count("EC2ContainerServiceBackend") <= 1


def test_a_kept_route_follows_moto_settings(kept_routes: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from moto.core.botocore_stubber import BotocoreStubber
    from moto.core.config import default_user_config
    from moto.core.exceptions import ServiceNotWhitelisted

    stubber = BotocoreStubber()
    status, _, body = stubber.process_request(_list_topics())  # type: ignore[misc]
    assert status == 200 and "ListTopicsResponse" in body
    core = default_user_config["core"]
    monkeypatch.setitem(core, "passthrough", {"urls": [], "services": ["sns"]})
    assert stubber.process_request(_list_topics()) is None  # to the real endpoint, as moto sends it
    monkeypatch.setitem(core, "passthrough", {"urls": [], "services": []})
    monkeypatch.setitem(core, "service_whitelist", ["ecs"])
    with pytest.raises(ServiceNotWhitelisted):
        stubber.process_request(_list_topics())
    monkeypatch.setitem(core, "service_whitelist", None)
    assert stubber.process_request(_list_topics())[0] == 200  # type: ignore[index]


def test_unserved_urls_answer_as_moto(kept_routes: None) -> None:
    from botocore.awsrequest import AWSPreparedRequest
    from botocore.compat import HTTPHeaders
    from moto.core.botocore_stubber import BotocoreStubber

    own = moto_dispatch._originals["BotocoreStubber.process_request"]
    for url in ("https://nothing-here.us-east-1.amazonaws.com/", "https://example.com/x"):
        for _ in range(2):
            request = AWSPreparedRequest("GET", url, HTTPHeaders(), b"", False)
            assert BotocoreStubber().process_request(request) == own(BotocoreStubber(), request)


def test_another_moto_keeps_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A moto whose functions differ from the ones copied keeps them (no stale copy)."""
    from moto.core.botocore_stubber import BotocoreStubber
    from moto.core.serialize import ResponseSerializer

    moto_dispatch.uninstall_moto_dispatch()
    own_route, own_value = BotocoreStubber.process_request, ResponseSerializer.get_value
    monkeypatch.setitem(moto_dispatch._EXPECTED_SOURCES, "BotocoreStubber.process_request", "another")
    monkeypatch.setitem(moto_dispatch._EXPECTED_SOURCES, "DEFAULT_ALIAS_PROVIDERS", "another")
    assert not moto_dispatch.memoize_stubber_routes()
    assert not moto_dispatch.memoize_serializer_aliases()
    assert BotocoreStubber.process_request is own_route and ResponseSerializer.get_value is own_value
    monkeypatch.undo()
    moto_dispatch.install_moto_dispatch()
    assert BotocoreStubber.process_request is moto_dispatch.process_request
    assert ResponseSerializer.get_value is moto_dispatch.serializer_get_value
    moto_dispatch.uninstall_moto_dispatch()


def test_local_aws_serves_through_the_kept_dispatch() -> None:
    from moto.core.botocore_stubber import BotocoreStubber
    from moto.core.serialize import ResponseSerializer

    from local_mode.emulator import LocalAws

    moto_dispatch.uninstall_moto_dispatch()
    with LocalAws(dynamodb="memory") as local:
        assert BotocoreStubber.process_request is moto_dispatch.process_request
        assert ResponseSerializer.get_value is moto_dispatch.serializer_get_value
        assert ResponseSerializer._serialize_type_structure is moto_serializer.serialize_structure
        assert local.client("ecs").list_clusters()["clusterArns"] == [local.cluster_arn]


def test_a_backend_reading_its_urls_from_the_environment_is_resolved_each_time(kept_routes: None) -> None:
    """S3 reloads its URL module on every request (MOTO_S3_CUSTOM_ENDPOINTS): not kept."""
    assert not moto_dispatch._resolve("https://s3.amazonaws.com/bucket").keep
    assert moto_dispatch._resolve("https://ecs.us-east-1.amazonaws.com/").keep
