"""moto's JSON structures walked with kept plans (local_mode/sim/moto_serializer.py) write every
response byte for byte as moto's own serializer: every response moto serializes in whole flows
is serialized again by moto's own code (its own value picker too) and compared, errors
included; then the cases the flows may not reach, on a model made for them."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Any

import pytest
from moto.core import serialize as moto_serialize
from moto.core.serialize import JSONSerializer, QuerySerializer, ResponseSerializer, XFormedAttributePicker

from local_mode.campaigns.catalog import RUNS
from local_mode.sim import moto_dispatch, moto_serializer

FLOWS = ("large", "node_wedged", "relocation_wait", "gpu_reset")
_SERIALIZE = ResponseSerializer.serialize  # moto's (the flow test wraps it)


@pytest.fixture
def kept_walk() -> Iterator[None]:
    from local_mode.moto_patches import install_emulator_speedups

    install_emulator_speedups()  # moto_patches' AttributeValue writer, as LocalAws installs it
    moto_dispatch.uninstall_moto_dispatch()
    moto_dispatch.install_moto_dispatch()
    assert ResponseSerializer._serialize_type_structure is moto_serializer.serialize_structure
    yield
    moto_dispatch.uninstall_moto_dispatch()


def _moto_own(serializer: Any, result: Any) -> Any:
    """``result`` serialized by a serializer like ``serializer`` with moto's own walk and picker."""
    twin = type(serializer)(operation_model=serializer.operation_model, context=serializer.context,
                            pretty_print=serializer.pretty_print, value_picker=serializer._value_picker)
    own = ResponseSerializer.__dict__
    kept = (own["_serialize_type_structure"], own["get_value"])
    ResponseSerializer._serialize_type_structure = moto_serializer._originals[  # type: ignore[method-assign]
        "ResponseSerializer._serialize_type_structure"]
    ResponseSerializer.get_value = moto_dispatch._originals["ResponseSerializer.get_value"]  # type: ignore[method-assign]
    try:
        return _SERIALIZE(twin, result)
    finally:
        ResponseSerializer._serialize_type_structure, ResponseSerializer.get_value = kept  # type: ignore[method-assign]


def _as_bytes(response: Any) -> tuple[Any, ...]:
    return response["status_code"], list(response["headers"].items()), response["body"]


def _outcome(serialize: Any) -> tuple[Any, ...]:
    try:
        return _as_bytes(serialize())
    except Exception as error:  # moto's own failing: the same failure
        return "raised", type(error), str(error)


@pytest.fixture
def compared(kept_walk: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str, int]]]:
    """Every response serialized both ways and compared; yields (service, operation, status)
    of each and (as "walked", operation, 0) each structure the kept walk wrote."""
    seen: list[tuple[str, str, int]] = []

    def serialize(self: Any, result: Any) -> Any:
        own = _moto_own(self, result)  # first: the walk must not depend on moto's having run
        kept = _SERIALIZE(self, result)
        assert _as_bytes(kept) == _as_bytes(own), (self.service_model.service_name, self.operation_name)
        seen.append((self.service_model.service_name, self.operation_name, kept["status_code"]))
        return kept

    fill = moto_serializer._fill

    def counted(self: Any, *args: Any) -> None:
        seen.append(("walked", self.operation_name, 0))
        fill(self, *args)

    monkeypatch.setattr(ResponseSerializer, "serialize", serialize)
    monkeypatch.setattr(moto_serializer, "_fill", counted)
    yield seen


@pytest.mark.parametrize("flow", FLOWS)
def test_every_response_of_a_flow_is_moto_own(flow: str, compared: list[tuple[str, str, int]]) -> None:
    RUNS[flow](None)
    assert {"ecs", "ec2", "sns", "sqs"} <= {service for service, _, _ in compared}
    walked = {operation for service, operation, _ in compared if service == "walked"}
    assert {"DescribeContainerInstances", "StartTask", "PutAttributes", "DescribeTasks"} <= walked, walked


def test_errors_are_moto_own(compared: list[tuple[str, str, int]]) -> None:
    from botocore.exceptions import ClientError

    from local_mode.emulator import LocalAws

    with LocalAws(dynamodb="memory") as local:
        ecs, sqs = local.client("ecs"), local.client("sqs")
        unknown = "arn:aws:ecs:us-east-1:123456789012:container-instance/x/y"
        for call in (lambda: ecs.put_attributes(cluster=local.cluster_name, attributes=[
                         {"name": "a", "targetId": unknown}]),
                     lambda: ecs.describe_services(cluster="nowhere", services=["s"]),
                     lambda: ecs.start_task(cluster=local.cluster_name, taskDefinition="nothing:1",
                                            containerInstances=["x"]),
                     lambda: sqs.get_queue_url(QueueName="nowhere")):
            with pytest.raises(ClientError):
                call()
    statuses = {(service, status) for service, _, status in compared if service != "walked"}
    assert {("ecs", 400), ("sqs", 400)} <= statuses, statuses


# --- the cases flows may not reach -------------------------------------------------------------

_MODEL = {
    "Output": {"type": "structure", "members": {
        "items": {"shape": "ItemList"}, "item": {"shape": "Item"}, "names": {"shape": "Names"},
        "tags": {"shape": "Tags"}, "count": {"shape": "Long"}, "ratio": {"shape": "Double"},
        "flag": {"shape": "Boolean"}, "when": {"shape": "Timestamp"}, "data": {"shape": "Blob"},
        "doc": {"shape": "Document"}, "renamed": {"shape": "String", "locationName": "Renamed"},
        "nested": {"shape": "Nested"}, "counts": {"shape": "Counts"}}},
    "Item": {"type": "structure", "members": {
        "itemName": {"shape": "String"}, "itemArn": {"shape": "String"}, "size": {"shape": "Integer"},
        "attributes": {"shape": "Tags"}}},
    "ItemList": {"type": "list", "member": {"shape": "Item"}},
    "Names": {"type": "list", "member": {"shape": "String"}},
    "Nested": {"type": "list", "member": {"shape": "Names"}},
    "Counts": {"type": "map", "key": {"shape": "String"}, "value": {"shape": "Integer"}},
    "Tags": {"type": "map", "key": {"shape": "String"}, "value": {"shape": "String"}},
    "Document": {"type": "structure", "members": {}, "document": True},
    "String": {"type": "string"}, "Integer": {"type": "integer"}, "Long": {"type": "long"},
    "Double": {"type": "double"}, "Boolean": {"type": "boolean"}, "Timestamp": {"type": "timestamp"},
    "Blob": {"type": "blob"},
}


def _serializer(transformers: dict[str, Any] | None = None, kind: type = JSONSerializer) -> Any:
    from moto.core.model import OperationModel, ServiceModel

    service = ServiceModel({
        "metadata": {"protocol": "json", "jsonVersion": "1.1", "serviceId": "Test", "targetPrefix": "Test"},
        "operations": {"Get": {"name": "Get", "http": {"method": "POST", "requestUri": "/"},
                               "output": {"shape": "Output"}}},
        "shapes": _MODEL}, "test")
    operation: OperationModel = service.operation_model("Get")
    picker = XFormedAttributePicker(response_transformers=transformers)
    return kind(operation_model=operation, value_picker=picker)


class Color(enum.Enum):
    RED = "red"


class Item:
    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)


class ItemN:
    """Its ``itemName`` read only by its class name's alias (``ame``: not the shape ``Item``'s)."""

    def __init__(self, ame: str) -> None:
        self.ame = ame


class Aliased(Item):
    class Meta:
        serialization_aliases = {"itemName": "label"}


class ByItem(dict):  # type: ignore[type-arg]
    """A mapping read by item (not a dict exactly)."""


def _results() -> list[Any]:
    import datetime

    when = datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC)
    return [
        {"items": [Item(name="by class prefix", arn="a", size=True, attributes={"a": "b", "k": "v"}), None,
                   {"itemName": Color.RED, "size": "7"}, ItemN("by class name"),
                   Aliased(label="aliased", itemName="not this"), ByItem(itemName="by item", size=3)],
         "names": ["a", None, 3, Color.RED], "tags": {"a": "b", "c": None, "": "empty", "d": 4},
         "count": 2**40, "ratio": 1, "flag": "yes", "when": when, "data": b"\x00\xff", "doc": {"x": [1, {}]},
         "renamed": "r", "nested": [["a"], []], "counts": {"a": 1, "b": "2"}},
        Item(items=[], names=[], tags={}, item=Item(item_name="snake", size=1.5), count=True, ratio="2.5",
             flag=False, renamed=Color.RED),
        {"item": {}, "names": None, "tags": None, "ratio": 0.25},
        {},
    ]


@pytest.mark.parametrize("transformers", [None, {
    "Output.items.Item.attributes": lambda v: v and dict(sorted(v.items(), reverse=True)),
    "item.size": lambda v: 99, "Output.count": lambda v: None},
    # a list item's member never returned, as DescribeTasks without include=TAGS
    {"Output.items.Item.size": moto_serialize.never_return}])
def test_a_model_of_every_kind_is_written_as_moto_writes_it(kept_walk: None, transformers: Any) -> None:
    for result in _results():
        kept = _outcome(lambda: _serializer(transformers).serialize(result))  # noqa: B023
        assert kept[0] == 200 and kept == _outcome(lambda: _moto_own(_serializer(transformers), result))  # noqa: B023


def test_what_moto_cannot_write_fails_as_moto_fails(kept_walk: None) -> None:
    unwritable = ({"nested": [None]}, {"counts": {"b": None}}, {"names": 3}, {"count": "three"},
                  {"tags": ["a"]})
    for result in unwritable:
        kept = _outcome(lambda: _serializer().serialize(result))  # noqa: B023
        assert kept[0] == "raised" and kept == _outcome(lambda: _moto_own(_serializer(), result))  # noqa: B023


def test_errors_and_other_protocols_are_moto_own(kept_walk: None) -> None:
    from moto.ecs.exceptions import ClusterNotFoundException

    error = ClusterNotFoundException()
    assert _as_bytes(_serializer().serialize(error)) == _as_bytes(_moto_own(_serializer(), error))
    query = _serializer(kind=QuerySerializer)
    assert _as_bytes(query.serialize(_results()[1])) == _as_bytes(_moto_own(_serializer(kind=QuerySerializer),
                                                                             _results()[1]))


def _walks_counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A "kept" per structure the kept walk writes from here on."""
    calls: list[str] = []
    fill = moto_serializer._fill

    def counted(self: Any, *args: Any) -> None:
        calls.append("kept")
        fill(self, *args)

    monkeypatch.setattr(moto_serializer, "_fill", counted)
    return calls


def test_a_changed_serializer_is_walked_by_moto(kept_walk: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer replaced after installing, another serializer or another picker: moto's walk."""
    calls = _walks_counted(monkeypatch)
    _serializer().serialize(_results()[3])
    assert calls == ["kept"]
    calls.clear()
    _serializer(kind=QuerySerializer).serialize(_results()[3])
    other_picker = _serializer()
    other_picker._value_picker = moto_serialize.DefaultAttributePicker()
    other_picker.serialize(_results()[3])
    string = JSONSerializer._serialize_type_string
    monkeypatch.setattr(JSONSerializer, "_serialize_type_string",
                        lambda self, s, value, shape, key: string(self, s, str(value).upper(), shape, key))
    assert _serializer().serialize({"renamed": "renamed"})["body"] == '{"Renamed": "RENAMED"}'
    assert calls == []


def test_another_moto_keeps_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    moto_dispatch.uninstall_moto_dispatch()
    own = ResponseSerializer._serialize_type_structure
    monkeypatch.setattr(moto_serializer, "_EXPECTED_SOURCE", "another")
    moto_dispatch.install_moto_dispatch()
    assert ResponseSerializer._serialize_type_structure is own
    moto_dispatch.uninstall_moto_dispatch()
    monkeypatch.undo()
    assert not moto_serializer.memoize_json_structures()  # moto's picker, not moto_dispatch's
    assert ResponseSerializer._serialize_type_structure is own


def test_a_transformer_replaced_for_the_same_path_is_the_one_applied(kept_walk: None) -> None:
    """moto's ``_include_in_response`` puts a new function at the same path on every call."""
    transformers: dict[str, Any] = {"Output.items.Item.itemName": lambda v: "first"}
    serializer = _serializer(transformers)
    result = {"items": [{"itemName": "x"}]}
    assert serializer.serialize(result)["body"] == '{"items": [{"itemName": "first"}]}'
    transformers["Output.items.Item.itemName"] = lambda v: "second"
    assert serializer.serialize(result)["body"] == '{"items": [{"itemName": "second"}]}'
    assert _as_bytes(serializer.serialize(result)) == _as_bytes(_moto_own(serializer, result))


def test_the_attribute_value_writer_installed_after_keeps_the_walk(
        kept_walk: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from moto.core.serialize import BaseJSONSerializer

    wrapper = BaseJSONSerializer.__dict__["_serialize_type_structure"]
    assert wrapper._attribute_values_direct
    moto_dispatch.uninstall_moto_dispatch()
    monkeypatch.setattr(BaseJSONSerializer, "_serialize_type_structure", wrapper._generic)
    moto_dispatch.install_moto_dispatch()
    monkeypatch.setattr(BaseJSONSerializer, "_serialize_type_structure", wrapper)  # after the walk
    calls = _walks_counted(monkeypatch)
    _serializer().serialize(_results()[3])
    assert calls == ["kept"]
