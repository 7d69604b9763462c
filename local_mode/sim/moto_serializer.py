"""moto's JSON response serializer (ECS, CloudWatch Logs, SQS...) with its per-shape work done
once: the same walk, the same values picked in the same order, the same body.

moto writes a structure member by member: for each it sets ``member_shape.parent``, asks the
value picker (a context object per member), then ``_serialize`` looks the writer up by name
(``getattr(self, f"_serialize_type_{type_name}")``) and pushes and pops ``self.path`` around
it, even for a string. What of that depends only on the shape is kept here, per structure
shape (:func:`_plan`): each member's serialized name and how it is written; per structure
and class of the object written, the attribute names each member may be read from (those the
picker's alias providers give, as ``serializer_get_value`` keeps them); per structure, path
and response transformers (``RESPONSE_KEY_PATH_TO_TRANSFORMER``), the transformer each member
gets. The walk then picks each member's value as moto's picker does and writes:

* strings, integers, floats exactly of those types, and booleans, as moto's writers leave
  them (anything else of those shapes through moto's writer);
* structures, lists of strings or of structures, maps of strings: walked here, pushing and
  popping ``self.path`` as moto does (the picker's transformers read it);
* everything else (timestamps, blobs, documents' lists, DynamoDB's ``AttributeValue``...)
  through moto's own ``self._serialize``, where ``self.path`` is what moto's would be.

An object carrying its own aliases (``Meta.serialization_aliases``), an object read by item
that is not a ``dict``, or a member whose names the providers cannot give eagerly, is read
through ``self.get_value`` as before. Installed over moto's ``_serialize_type_structure``
(:func:`memoize_json_structures`) only when each moto function the walk stands in for has
the source copied here (:data:`_EXPECTED_SOURCE`); used only for moto's ``JSONSerializer``
whose methods are still those (and ``get_value`` moto_dispatch's ``serializer_get_value``):
any other serializer, protocol or error shape runs moto's code.
tests/local_mode/test_moto_serializer.py serializes every moto-served answer of whole flows
both ways and compares the bytes.
"""

from __future__ import annotations

import hashlib
import inspect
import operator
import threading
from typing import Any, NamedTuple

from botocore import xform_name
from moto.core import serialize as moto_serialize
from moto.core import utils as moto_utils
from moto.core.model import StructureShape
from moto.core.serialize import (
    DEFAULT_ALIAS_PROVIDERS,
    AttributePickerContext,
    BaseJSONSerializer,
    ExplicitAlias,
    JSONSerializer,
    ResponseSerializer,
    XFormedAttributePicker,
)
from moto.core.utils import MISSING

#: sha256 of the moto functions the walk stands in for (moto 5.2.5, :func:`_copied_functions`);
#: another source: not installed
_EXPECTED_SOURCE = "ad134a2279eea3a027319079e62bf2a3551e7abe90f3741b1eb31f349e4d9bac"
_CACHE_LIMIT = 4096  # entries per cache; past it, plans are made per call (as moto derives them)
_lock = threading.Lock()
_originals: dict[str, Any] = {}

# how a member is written
_STRING, _INTEGER, _FLOAT, _RAW, _STRUCT, _DOCUMENT, _LIST, _MAP, _GENERIC = range(9)


class _Member(NamedTuple):
    key: str
    shape: Any
    kind: int
    name: str  # the serialized name (moto's get_serialized_name)
    item: Any = None  # a list's member shape, a map's value shape
    item_kind: int = _GENERIC  # how a list's items are written (_STRING, _STRUCT or _GENERIC)


def _source_digest(*code: Any) -> str:
    return hashlib.sha256("".join(inspect.getsource(c) for c in code).encode()).hexdigest()


def names_but_explicit(value: Any, key: str, shape: Any) -> tuple[str, ...]:
    """The names moto's alias providers after ``ExplicitAlias`` give for ``key`` of ``value``,
    each followed by its ``xform_name`` (``XFormedAttributePicker``), in moto's order."""
    context = AttributePickerContext(obj=value, key=key, shape=shape)
    names: list[str] = []
    for provider_class in DEFAULT_ALIAS_PROVIDERS[1:]:
        provider = provider_class(context)  # type: ignore[abstract]  # (the concrete ones)
        if provider.has_alias(key):
            alias = provider.get_alias(key)
            names += (alias, xform_name(alias))
    return tuple(names)


def _structure_kind(shape: Any) -> int:
    if shape.is_document_type:
        return _DOCUMENT
    # DynamoDB's AttributeValue: moto_patches writes it its own way, through moto's dispatch
    if type(shape) is not StructureShape or shape.name == "AttributeValue":
        return _GENERIC
    return _STRUCT


def _member(key: str, shape: Any) -> _Member:
    kind = shape.type_name
    name = shape.serialization.get("name", key)
    if kind == "string":
        return _Member(key, shape, _STRING, name)
    if kind in ("integer", "long"):
        return _Member(key, shape, _INTEGER, name)
    if kind in ("float", "double"):
        return _Member(key, shape, _FLOAT, name)
    if kind == "boolean":  # no writer of its own: moto's _default_serialize
        return _Member(key, shape, _RAW, name)
    if kind == "structure":
        return _Member(key, shape, _structure_kind(shape), name)
    if kind == "list" and "name" not in shape.member.serialization:
        item = shape.member
        item_kind = _STRING if item.type_name == "string" else (
            _structure_kind(item) if item.type_name == "structure" else _GENERIC)
        return _Member(key, shape, _LIST, name, item, _GENERIC if item_kind == _DOCUMENT else item_kind)
    if kind == "map" and shape.value.type_name == "string" and "name" not in shape.value.serialization:
        return _Member(key, shape, _MAP, name, shape.value)
    return _Member(key, shape, _GENERIC, name)


class _Plan:
    """A structure's members (each member shape's ``parent`` set to it, as moto sets it), the
    attribute names per class of object, the transformers per path."""

    __slots__ = ("members", "names", "none", "transforms")

    def __init__(self, shape: Any) -> None:
        members = []
        for key, member_shape in shape.members.items():
            member_shape.parent = shape
            members.append(_member(key, member_shape))
        self.members: tuple[_Member, ...] = tuple(members)
        self.none: tuple[None, ...] = (None,) * len(members)  # no names kept, no transformer
        self.names: dict[Any, tuple[Any, ...]] = {}
        self.transforms: dict[tuple[Any, ...], tuple[int | None, ...] | None] = {}

    def names_of(self, cls: Any, value: Any) -> tuple[Any, ...]:
        """Per member, the attribute names to read (None: read through ``get_value``)."""
        row = self.names.get(cls)
        if row is None:
            entries: list[Any] = []
            for member in self.members:
                try:
                    names = names_but_explicit(value, member.key, member.shape)
                except Exception:  # a provider failing eagerly: moto's lazy order decides
                    names = None
                if names is not None and any("." in name for name in names):
                    names = None  # a dotted name is a path to moto's picker
                elif names is not None and cls is dict:  # a dict read twice reads the same
                    names = tuple(dict.fromkeys(names))
                entries.append(names)
            row = tuple(entries)
            if len(self.names) < 64:
                self.names[cls] = row
        return row

    def transforms_of(self, prefix: str, paths: tuple[str, ...]) -> tuple[int | None, ...] | None:
        """Per member, the index in ``paths`` of the transformer moto's picker applies at
        ``prefix.key`` (None: none for any member). Keyed on the paths, not the functions: moto
        puts a new ``lambda x: x`` in a transformer dict on some calls (``_include_in_response``);
        the function is read from the current transformers at use."""
        cache_key = (prefix, paths)
        if cache_key in self.transforms:
            return self.transforms[cache_key]
        row: list[int | None] = []
        for member in self.members:
            key_path = f"{prefix}.{member.key}"
            row.append(next((index for index, path in enumerate(paths) if key_path.endswith(path)), None))
        found = tuple(row) if any(t is not None for t in row) else None
        if len(self.transforms) < 256:
            self.transforms[cache_key] = found
        return found


_plans: dict[Any, _Plan] = {}


def _plan(shape: Any) -> _Plan:
    plan = _plans.get(shape)
    if plan is None:
        plan = _Plan(shape)
        if len(_plans) < _CACHE_LIMIT:
            _plans[shape] = plan
    return plan


def _fill(self: Any, out: dict[str, Any], value: Any, shape: Any, transformers: tuple[Any, ...]) -> None:
    """moto's ``_serialize_type_structure`` of ``value`` (not None) into ``out``;
    ``transformers``: () or (the picker's transformer paths, their functions), in its order."""
    plan = _plan(shape)
    path = self.path
    transforms = plan.transforms_of(".".join(path), transformers[0]) if transformers else None
    if type(value) is dict:
        pick = value.get
        names = plan.names_of(value.__class__, value)
        slow = False
    else:
        # an object's own aliases, or one read by item: the picker as moto_dispatch keeps it
        slow = getattr(value, "Meta", None) is not None or hasattr(value, "__getitem__")
        names = plan.none if slow else plan.names_of(value.__class__, value)
        pick = None
    for member, member_names, transform in zip(plan.members, names, transforms or plan.none, strict=True):
        key, member_shape, kind, name, item_shape, _ = member
        if member_names is None:
            picked = self.get_value(value, key, member_shape)
        else:
            picked = None
            if pick is not None:
                for name_ in member_names:
                    found = pick(name_, MISSING)
                    if found is not MISSING:
                        picked = found
                        break
            else:
                for name_ in member_names:
                    found = getattr(value, name_, MISSING)
                    if found is not MISSING:
                        picked = found
                        break
            if transform is not None:
                picked = transformers[1][transform](picked)
        if picked is None:
            continue
        if kind == _STRING:
            if type(picked) is str:
                out[name] = picked
            else:
                self._serialize_type_string(out, picked, member_shape, key)
        elif kind == _STRUCT:
            path.append(key)
            inner: dict[str, Any] = {}
            _fill(self, inner, picked, member_shape, transformers)
            path.pop()
            out[name] = inner
        elif kind == _LIST:
            path.append(key)
            out_list = _list(self, picked, member, transformers)
            path.pop()
            out[name] = out_list
        elif kind == _INTEGER:
            out[name] = picked if type(picked) is int else int(picked)
        elif kind == _FLOAT:
            out[name] = picked if type(picked) is float else float(picked)
        elif kind == _RAW:
            out[name] = picked
        elif kind == _MAP:
            entries: dict[Any, Any] = {}
            out[name] = entries
            path.append(key)
            for entry_key, entry in picked.items():
                if type(entry) is str:
                    entries[entry_key] = entry
                else:
                    self._serialize(entries, entry, item_shape, entry_key)
            path.pop()
        elif kind == _DOCUMENT:
            out[key] = picked
        else:
            self._serialize(out, picked, member_shape, key)


def _list(self: Any, value: Any, member: _Member, transformers: tuple[Any, ...]) -> list[Any]:
    """moto's JSON ``_serialize_type_list`` of ``value`` (``self.path`` ending with its key)."""
    items: list[Any] = []
    item_shape, item_kind = member.item, member.item_kind
    item_key = item_shape.name
    path = self.path
    for item in value:
        if item_kind == _STRING and type(item) is str:
            items.append(item)
        elif item_kind == _STRUCT:
            if item is None:
                items.append(None)
                continue
            path.append(item_key)
            inner: dict[str, Any] = {}
            _fill(self, inner, item, item_shape, transformers)
            path.pop()
            items.append(inner)
        else:
            wrapper: dict[str, Any] = {}
            self._serialize(wrapper, item, item_shape, item_key)
            items.append(wrapper.get(item_key, item))
    return items


#: what the walk reads of ``JSONSerializer``, as it was when installed (checked on every walk)
_METHODS = ("_serialize", "_default_serialize", "get_serialized_name", "_serialize_structure_member",
            "_serialize_type_structure", "_serialize_type_list", "_serialize_type_map",
            "_serialize_type_string", "_serialize_type_integer", "_serialize_type_long",
            "_serialize_type_float", "_serialize_type_double", "get_value", "MAP_TYPE")
_read_methods = operator.attrgetter(*_METHODS)
_installed_methods: list[tuple[Any, ...]] = []
_checked_structure: list[Any] = []  # the JSON structure writer whose source was checked


def serialize_structure(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> Any:
    """``ResponseSerializer._serialize_type_structure``: walked with the kept plans for moto's
    ``JSONSerializer`` as installed (module docstring), moto's own for everything else."""
    picker = self._value_picker
    if (type(self) is not JSONSerializer or type(shape) is not StructureShape
            or not _installed_methods
            or (_read_methods(JSONSerializer) != _installed_methods[0] and not _resnapshot())
            or ResponseSerializer.__dict__["_serialize_type_structure"] is not serialize_structure
            or hasattr(JSONSerializer, "_serialize_type_boolean")
            or type(picker) is not XFormedAttributePicker
            or picker.alias_providers is not DEFAULT_ALIAS_PROVIDERS
            or DEFAULT_ALIAS_PROVIDERS[0] is not ExplicitAlias):
        return _originals["ResponseSerializer._serialize_type_structure"](self, serialized, value, shape, key)
    if value is None:
        return None
    given = picker.response_transformers
    transformers = (tuple(given), tuple(given.values())) if given else ()
    if not key:
        _fill(self, serialized, value, shape, transformers)
        return None
    inner: dict[str, Any] = {}
    _fill(self, inner, value, shape, transformers)
    serialized[shape.serialization.get("name", key)] = inner
    return None


def _json_structure() -> Any:
    """moto's ``BaseJSONSerializer._serialize_type_structure``, under moto_patches' wrapper if
    installed (it writes DynamoDB's ``AttributeValue`` its own way and passes every other
    shape on: the walk leaves that shape to moto's dispatch)."""
    function = BaseJSONSerializer.__dict__["_serialize_type_structure"]
    if getattr(function, "_attribute_values_direct", False):
        function = function._generic
    return function


def _copied_functions() -> tuple[Any, ...]:
    """The moto functions the walk stands in for (their source pinned)."""
    base, json_ = ResponseSerializer.__dict__, BaseJSONSerializer.__dict__
    return (_originals.get("ResponseSerializer._serialize_type_structure", base["_serialize_type_structure"]),
            base["_serialize"], base["_default_serialize"], base["get_serialized_name"],
            base["_serialize_structure_member"], base["_serialize_type_integer"],
            base["_serialize_type_float"], _json_structure(), json_["_serialize_type_list"],
            json_["_serialize_type_map"],
            json_["_serialize_type_string"], moto_utils.get_value, moto_utils._get_value_for_key)


def _expected_methods() -> tuple[Any, ...]:
    """What :data:`_METHODS` must read for the walk to stand in for moto's."""
    base, json_ = ResponseSerializer.__dict__, BaseJSONSerializer.__dict__
    return (base["_serialize"], base["_default_serialize"], base["get_serialized_name"],
            base["_serialize_structure_member"], JSONSerializer._serialize_type_structure,
            json_["_serialize_type_list"], json_["_serialize_type_map"], json_["_serialize_type_string"],
            base["_serialize_type_integer"], base["_serialize_type_integer"],
            base["_serialize_type_float"], base["_serialize_type_float"], JSONSerializer.get_value, dict)


def _resnapshot() -> bool:
    """``JSONSerializer``'s methods changed since installing: kept (and walked) if they are
    still those the walk stands in for over the same checked structure writer, e.g.
    moto_patches' ``AttributeValue`` wrapper installed after the walk."""
    with _lock:
        methods = _read_methods(JSONSerializer)
        if (not _installed_methods or not _checked_structure or methods != _expected_methods()
                or _json_structure() is not _checked_structure[0]
                or not getattr(JSONSerializer.get_value, "_memoized_aliases", False)):
            return False
        _installed_methods[0] = methods
        return True


def memoize_json_structures() -> bool:
    """Walk moto's JSON structures with the kept plans (module docstring); False when moto's
    serializer is not the one this module copies, or its value picker is not moto_dispatch's
    (``memoize_serializer_aliases``)."""
    with _lock:
        current = ResponseSerializer.__dict__["_serialize_type_structure"]
        if current is serialize_structure:
            return True
        methods = _read_methods(JSONSerializer)
        if (methods != _expected_methods() or hasattr(JSONSerializer, "_serialize_type_boolean")
                or not getattr(JSONSerializer.get_value, "_memoized_aliases", False)
                or moto_serialize.get_value is not moto_utils.get_value
                or _source_digest(*_copied_functions()) != _EXPECTED_SOURCE):
            return False
        _originals["ResponseSerializer._serialize_type_structure"] = current
        _installed_methods[:] = [methods]
        _checked_structure[:] = [_json_structure()]
        ResponseSerializer._serialize_type_structure = serialize_structure  # type: ignore[method-assign]
        return True


def unmemoize_json_structures() -> None:
    """moto's own walk back, the plans dropped."""
    with _lock:
        original = _originals.pop("ResponseSerializer._serialize_type_structure", None)
        if original is not None:
            ResponseSerializer._serialize_type_structure = original  # type: ignore[method-assign]
        _installed_methods.clear()
        _checked_structure.clear()
        _plans.clear()
