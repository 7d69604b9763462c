"""Cheaper dispatch inside moto for the calls it serves over botocore's wire (ECS, EC2,
CloudWatch Logs, SNS, SQS...: every service but DynamoDB on the in-memory store).

The answers are moto's own, made by the same code from the same request; what changes is
work moto repeats on every call although its inputs are fixed once the backends load:

* **the route** (:func:`memoize_stubber_routes`): moto's botocore stubber matches a
  request's URL against every service's pattern (~90 regexes), then rebuilds the matched
  backend's URL table (``BaseBackend.urls``, a property: ``str.format`` and ``re.sub`` per
  path) and matches those too, for every request. The outcome depends only on the URL
  (query string removed) and on moto's configuration (passthrough services, the service
  whitelist, ISO regions): it is kept, keyed by exactly those, and everything after it
  (building moto's request, recording it, the handler and its errors) runs as moto runs it.
  The backends moto touches while resolving (the default account's us-east-1 backend of
  each matched service, created on first touch) are still touched on every call, in the
  same order.
* **the attribute names** (:func:`memoize_serializer_aliases`): moto's response serializer
  asks six alias providers, for every member of every structure it writes, which attribute
  names of the Python object may hold the member (through a context object and two
  generators). Apart from the object's own ``Meta`` aliases (still read live), the answer
  is a function of the object's class, the member's name, its shape and the structure the
  shape sits in (``shape.parent``): kept per those; the value is then picked from the
  object and transformed (``RESPONSE_KEY_PATH_TO_TRANSFORMER``) as moto's picker does.

* **the JSON structures' plans** (local_mode/sim/moto_serializer.py, on top of the kept
  names): what moto's JSON serializer derives per member of every structure it writes.

All are installed by ``LocalAws`` (``install_moto_dispatch``) over moto's functions, only
when moto's functions are the ones copied (the first two: :data:`_EXPECTED_SOURCES`; the
plans: moto_serializer's ``_EXPECTED_SOURCE``): a moto upgrade that changes them leaves
moto's own in place. tests/local_mode/test_moto_dispatch.py compares every
moto-served answer of whole flows with and without them.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import moto.backend_index as backend_index
import moto.backends as backends
from botocore import xform_name
from moto import settings
from moto.core import DEFAULT_ACCOUNT_ID
from moto.core import serialize as moto_serialize
from moto.core.base_backend import BackendDict, BaseBackend
from moto.core.botocore_stubber import BotocoreStubber
from moto.core.config import (
    default_user_config,
    passthrough_service,
    passthrough_url,
    service_whitelisted,
)
from moto.core.exceptions import HTTPException, ServiceNotWhitelisted
from moto.core.request import normalize_request
from moto.core.serialize import (
    DEFAULT_ALIAS_PROVIDERS,
    AttributePickerContext,
    ExplicitAlias,
    ResponseSerializer,
    XFormedAttributePicker,
)
from moto.core.utils import MISSING, get_equivalent_url_in_aws_domain
from moto.moto_api import recorder

from .moto_serializer import (
    _source_digest,
    memoize_json_structures,
    names_but_explicit,
    unmemoize_json_structures,
)

#: sha256 of the moto functions this module replaces (moto 5.2.5); another source: not installed
_EXPECTED_SOURCES = {
    "BotocoreStubber.process_request": "f79a1a778c7e755f0c7f234cdab9e36312ed2b16d7051baf06b04872f79dd5b2",
    "ResponseSerializer.get_value": "5ac16904b91c293555159f2e4726b73cc5d7fb9c1c414a6d912d9e2f45da539e",
    # the picker serializer_get_value stands in for (its __call__, names and context)
    "AttributePicker": "cdab6ce14f6a07943c71619ec133bef2569f50504f5edc22685f9eace8e028f7",
    # what a kept name depends on is read off the providers' code: another provider, another answer
    "DEFAULT_ALIAS_PROVIDERS": "f35c8b514d168852ecd9ba8140fd623129d4f5a575737b4228a9d409a6d7013e",
}
_CACHE_LIMIT = 4096  # entries per cache; past it, answers are computed as moto computes them
_lock = threading.Lock()
_originals: dict[str, Any] = {}


class _Route(NamedTuple):
    """What moto's stubber decides for a URL: ``serve`` (with ``handler``), ``passthrough``,
    ``not-implemented`` (moto's 404) or ``unmocked``; ``touched``: the services whose default
    backend it looked up on the way, in order."""

    verdict: str
    handler: Callable[..., Any] | None
    touched: tuple[str, ...]
    keep: bool = True


_routes: dict[tuple[Any, ...], _Route] = {}
_NOT_IMPLEMENTED_URL = re.compile(r"https?://.+\.amazonaws.com/.*")


def _default_backend(service: str) -> Any:
    """The backend moto's stubber reads a service's URL table from (created on first use)."""
    backend_dict = backends.get_backend(service)  # type: ignore[call-overload]
    if isinstance(backend_dict, BackendDict):
        if "us-east-1" in backend_dict[DEFAULT_ACCOUNT_ID]:
            return backend_dict[DEFAULT_ACCOUNT_ID]["us-east-1"]
        return backend_dict[DEFAULT_ACCOUNT_ID]["aws"]
    return backend_dict["global"]


def _route_config() -> tuple[Any, ...]:
    """The moto settings a route depends on besides the URL (read on every call: a test may
    change them between mocks)."""
    core = default_user_config.get("core", {})
    whitelist = core.get("service_whitelist")
    return (tuple(core.get("passthrough", {}).get("services", [])),
            None if whitelist is None else tuple(whitelist), settings.enable_iso_regions())


def _resolve(clean_url: str) -> _Route:
    """moto 5.2.5's ``BotocoreStubber.process_request`` up to the handler, as a decision.
    ``ServiceNotWhitelisted`` is raised as moto raises it (and not kept)."""
    touched: list[str] = []
    keep = True
    for service, pattern in backend_index.backend_url_patterns:
        if pattern.match(clean_url):
            if passthrough_service(service):
                return _Route("passthrough", None, tuple(touched), keep)
            if not service_whitelisted(service):
                raise ServiceNotWhitelisted(service)
            touched.append(service)
            backend = _default_backend(service)
            # A backend reading its URL table some other way (S3 reloads its module from the
            # environment on every request) is resolved each time, as moto does.
            keep = keep and type(backend)._url_module is BaseBackend._url_module
            for url, handler in backend.urls.items():
                if re.compile(url).match(clean_url):
                    return _Route("serve", handler, tuple(touched), keep)
    if _NOT_IMPLEMENTED_URL.match(clean_url):
        return _Route("not-implemented", None, tuple(touched), keep)
    return _Route("unmocked", None, tuple(touched), keep)


def process_request(self: Any, request: Any) -> Any:
    """``BotocoreStubber.process_request`` with the route kept (module docstring)."""
    parsed_url, _ = get_equivalent_url_in_aws_domain(request.url)
    clean_url = f"{parsed_url.scheme}://{parsed_url.netloc}{parsed_url.path}"
    if passthrough_url(clean_url):
        return None
    key = (clean_url, *_route_config())
    route = _routes.get(key)
    if route is None:
        route = _resolve(clean_url)
        if route.keep and len(_routes) < _CACHE_LIMIT:
            _routes[key] = route
    else:
        for service in route.touched:
            _default_backend(service)
    if route.verdict == "serve":
        assert route.handler is not None
        normalized_request = normalize_request(request)
        try:
            recorder._record_request(normalized_request)
            status, headers, body = route.handler(
                normalized_request, normalized_request.raw_url, normalized_request.headers)
        except HTTPException as e:
            status, headers, body = e.code, e.get_headers(), e.get_body()
        return status, headers, body
    if route.verdict == "not-implemented":
        return 404, {}, "Not yet implemented"
    return None


process_request._memoized_routes = True  # type: ignore[attr-defined]


_alias_names: dict[tuple[Any, ...], tuple[str, ...]] = {}


def serializer_get_value(self: Any, value: Any, key: str, shape: Any) -> Any:
    """``ResponseSerializer.get_value`` with the attribute names kept (module docstring): the
    value picked and transformed as ``XFormedAttributePicker`` picks and transforms it."""
    picker = self._value_picker
    if (type(picker) is not XFormedAttributePicker or picker.alias_providers is not DEFAULT_ALIAS_PROVIDERS
            or DEFAULT_ALIAS_PROVIDERS[0] is not ExplicitAlias):
        return _originals["ResponseSerializer.get_value"](self, value, key, shape)
    try:
        cache_key = (value.__class__, key, shape, getattr(shape, "parent", None))
        names = _alias_names.get(cache_key)
    except TypeError:  # an unhashable shape: as moto does
        return _originals["ResponseSerializer.get_value"](self, value, key, shape)
    if names is None:
        try:
            names = names_but_explicit(value, key, shape)
        except Exception:  # a provider failing eagerly: moto's lazy order decides
            return _originals["ResponseSerializer.get_value"](self, value, key, shape)
        if len(_alias_names) < _CACHE_LIMIT:
            _alias_names[cache_key] = names
    meta = getattr(value, "Meta", None)  # ExplicitAlias, read live: an object may carry its own
    if meta is not None and key in getattr(meta, "serialization_aliases", ()):
        alias = meta.serialization_aliases[key]
        names = (alias, xform_name(alias), *names)
    picked = None
    for name in names:
        found = moto_serialize.get_value(value, name, MISSING)  # the picker's own helper
        if found is not MISSING:
            picked = found
            break
    if picker.response_transformers:
        key_path = f"{'.'.join(self.path)}.{key}"
        for transform_path, transform in picker.response_transformers.items():
            if key_path.endswith(transform_path):
                return transform(picked)
    return picked


serializer_get_value._memoized_aliases = True  # type: ignore[attr-defined]


def _replace(owner: Any, attribute: str, label: str, replacement: Any) -> bool:
    current = owner.__dict__[attribute]
    if current is replacement:
        return True
    if _source_digest(current) != _EXPECTED_SOURCES[label]:
        return False  # not the moto this copy was made from: moto's own stays
    _originals[label] = current
    setattr(owner, attribute, replacement)
    return True


def memoize_stubber_routes() -> bool:
    """Keep moto's URL -> handler resolution (module docstring); False when moto's stubber
    is not the one this module copies."""
    with _lock:
        return _replace(BotocoreStubber, "process_request", "BotocoreStubber.process_request",
                        process_request)


def memoize_serializer_aliases() -> bool:
    """Keep moto's serializer's attribute names per class, member and shape (module docstring);
    False when moto's serializer or picker is not the one this module copies."""
    picker = (moto_serialize.AttributePicker.__call__, moto_serialize.AttributePicker.get_possible_keys,
              XFormedAttributePicker.get_possible_keys, AttributePickerContext)
    with _lock:
        if (_source_digest(*picker) != _EXPECTED_SOURCES["AttributePicker"]
                or _source_digest(*DEFAULT_ALIAS_PROVIDERS) != _EXPECTED_SOURCES["DEFAULT_ALIAS_PROVIDERS"]
                or "__call__" in XFormedAttributePicker.__dict__):
            return False
        return _replace(ResponseSerializer, "get_value", "ResponseSerializer.get_value", serializer_get_value)


_installed: list[bool] = []


def install_moto_dispatch() -> None:
    """All three (each keeps moto's own when moto changed); once a process: reading moto's source
    to check it costs more than a run's calls save."""
    if not _installed:
        _installed.append(True)
        memoize_stubber_routes()
        if memoize_serializer_aliases():
            memoize_json_structures()


def uninstall_moto_dispatch() -> None:
    """moto's own functions back, the kept answers dropped (the differential test)."""
    unmemoize_json_structures()
    with _lock:
        owners = {"BotocoreStubber.process_request": (BotocoreStubber, "process_request"),
                  "ResponseSerializer.get_value": (ResponseSerializer, "get_value")}
        for label, original in list(_originals.items()):
            owner, attribute = owners[label]
            setattr(owner, attribute, original)
            del _originals[label]
        _routes.clear()
        _alias_names.clear()
        _installed.clear()
