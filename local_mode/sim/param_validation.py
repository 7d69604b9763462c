"""botocore's client-side parameter validation (``ParamValidator.validate``) with its per-shape
work done once, for the requests it has nothing to say about (nearly all of them).

botocore walks a request's parameters along the operation's input shape and, at every value,
asks which validator applies (the json-value header and document cases, then
``getattr(self, f"_validate_{type_name}")``), goes through the type-check decorator and
``range_check``, which reads the shape's metadata and serialization again. All of that depends
on the shape only, so each input shape is compiled once into a predicate ``ok(params)``
(closures): its accepted types, its minimum (``min``, or 1 for a host label, as
``range_check`` has it), a structure's required members, union flag and members, a list's
fast scalar case (``_shape_has_constraints``), documents, json-value headers... Each branch
below is one of botocore/validate.py's, and is true exactly when botocore's reports nothing
there (the same values compared in the same order, so what raises raises alike, but for
Python's recursion limit: the walk takes fewer frames a level than botocore's, which raises
RecursionError from ~200 nested levels; DynamoDB itself refuses more than 32). When ``ok``
holds, the answer is an empty ``ValidationErrors``; when it does not, botocore's own walk
makes the report (so its errors, their order, the shape objects they name and the report
text are botocore's, for this model's objects). Child shapes are compiled on first use
(recursive shapes such as DynamoDB's ``AttributeValue`` resolve to a new shape object at
every level); a shape type botocore has no validator for is never ok (botocore's walk raises).

Installed over ``ParamValidator.validate`` (:func:`compile_param_validation`) only when the
botocore code it mirrors has the source pinned here (:data:`_EXPECTED_SOURCE`); used only
for ``ParamValidator`` itself (not a subclass) while its methods and the module's helpers are
still those installed over: anything else runs botocore's own.
tests/local_mode/test_param_validation.py validates generated parameters, valid and invalid,
for every operation of the services the project calls, and every request of whole flows,
both ways and compares the errors. ~69 -> ~23 µs a validation in the crash campaigns' flows.
"""

from __future__ import annotations

import hashlib
import inspect
import operator
import threading
from collections.abc import Callable
from typing import Any

from botocore import validate as botocore_validate
from botocore.validate import ParamValidator

#: sha256 of the botocore code the checkers mirror (botocore 1.44.8, :func:`_mirrored_code`);
#: another source: not installed
_EXPECTED_SOURCE = "83d72703805cc39b290fd36c31c0e886795dee5c9fef24f11ecf5619806860f5"
_CACHE_LIMIT = 4096  # compiled input shapes kept; past it, botocore's own walk validates
_lock = threading.Lock()
_originals: dict[str, Any] = {}

#: ``ok(value)``: whether botocore's validator reports nothing for ``value``
Ok = Callable[[Any], bool]

#: what the checkers stand in for, read on every call: a change to any of them (a test's
#: monkeypatch, another library's) runs botocore's own validation
_VALIDATOR_PARTS = ("_validate", "_check_special_validation_cases", "_validate_jsonvalue_string",
                    "_validate_document", "_validate_structure", "_validate_string", "_validate_list",
                    "_validate_map", "_validate_integer", "_validate_blob", "_validate_boolean",
                    "_validate_double", "_validate_float", "_validate_long", "_validate_timestamp",
                    "_type_check_datetime", "_shape_has_constraints", "SCALAR_TYPES",
                    "CONTAINER_TYPES", "VALIDATED_METADATA_ATTRS")
_MODULE_PARTS = ("range_check", "is_json_value_header", "type_check", "ValidationErrors")
_read_validator = operator.attrgetter(*_VALIDATOR_PARTS)
_read_module = operator.attrgetter(*_MODULE_PARTS)
_installed_parts: list[tuple[Any, Any]] = []

_BLOB_TYPES = (bytes, bytearray, str)


def _minimum(shape: Any) -> tuple[bool, Any]:
    """``range_check``'s minimum for ``shape``: (whether it checks one, the minimum)."""
    if "min" in shape.metadata:
        return True, shape.metadata["min"]
    if shape.serialization.get("hostLabel"):  # members bound to the host: an implicit min of 1
        return True, 1
    return False, None


def _lazy(shape: Any) -> list[Any]:
    """A cell for ``shape``'s check, compiled on first use (recursive shapes stay finite):
    ``cell[0] or _fill(cell)``."""
    return [None, shape]


def _fill(cell: list[Any]) -> Ok:
    ok = cell[0] = compile_shape(cell[1])
    return ok


def _plain_types(shape: Any) -> tuple[type, ...] | None:
    """The types a value of ``shape`` must have when that is its whole check (a scalar without a
    minimum, not a json-value header), else None."""
    types = ParamValidator.SCALAR_TYPES.get(shape.type_name)
    if types is None or botocore_validate.is_json_value_header(shape) or _minimum(shape)[0]:
        return None
    return types


def _json_value_ok(value: Any) -> bool:  # _validate_jsonvalue_string
    try:
        botocore_validate.json.dumps(value)
    except (ValueError, TypeError):
        return False
    return True


def _document_ok(value: Any) -> bool:  # _validate_document
    if value is None:
        return True
    if isinstance(value, dict):
        for key in value:  # noqa: SIM110 (a loop: no generator per call)
            if not _document_ok(value[key]):
                return False
        return True
    if isinstance(value, list):
        for entity in value:  # noqa: SIM110 (a loop: no generator per call)
            if not _document_ok(entity):
                return False
        return True
    return isinstance(value, ((str,), int, bool, float))


def _structure(shape: Any) -> Ok:  # _validate_structure
    valid_types = ParamValidator.CONTAINER_TYPES["structure"]
    union = shape.is_tagged_union
    required = tuple(shape.metadata.get("required", []))
    members = shape.members
    # per member: its plain types, or None and its cell; on first use
    entries: dict[Any, tuple[Any, Any]] = {}

    def entry(key: Any) -> tuple[Any, Any]:
        member = members[key]
        plain = _plain_types(member)
        found = entries[key] = (plain, None if plain else _lazy(member))
        return found

    def ok(params: Any) -> bool:
        if not isinstance(params, valid_types) or (union and len(params) != 1):
            return False
        for required_member in required:
            if required_member not in params:
                return False
        for param in params:
            found = entries.get(param)
            if found is None:
                if param not in members:  # an unknown field
                    return False
                found = entry(param)
            plain, cell = found
            if plain is not None:
                if not isinstance(params[param], plain):
                    return False
            elif not (cell[0] or _fill(cell))(params[param]):
                return False
        return True

    return ok


def _list(shape: Any) -> Ok:  # _validate_list
    valid_types = ParamValidator.CONTAINER_TYPES["list"]
    has_min, minimum = _minimum(shape)
    member_shape = shape.member
    member_type = member_shape.type_name
    # botocore type-checks the items alone when the member has no validated constraint
    scalar = (member_type in ParamValidator.SCALAR_TYPES
              and not ParamValidator()._shape_has_constraints(member_shape))
    item_types = ParamValidator.SCALAR_TYPES[member_type] if scalar else ()
    cell = _lazy(member_shape)

    def ok(param: Any) -> bool:
        if not isinstance(param, valid_types) or (has_min and len(param) < minimum):
            return False
        if scalar:
            for item in param:  # noqa: SIM110 (a loop: no generator per call)
                if not isinstance(item, item_types):
                    return False
            return True
        item_ok = cell[0] or _fill(cell)
        for item in param:  # noqa: SIM110 (a loop: no generator per call)
            if not item_ok(item):
                return False
        return True

    return ok


def _map(shape: Any) -> Ok:  # _validate_map (no length check: botocore makes none)
    valid_types = ParamValidator.CONTAINER_TYPES["map"]
    key_cell, value_cell = _lazy(shape.key), _lazy(shape.value)
    plain_keys = _plain_types(shape.key)  # keys that are plain strings: no call per key

    def ok(param: Any) -> bool:
        if not isinstance(param, valid_types):
            return False
        value_ok = value_cell[0] or _fill(value_cell)
        if plain_keys is not None:
            for key, value in param.items():  # noqa: SIM110 (a loop: no generator per call)
                if not (isinstance(key, plain_keys) and value_ok(value)):
                    return False
            return True
        key_ok = key_cell[0] or _fill(key_cell)
        for key, value in param.items():  # noqa: SIM110 (a loop: no generator per call)
            if not (key_ok(key) and value_ok(value)):
                return False
        return True

    return ok


def _scalar(shape: Any) -> Ok:
    """Strings (their length against the minimum), integers, longs, doubles, floats and booleans:
    the type check, then ``range_check``'s comparison where there is a minimum."""
    type_name = shape.type_name
    # _validate_float is _validate_double, which checks the double's types
    valid_types = ParamValidator.SCALAR_TYPES["double" if type_name == "float" else type_name]
    minimum: Any
    has_min, minimum = _minimum(shape) if type_name != "boolean" else (False, None)
    measure: Any = len if type_name == "string" else None

    def ok(param: Any) -> bool:
        if not isinstance(param, valid_types):
            return False
        return not (has_min and (measure(param) if measure else param) < minimum)

    return ok


def _blob_ok(value: Any) -> bool:  # _validate_blob (no length check: botocore makes none)
    return isinstance(value, _BLOB_TYPES) or hasattr(value, "read")  # file-like objects too


def _timestamp_ok(value: Any) -> bool:
    try:  # _type_check_datetime: a datetime, or what parses to one
        botocore_validate.parse_to_aware_datetime(value)
    except (TypeError, ValueError, AttributeError):
        return False
    return True


def _never_ok(value: Any) -> bool:
    return False  # no validator of botocore's for the type: its own walk raises as it does


def compile_shape(shape: Any) -> Ok:
    """The check of ``shape``: ``ParamValidator._validate``'s dispatch, done once."""
    if botocore_validate.is_json_value_header(shape):
        return _json_value_ok
    type_name = shape.type_name
    if type_name == "structure" and shape.is_document_type:
        return _document_ok
    if type_name == "structure":
        return _structure(shape)
    if type_name == "list":
        return _list(shape)
    if type_name == "map":
        return _map(shape)
    if type_name in ("string", "integer", "long", "double", "float", "boolean"):
        return _scalar(shape)
    if type_name == "blob":
        return _blob_ok
    if type_name == "timestamp":
        return _timestamp_ok
    return _never_ok


_compiled: dict[tuple[int, int, str, type], tuple[Any, Any, Ok]] = {}


def _root_check(shape: Any) -> Ok:
    """The checks of an input shape. A client made later has its own model objects, built from
    the same shape definitions (one data loader: moto_patches), so the checks are kept per
    definition (the shape's model dict and its service's shape map, held here), not per object."""
    definition = getattr(shape, "_shape_model", None)
    shape_map = getattr(getattr(shape, "_shape_resolver", None), "_shape_map", None)
    if definition is None or shape_map is None:
        return compile_shape(shape)
    key = (id(definition), id(shape_map), shape.name, type(shape))
    kept = _compiled.get(key)
    if kept is not None and kept[0] is definition and kept[1] is shape_map:
        return kept[2]
    if len(_compiled) >= _CACHE_LIMIT:  # compiling per call would cost more than botocore's walk
        return _never_ok
    compiled = compile_shape(shape)
    with _lock:
        _compiled[key] = (definition, shape_map, compiled)
    return compiled


def validate(self: Any, params: Any, shape: Any) -> Any:
    """``ParamValidator.validate``: compiled checkers for botocore's ``ParamValidator`` as
    installed over (module docstring), botocore's own otherwise."""
    if (type(self) is not ParamValidator or not _installed_parts
            or (_read_validator(ParamValidator), _read_module(botocore_validate)) != _installed_parts[0]):
        return _originals["ParamValidator.validate"](self, params, shape)
    if _root_check(shape)(params):
        return botocore_validate.ValidationErrors()  # nothing to report
    # something to report: botocore's own walk reports it (with this model's shape objects)
    return _originals["ParamValidator.validate"](self, params, shape)


def _mirrored_code() -> tuple[Any, ...]:
    """The botocore code the checkers mirror (its source pinned)."""
    return (ParamValidator, botocore_validate.range_check, botocore_validate.type_check,
            botocore_validate.is_json_value_header, botocore_validate.ValidationErrors.__init__,
            botocore_validate.ValidationErrors.report)


_digests: list[str] = []  # the mirrored code's, read once a process (reading source is slow)


def _source_digest() -> str:
    if not _digests:
        source = "".join(inspect.getsource(code) for code in _mirrored_code())
        _digests.append(hashlib.sha256(source.encode()).hexdigest())
    return _digests[0]


def compile_param_validation() -> bool:
    """Validate with compiled checkers (module docstring); False when botocore's validator is
    not the one this module mirrors. Idempotent."""
    with _lock:
        if _installed_parts:  # once: a wrapper put over it since (a test's spy) stays
            return True
        current = ParamValidator.__dict__["validate"]
        if _source_digest() != _EXPECTED_SOURCE:
            return False
        _originals["ParamValidator.validate"] = current
        _installed_parts[:] = [(_read_validator(ParamValidator), _read_module(botocore_validate))]
        validate.__wrapped__ = current  # type: ignore[attr-defined]
        ParamValidator.validate = validate  # type: ignore[method-assign]
        return True


def uncompile_param_validation() -> None:
    """botocore's own validation back, the checkers dropped."""
    with _lock:
        original = _originals.pop("ParamValidator.validate", None)
        if original is not None:
            ParamValidator.validate = original  # type: ignore[method-assign]
        _installed_parts.clear()
        _compiled.clear()
