"""botocore's client-side parameter validation (``ParamValidator.validate``) with its per-shape
work done once: the same checks in the same order, the same ``ValidationErrors``.

botocore walks a request's parameters along the operation's input shape and, at every value,
asks which validator applies (the json-value header and document cases, then
``getattr(self, f"_validate_{type_name}")``), goes through the type-check decorator and
``range_check``, which reads the shape's metadata and serialization again. All of that depends
on the shape only, so each shape is compiled once (closures: :class:`Compiled`): its accepted
types, its minimum (``min``, or 1 for a host label, as ``range_check`` has it), a structure's
required members, union flag and members, a list's fast scalar case
(``_shape_has_constraints``)... Each branch below is one of botocore/validate.py's, and reports
what it reports, in the same order, through ``errors.report`` (so ``generate_report`` and
``has_errors`` give the same answers). Nearly every request is valid: it is walked once by
``ok``, which makes no names and no report, and by ``check``, which reports, only when ``ok``
finds something wrong. Child shapes are compiled on first use (recursive shapes such as
DynamoDB's ``AttributeValue`` resolve to a new shape object at every level); a shape type
botocore has no validator for goes through botocore's own ``_validate``.

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
from typing import Any, NamedTuple

from botocore import validate as botocore_validate
from botocore.validate import ParamValidator

#: sha256 of the botocore code the checkers mirror (botocore 1.44.8, :func:`_mirrored_code`);
#: another source: not installed
_EXPECTED_SOURCE = "83d72703805cc39b290fd36c31c0e886795dee5c9fef24f11ecf5619806860f5"
_CACHE_LIMIT = 4096  # compiled input shapes kept; past it, compiled per call
_lock = threading.Lock()
_originals: dict[str, Any] = {}

#: ``check(value, errors, name)``: validates ``value`` and reports into ``errors``
Check = Callable[[Any, Any, str], None]

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

_DOCUMENT_TYPE_NAMES = [str(t) for t in (str, int, bool, float, list, dict)]
_BLOB_TYPE_NAMES = [str(bytes), str(bytearray), "file-like object"]
_TIMESTAMP_TYPE_NAMES = [str(botocore_validate.datetime), "timestamp-string"]
_BLOB_TYPES = (bytes, bytearray, str)


def _type_names(valid_types: tuple[type, ...]) -> list[str]:
    return [str(t) for t in valid_types]  # as type_check's guard names them


def _minimum(shape: Any) -> tuple[bool, Any]:
    """``range_check``'s minimum for ``shape``: (whether it checks one, the minimum)."""
    if "min" in shape.metadata:
        return True, shape.metadata["min"]
    if shape.serialization.get("hostLabel"):  # members bound to the host: an implicit min of 1
        return True, 1
    return False, None


class Compiled(NamedTuple):
    """A shape's checks: ``ok(value)`` is True exactly when ``check`` would report nothing (the
    same values compared in the same order, so what raises raises alike); ``check(value,
    errors, name)`` reports as botocore does. A request is walked by ``ok`` (no names made, no
    report), and again by ``check`` only when something is wrong."""

    ok: Callable[[Any], bool]
    check: Check


def _lazy(shape: Any) -> list[Any]:
    """A cell for ``shape``'s checks, compiled on first use (recursive shapes stay finite):
    ``cell[0] or _fill(cell)``."""
    return [None, shape]


def _fill(cell: list[Any]) -> Compiled:
    compiled = cell[0] = compile_shape(cell[1])
    return compiled


def _plain_types(shape: Any) -> tuple[type, ...] | None:
    """The types a value of ``shape`` must have when that is its whole check (a scalar without a
    minimum, not a json-value header), else None."""
    types = ParamValidator.SCALAR_TYPES.get(shape.type_name)
    if types is None or botocore_validate.is_json_value_header(shape) or _minimum(shape)[0]:
        return None
    return types


def _json_value(shape: Any) -> Compiled:
    def ok(value: Any) -> bool:
        try:
            botocore_validate.json.dumps(value)
        except (ValueError, TypeError):
            return False
        return True

    def check(value: Any, errors: Any, name: str) -> None:  # _validate_jsonvalue_string
        try:
            botocore_validate.json.dumps(value)
        except (ValueError, TypeError) as e:
            errors.report(name, "unable to encode to json", type_error=e)

    return Compiled(ok, check)


def _document_ok(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        return all(_document_ok(value[key]) for key in value)
    if isinstance(value, list):
        return all(_document_ok(entity) for entity in value)
    return isinstance(value, ((str,), int, bool, float))


def _check_document(value: Any, errors: Any, name: str) -> None:
    """``_validate_document`` (a dict's values named by their key alone, as botocore does)."""
    if value is None:
        return
    if isinstance(value, dict):
        for key in value:
            _check_document(value[key], errors, key)
    elif isinstance(value, list):
        for index, entity in enumerate(value):
            _check_document(entity, errors, f"{name}[{index}]")
    elif not isinstance(value, ((str,), int, bool, float)):
        errors.report(name, "invalid type for document", param=value, param_type=type(value),
                      valid_types=list(_DOCUMENT_TYPE_NAMES))


_DOCUMENT = Compiled(_document_ok, _check_document)


def _structure(shape: Any) -> Compiled:
    valid_types = ParamValidator.CONTAINER_TYPES["structure"]
    type_names = _type_names(valid_types)
    union = shape.is_tagged_union
    required = tuple(shape.metadata.get("required", []))
    members = shape.members
    # per member: (its plain types, or None and its cell; the plain types' names), on first use
    entries: dict[Any, tuple[Any, Any, list[str]]] = {}

    def entry(key: Any) -> tuple[Any, Any, list[str]]:
        member = members[key]
        plain = _plain_types(member)
        found = entries[key] = (plain, None if plain else _lazy(member), _type_names(plain) if plain else [])
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
                if param not in members:
                    return False
                found = entry(param)
            plain, cell, _ = found
            if plain is not None:
                if not isinstance(params[param], plain):
                    return False
            elif not (cell[0] or _fill(cell)).ok(params[param]):
                return False
        return True

    def check(params: Any, errors: Any, name: str) -> None:
        if not isinstance(params, valid_types):
            errors.report(name, "invalid type", param=params, valid_types=list(type_names))
            return
        if union:
            if len(params) == 0:
                errors.report(name, "empty input", members=members)
            elif len(params) > 1:
                errors.report(name, "more than one input", members=members)
        for required_member in required:
            if required_member not in params:
                errors.report(name, "missing required field", required_name=required_member,
                              user_params=params)
        known = []
        for param in params:
            if param not in members:
                errors.report(name, "unknown field", unknown_param=param, valid_names=list(members))
            else:
                known.append(param)
        for param in known:
            plain, cell, names = entries.get(param) or entry(param)
            value = params[param]
            if plain is not None:
                if not isinstance(value, plain):
                    errors.report(f"{name}.{param}", "invalid type", param=value, valid_types=list(names))
            else:
                (cell[0] or _fill(cell)).check(value, errors, f"{name}.{param}")

    return Compiled(ok, check)


def _list(shape: Any) -> Compiled:
    valid_types = ParamValidator.CONTAINER_TYPES["list"]
    type_names = _type_names(valid_types)
    has_min, minimum = _minimum(shape)
    member_shape = shape.member
    member_type = member_shape.type_name
    # botocore type-checks the items alone when the member has no validated constraint
    scalar = (member_type in ParamValidator.SCALAR_TYPES
              and not ParamValidator()._shape_has_constraints(member_shape))
    item_types = ParamValidator.SCALAR_TYPES[member_type] if scalar else ()
    item_names = _type_names(item_types)
    cell = _lazy(member_shape)

    def ok(param: Any) -> bool:
        if not isinstance(param, valid_types) or (has_min and len(param) < minimum):
            return False
        if scalar:
            for item in param:  # noqa: SIM110 (a loop: no generator per call)
                if not isinstance(item, item_types):
                    return False
            return True
        item_ok = (cell[0] or _fill(cell)).ok
        for item in param:  # noqa: SIM110 (a loop: no generator per call)
            if not item_ok(item):
                return False
        return True

    def check(param: Any, errors: Any, name: str) -> None:
        if not isinstance(param, valid_types):
            errors.report(name, "invalid type", param=param, valid_types=list(type_names))
            return
        if has_min and len(param) < minimum:
            errors.report(name, "invalid length", param=len(param), min_allowed=minimum)
        if scalar:
            for i, item in enumerate(param):
                if not isinstance(item, item_types):
                    errors.report(f"{name}[{i}]", "invalid type", param=item, valid_types=list(item_names))
            return
        item_check = (cell[0] or _fill(cell)).check
        for i, item in enumerate(param):
            item_check(item, errors, f"{name}[{i}]")

    return Compiled(ok, check)


def _map(shape: Any) -> Compiled:
    valid_types = ParamValidator.CONTAINER_TYPES["map"]
    type_names = _type_names(valid_types)
    key_cell, value_cell = _lazy(shape.key), _lazy(shape.value)

    plain_keys = _plain_types(shape.key)  # keys that are plain strings: no call per key

    def ok(param: Any) -> bool:
        if not isinstance(param, valid_types):
            return False
        value_ok = (value_cell[0] or _fill(value_cell)).ok
        if plain_keys is not None:
            for key, value in param.items():  # noqa: SIM110 (a loop: no generator per call)
                if not (isinstance(key, plain_keys) and value_ok(value)):
                    return False
            return True
        key_ok = (key_cell[0] or _fill(key_cell)).ok
        for key, value in param.items():  # noqa: SIM110 (a loop: no generator per call)
            if not (key_ok(key) and value_ok(value)):
                return False
        return True

    def check(param: Any, errors: Any, name: str) -> None:
        if not isinstance(param, valid_types):
            errors.report(name, "invalid type", param=param, valid_types=list(type_names))
            return
        keys, values = (key_cell[0] or _fill(key_cell)).check, (value_cell[0] or _fill(value_cell)).check
        for key, value in param.items():
            keys(key, errors, f"{name} (key: {key})")
            values(value, errors, f"{name}.{key}")

    return Compiled(ok, check)


def _scalar(shape: Any, error_type: str = "invalid range") -> Compiled:
    """Strings (their length: ``error_type`` "invalid length"), integers, longs, doubles, floats
    and booleans: the type check, then ``range_check`` where there is a minimum."""
    type_name = shape.type_name
    # _validate_float is _validate_double, which checks the double's types
    valid_types = ParamValidator.SCALAR_TYPES["double" if type_name == "float" else type_name]
    type_names = _type_names(valid_types)
    minimum: Any
    has_min, minimum = _minimum(shape) if type_name != "boolean" else (False, None)
    measure: Any = len if type_name == "string" else None

    def ok(param: Any) -> bool:
        if not isinstance(param, valid_types):
            return False
        return not (has_min and (measure(param) if measure else param) < minimum)

    def check(param: Any, errors: Any, name: str) -> None:
        if not isinstance(param, valid_types):
            errors.report(name, "invalid type", param=param, valid_types=list(type_names))
        elif has_min:
            value = measure(param) if measure else param
            if value < minimum:
                errors.report(name, error_type, param=value, min_allowed=minimum)

    return Compiled(ok, check)


def _blob_ok(value: Any) -> bool:
    return isinstance(value, _BLOB_TYPES) or hasattr(value, "read")  # file-like objects too


def _check_blob(value: Any, errors: Any, name: str) -> None:
    if not _blob_ok(value):
        errors.report(name, "invalid type", param=value, valid_types=list(_BLOB_TYPE_NAMES))


def _timestamp_ok(value: Any) -> bool:
    try:  # _type_check_datetime: a datetime, or what parses to one
        botocore_validate.parse_to_aware_datetime(value)
    except (TypeError, ValueError, AttributeError):
        return False
    return True


def _check_timestamp(value: Any, errors: Any, name: str) -> None:
    if not _timestamp_ok(value):
        errors.report(name, "invalid type", param=value, valid_types=list(_TIMESTAMP_TYPE_NAMES))


_BLOB = Compiled(_blob_ok, _check_blob)
_TIMESTAMP = Compiled(_timestamp_ok, _check_timestamp)


def _botocores_own(shape: Any) -> Compiled:
    validator = ParamValidator()

    def check(value: Any, errors: Any, name: str) -> None:
        validator._validate(value, shape, errors, name)

    return Compiled(lambda value: False, check)  # always walked by botocore's own


def compile_shape(shape: Any) -> Compiled:
    """The checks of ``shape``: ``ParamValidator._validate``'s dispatch, done once."""
    if botocore_validate.is_json_value_header(shape):
        return _json_value(shape)
    type_name = shape.type_name
    if type_name == "structure" and shape.is_document_type:
        return _DOCUMENT
    if type_name == "structure":
        return _structure(shape)
    if type_name == "list":
        return _list(shape)
    if type_name == "map":
        return _map(shape)
    if type_name == "string":
        return _scalar(shape, "invalid length")
    if type_name in ("integer", "long", "double", "float", "boolean"):
        return _scalar(shape)
    if type_name == "blob":
        return _BLOB
    if type_name == "timestamp":
        return _TIMESTAMP
    return _botocores_own(shape)  # no validator of botocore's: its own raises as it does


_compiled: dict[tuple[int, int, str, type], tuple[Any, Any, Compiled]] = {}


def _root_check(shape: Any) -> Compiled:
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
    compiled = compile_shape(shape)
    if len(_compiled) < _CACHE_LIMIT:
        with _lock:
            _compiled[key] = (definition, shape_map, compiled)
    return compiled


def validate(self: Any, params: Any, shape: Any) -> Any:
    """``ParamValidator.validate``: compiled checkers for botocore's ``ParamValidator`` as
    installed over (module docstring), botocore's own otherwise."""
    if (type(self) is not ParamValidator or not _installed_parts
            or (_read_validator(ParamValidator), _read_module(botocore_validate)) != _installed_parts[0]):
        return _originals["ParamValidator.validate"](self, params, shape)
    errors = botocore_validate.ValidationErrors()
    compiled = _root_check(shape)
    if not compiled.ok(params):
        compiled.check(params, errors, "")
    return errors


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
