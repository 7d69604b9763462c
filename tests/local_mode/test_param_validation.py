"""botocore's parameter validation compiled per shape (local_mode/sim/param_validation.py)
reports exactly what botocore's own ``ParamValidator`` reports: the same errors in the same
order, so the same report text. Generated parameters (tests/local_mode/_param_shapes.py) for
every operation of the services the project calls, and of services whose models have what
those lack (tagged unions, documents, json-value headers, host labels, streaming blobs), then
every request of whole flows, are validated both ways."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import boto3
import botocore.session
import pytest
from botocore.model import ShapeResolver
from botocore.validate import ParamValidator

from local_mode.campaigns.catalog import RUNS
from local_mode.sim import param_validation
from tests.local_mode._param_shapes import valid, variants

#: the services the project calls, then small ones with a tagged union, a document, a
#: json-value header, a host label, a streaming blob in their requests
QUICK_SERVICES = ("dynamodb", "ecs", "sqs", "sns", "logs", "events", "lambda", "sts",
                  "agent-discovery", "account-access-runtime", "inspector-scan", "lex-runtime",
                  "neptune-graph", "workmailmessageflow")
#: the project's other services, whose models are big (EC2's 48,000 variants: ~15 s)
SLOW_SERVICES = ("ec2", "ssm", "iam", "autoscaling", "cloudwatch")


@pytest.fixture
def compiled() -> Iterator[Any]:
    """botocore's own validate (the compiled one installed over it, as the emulator has it)."""
    assert param_validation.compile_param_validation(), "botocore's validate.py is not the one mirrored"
    assert ParamValidator.validate is param_validation.validate
    yield param_validation._originals["ParamValidator.validate"]


def _errors(report: Any) -> list[tuple[Any, ...]]:
    """The error tuples, an exception (a json-value header's) by its type and text."""
    return [(reason, name, {key: (type(v), str(v)) if isinstance(v, Exception) else v
                            for key, v in details.items()})
            for reason, name, details in report._errors]


def _assert_same(own: Any, params: Any, shape: Any) -> Any:
    expected = own(ParamValidator(), params, shape)
    report = ParamValidator().validate(params, shape)
    assert type(report) is type(expected)
    assert _errors(report) == _errors(expected), params
    assert report.generate_report() == expected.generate_report()
    assert report.has_errors() == expected.has_errors()
    return expected


def _compare_service(own: Any, service: str) -> dict[str, int]:
    model = botocore.session.get_session().get_service_model(service)
    seen = {"requests": 0, "refused": 0}
    for operation in model.operation_names:
        shape = model.operation_model(operation).input_shape
        if shape is None:
            continue
        accepted = valid(shape)
        assert not _assert_same(own, accepted, shape).has_errors(), (operation, accepted)
        for params in variants(shape, accepted):
            seen["refused"] += _assert_same(own, params, shape).has_errors()
            seen["requests"] += 1
    return seen


@pytest.mark.parametrize("service", QUICK_SERVICES)
def test_every_operation_validates_as_botocore(compiled: Any, service: str) -> None:
    seen = _compare_service(compiled, service)
    assert seen["refused"] > seen["requests"] // 2  # most variants are refused: errors were compared


@pytest.mark.slow
@pytest.mark.parametrize("service", SLOW_SERVICES)
def test_every_operation_of_the_big_models_validates_as_botocore(compiled: Any, service: str) -> None:
    seen = _compare_service(compiled, service)
    assert seen["refused"] > seen["requests"] // 2


def test_whole_flows_validate_as_botocore(compiled: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request the clients and the in-memory DynamoDB store validate in two flows: the same
    report, and each valid one answered by the compiled check alone."""
    checked: list[str] = []
    compared: list[str] = []
    root_check = param_validation._root_check

    def counted(shape: Any) -> Any:
        checked.append(shape.name)
        return root_check(shape)

    def both(self: Any, params: Any, shape: Any) -> Any:
        expected = compiled(self, params, shape)
        report = param_validation.validate(self, params, shape)
        assert _errors(report) == _errors(expected) and report.generate_report() == expected.generate_report()
        assert root_check(shape)(params) is not expected.has_errors()  # valid: never botocore's walk
        compared.append(shape.name)
        return expected

    monkeypatch.setattr(param_validation, "_root_check", counted)
    monkeypatch.setattr(ParamValidator, "validate", both)
    for flow in ("gpu_fault", "large"):
        RUNS[flow](None)
    assert len(compared) > 500 and len(set(compared)) > 20
    assert checked == compared  # each through the compiled checks, not botocore's fallback


def _shapes(shape_map: dict[str, Any]) -> ShapeResolver:
    return ShapeResolver(shape_map)


def test_what_botocore_raises_is_raised() -> None:
    """A shape type botocore has no validator for, a NaN against a minimum: the same exception."""
    resolver = _shapes({
        "Input": {"type": "structure", "members": {"Odd": {"shape": "Odd"}, "Ratio": {"shape": "Ratio"}}},
        "Odd": {"type": "bigInteger"}, "Ratio": {"type": "double", "min": 0}})
    shape = resolver.get_shape_by_name("Input")
    own = ParamValidator.validate.__wrapped__ if hasattr(ParamValidator.validate, "__wrapped__") \
        else ParamValidator.validate
    assert param_validation.compile_param_validation()
    for params in ({"Odd": 1}, {"Ratio": Decimal("NaN")}):
        with pytest.raises(Exception) as botocores:
            own(ParamValidator(), params, shape)
        with pytest.raises(type(botocores.value)) as compiled:
            ParamValidator().validate(params, shape)
        assert str(compiled.value) == str(botocores.value)
    assert not ParamValidator().validate({"Ratio": Decimal("0")}, shape).has_errors()


def test_installed_once_over_botocore_s_own() -> None:
    from local_mode.moto_patches import install_emulator_speedups

    install_emulator_speedups()
    installed = ParamValidator.validate
    assert installed is param_validation.validate  # botocore's validate.py is still the one mirrored
    install_emulator_speedups()
    assert ParamValidator.validate is installed
    assert installed.__wrapped__ is param_validation._originals["ParamValidator.validate"]
    assert installed.__wrapped__.__module__ == "botocore.validate"


def test_another_botocore_keeps_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    assert param_validation.compile_param_validation()
    param_validation.uncompile_param_validation()
    own = ParamValidator.validate
    monkeypatch.setattr(param_validation, "_EXPECTED_SOURCE", "another")
    try:
        assert not param_validation.compile_param_validation()
        assert ParamValidator.validate is own
    finally:
        monkeypatch.undo()
        assert param_validation.compile_param_validation()
    assert ParamValidator.validate is param_validation.validate


def test_a_changed_or_derived_validator_runs_botocore_s_own(compiled: Any,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    shape = _shapes({"Input": {"type": "structure", "members": {"Name": {"shape": "Name"}}},
                     "Name": {"type": "string"}}).get_shape_by_name("Input")

    def refuse(self: Any, param: Any, shape: Any, errors: Any, name: str) -> None:
        errors.report(name, "invalid length", param=0, min_allowed=99)

    class Derived(ParamValidator):
        _validate_string = refuse

    assert Derived().validate({"Name": "n"}, shape).has_errors()
    assert not ParamValidator().validate({"Name": "n"}, shape).has_errors()
    monkeypatch.setattr(ParamValidator, "_validate_string", refuse)
    assert ParamValidator().validate({"Name": "n"}, shape).generate_report() == \
        "Invalid length for parameter Name, value: 0, valid min length: 99"


def test_checks_are_kept_per_shape_definition(compiled: Any) -> None:
    """Two clients' models (two sessions, one data loader) share the check of an operation;
    another definition of the same name does not. A report names the shape objects of the model
    validated against, not those of the model compiled from."""
    first, second = (boto3.session.Session(region_name="us-east-1").client("sqs") for _ in range(2))
    shapes = [client.meta.service_model.operation_model("SendMessage").input_shape
              for client in (first, second)]
    assert shapes[0] is not shapes[1]
    assert param_validation._root_check(shapes[0]) is param_validation._root_check(shapes[1])
    other = _shapes({"SendMessageRequest": {"type": "structure", "required": ["Body"],
                                            "members": {"Body": {"shape": "S"}}},
                     "S": {"type": "string"}}).get_shape_by_name("SendMessageRequest")
    assert param_validation._root_check(other) is not param_validation._root_check(shapes[0])
    missing = 'Missing required parameter in input: "Body"'
    assert ParamValidator().validate({}, other).generate_report() == missing


def test_a_report_names_the_shapes_of_the_model_validated_against(compiled: Any) -> None:
    """The check is compiled from one client's model and shared: a report (a tagged union's
    names its member shapes) is still made with the objects of the model given."""
    registers = [boto3.session.Session(region_name="us-east-1").client("ecs").meta.service_model
                 .operation_model("RegisterTaskDefinition").input_shape for _ in range(2)]
    assert param_validation._root_check(registers[0]) is param_validation._root_check(registers[1])
    accepted = valid(registers[1])
    refused = 0
    for params in variants(registers[1], accepted):
        refused += _assert_same(compiled, params, registers[1]).has_errors()
    assert refused > 500


def test_a_kept_check_of_a_freed_definition_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks are kept by the definition's id, which Python reuses once it is freed: an entry
    whose definition is another object (at the same id) is compiled again."""
    shape = _shapes({"Input": {"type": "structure", "members": {"Name": {"shape": "Name"}}},
                     "Name": {"type": "string", "min": 2}}).get_shape_by_name("Input")
    key = (id(shape._shape_model), id(shape._shape_resolver._shape_map), shape.name, type(shape))

    def stale(value: Any, errors: Any, name: str) -> None:
        pass

    monkeypatch.setitem(param_validation._compiled, key, ({}, shape._shape_resolver._shape_map, stale))
    assert param_validation._root_check(shape) is not stale
    assert ParamValidator().validate({"Name": "n"}, shape).has_errors()
