"""The in-memory DynamoDB (:class:`~local_mode.sim.dynamo.MemoryDynamo`) behind real boto3
clients: ``LocalAws(dynamodb="memory")``'s DynamoDB.

A client served from the store is a real botocore client (or a real boto3 resource's
client) whose API calls are answered by the store instead of an HTTP endpoint: its
``_make_api_call`` is :class:`StoreTransport`, which does what botocore's does around the
wire, on the client's own event system, in the same order:

* ``provide-client-params`` and ``before-parameter-build`` (boto3's resource maps Python
  types to DynamoDB JSON there, condition builders included), then botocore's parameter
  validation (``ParamValidationError`` before any hook sees the call);
* ``before-call`` (``CallFaults`` counts and may break the call here: a throttle answers
  without executing);
* each HTTP attempt: ``before-send`` (``ApiFaults`` answers an attempt with an error there,
  parsed by botocore's own parser), otherwise the store executes the call; then
  ``needs-retry``, answered by the client's own retry handler (standard mode, its retry
  quota, back-off slept through ``botocore.endpoint.time`` as the endpoint does);
* ``after-call`` (``CallFaults`` raises a lost response's ``ReadTimeoutError`` here;
  botocore's retry quota is released), then an error status raised as the client's own
  modeled exception class.

So fault injection, hooks and retries see a call on the store exactly as a call on moto:
same service ("dynamodb"), operation and call site, same order. What is skipped is what
only the wire needs: endpoint resolution, serialization, signing, the HTTP round trip
through moto and the response parsing. A resource's client gets its answers in Python
types straight from the store (the store keeps them; ``MemoryDynamo`` maps values as boto3's
TypeDeserializer does), so boto3's own output mapping is taken off that client;
a low-level client gets DynamoDB JSON.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import botocore.endpoint
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.compat import HTTPHeaders
from botocore.endpoint import convert_to_response_dict
from botocore.exceptions import ParamValidationError
from botocore.hooks import EventAliaser, HierarchicalEmitter, first_non_none_response
from botocore.parsers import create_parser
from botocore.validate import ParamValidator

from .store import MemoryDynamo

#: where a store-served request "goes": no HTTP endpoint (moto's stubber matches no URL here)
STORE_URL = "https://dynamodb.memory.invalid/"
_OUTPUT_MAPPING = "dynamodb-attr-value-output"  # boto3's after-call handler on a resource's client
_HOOKS_LOG = logging.getLogger("botocore.hooks")  # botocore's emitter logs each handler call here


class StoreTransport:
    """``client._make_api_call`` for a DynamoDB client answered by ``store`` (module docstring)."""

    def __init__(self, client: Any, store: MemoryDynamo, *, python: bool) -> None:
        self._client = client
        self._store = store
        self._python = python
        self._events = client.meta.events
        self._service_model = client.meta.service_model
        self._service_id = self._service_model.service_id.hyphenize()
        self._validator = ParamValidator() if client.meta.config.parameter_validation else None
        self._parser = create_parser(self._service_model.metadata["protocol"])
        # botocore's own emitter behind the client's aliaser: its handler lists are read directly
        # (``_emit``); another kind of emitter is only ever emitted to through its ``emit``.
        known = type(self._events) is EventAliaser and type(self._events._emitter) is HierarchicalEmitter
        self._emitter: HierarchicalEmitter | None = self._events._emitter if known else None
        if stubber := _moto_stubber():
            # A store-served request never reaches moto (botocore emits before-send to every handler).
            self._events.unregister("before-send", stubber)

    def __call__(self, operation_name: str, api_params: dict[str, Any]) -> Any:
        model = self._service_model.operation_model(operation_name)
        event_suffix = f"{self._service_id}.{operation_name}"
        context: dict[str, Any] = {
            "client_region": self._client.meta.region_name,
            "client_config": self._client.meta.config,
            "has_streaming_input": model.has_streaming_input,
            "auth_type": model.resolved_auth_type,
            "unsigned_payload": model.unsigned_payload,
            "auth_options": self._service_model.metadata.get("auth"),
        }
        responses = self._emit(f"provide-client-params.{event_suffix}", params=api_params, model=model,
                               context=context)
        api_params = first_non_none_response(responses, default=api_params)
        self._emit(f"before-parameter-build.{event_suffix}", params=api_params, model=model, context=context)
        if self._validator is not None:
            report = self._validator.validate(api_params, model.input_shape)
            if report.has_errors():
                raise ParamValidationError(report=report.generate_report())
        request_dict = {"url_path": "/", "query_string": "", "method": "POST", "headers": {},
                        "body": api_params, "url": STORE_URL, "context": context}
        _, answered = self._emit_until_response(
            f"before-call.{event_suffix}", model=model, params=request_dict,
            request_signer=self._client._request_signer, context=context)
        if answered is not None:
            http, parsed = answered
        else:
            try:
                http, parsed = self._send(model, request_dict, event_suffix)
            except Exception as error:
                self._emit(f"after-call-error.{event_suffix}", exception=error, context=context)
                raise
        self._emit(f"after-call.{event_suffix}", http_response=http, parsed=parsed, model=model,
                   context=context)
        if http.status_code >= 300:
            code = context.get("error_code_override") or parsed.get("Error", {}).get("Code")
            raise self._client.exceptions.from_code(code)(parsed, operation_name)
        return parsed

    # --------------------------------------------------------------- events
    def _emit(self, event_name: str, **kwargs: Any) -> list[tuple[Any, Any]]:
        return self._handlers_called(event_name, kwargs, stop_on_response=False)

    def _emit_until_response(self, event_name: str, **kwargs: Any) -> tuple[Any, Any]:
        responses = self._handlers_called(event_name, kwargs, stop_on_response=True)
        return responses[-1] if responses else (None, None)

    def _handlers_called(self, event_name: str, kwargs: dict[str, Any], *, stop_on_response: bool
                         ) -> list[tuple[Any, Any]]:
        """What the client's ``events.emit`` (``emit_until_response``) does: the aliased event's
        handlers from botocore's own lookup cache (emptied by every register and unregister, so
        never stale), called in its order with the same arguments, without its two wrapper
        calls and a debug log line per handler (~0.6 % of a crash campaign's armed CPU: six events,
        23 handlers a call). With that log on, or an event not looked up yet, botocore emits."""
        emitter = self._emitter
        handlers = aliased = None
        if emitter is not None and not _HOOKS_LOG.isEnabledFor(logging.DEBUG):
            aliased = self._events._alias_event_name(event_name)
            handlers = emitter._lookup_cache.get(aliased)
        if handlers is None:
            if stop_on_response:
                return [self._events.emit_until_response(event_name, **kwargs)]
            return self._events.emit(event_name, **kwargs)  # type: ignore[no-any-return]
        kwargs["event_name"] = aliased
        responses = []
        for handler in handlers:
            response = handler(**kwargs)
            responses.append((handler, response))
            if stop_on_response and response is not None:
                break
        return responses

    def _send(self, model: Any, request_dict: dict[str, Any], event_suffix: str
              ) -> tuple[Any, dict[str, Any]]:
        """botocore's endpoint loop: an attempt, then ``needs-retry`` decides on another."""
        context = request_dict["context"]
        retries = context.setdefault("retries", {})
        retries.update({"attempt": 1, "invocation-id": _invocation_id()})
        attempts = 1
        while True:
            request = AWSPreparedRequest("POST", STORE_URL, HTTPHeaders(), b"", False)
            http = first_non_none_response(self._emit(f"before-send.{event_suffix}", request=request))
            if http is None:
                status, parsed = self._store.respond(model.name, request_dict["body"], python=self._python)
                http = AWSResponse(STORE_URL, status, HTTPHeaders(), None)  # type: ignore[arg-type]
                if status >= 300:
                    self._add_modeled_message(parsed)
            else:  # an injected HTTP error (ApiFaults): parsed as botocore parses a response
                parsed = self._parse(http, model, event_suffix)
            delay = first_non_none_response(self._emit(
                f"needs-retry.{event_suffix}", response=(http, parsed), endpoint=self._client._endpoint,
                operation=model, attempts=attempts, caught_exception=None, request_dict=request_dict))
            if delay is None:
                break
            botocore.endpoint.time.sleep(delay)  # looked up per call: LocalAws records back-off there
            attempts += 1
            retries["attempt"] = attempts
        if "ResponseMetadata" in parsed:
            parsed["ResponseMetadata"]["RetryAttempts"] = attempts - 1
        return http, parsed

    def _add_modeled_message(self, parsed: dict[str, Any]) -> None:
        """An error's message as its modeled shape names it (``message`` or ``Message``), beside
        the fields the store gives: what botocore's second parsing pass finds in DynamoDB's body."""
        shape = self._service_model.shape_for_error_code(parsed["Error"]["Code"])
        for name in shape.members if shape is not None else ():
            if name.lower() == "message":
                parsed.setdefault(name, parsed["Error"]["Message"])

    def _parse(self, http: Any, model: Any, event_suffix: str) -> dict[str, Any]:
        response_dict = convert_to_response_dict(http, model)
        customized: dict[str, Any] = {}
        self._emit(f"before-parse.{event_suffix}", operation_model=model, response_dict=response_dict,
                   customized_response_dict=customized)
        parsed: dict[str, Any] = self._parser.parse(response_dict, model.output_shape)
        parsed.update(customized)
        if http.status_code >= 300:  # the modeled error's own fields (botocore's second pass)
            code = parsed.get("Error", {}).get("Code")
            shape = self._service_model.shape_for_error_code(code) if code else None
            if shape is not None:
                parsed.update(self._parser.parse(response_dict, shape))
        return parsed


_invocation_ids = itertools.count(1)


def _invocation_id() -> str:
    """An id for botocore's retry context, shaped as the UUID botocore draws (nothing reads
    it here: it names the request on the wire, which a store-served call never reaches); a
    counter, not uuid4, whose urandom read and UUID object were ~1 % of a broken run."""
    return f"00000000-0000-4000-8000-{next(_invocation_ids):012x}"


def _moto_stubber() -> Any:
    try:
        from moto.core.models import botocore_stubber
    except ImportError:  # pragma: no cover - moto is a dev dependency of local mode
        return None
    return botocore_stubber


def serve_client(client: Any, store: MemoryDynamo) -> Any:
    """A low-level DynamoDB client answered by ``store`` (DynamoDB JSON in and out)."""
    client._make_api_call = StoreTransport(client, store, python=False)
    return client


def serve_resource(resource: Any, store: MemoryDynamo) -> Any:
    """A boto3 DynamoDB resource answered by ``store``: its client gets Python types.

    boto3 registers its output mapping (DynamoDB JSON -> Python) on the client under a
    unique id, again for every ``Table`` made; the store's answers are mapped already, so
    that id holds a handler that leaves them as they are (botocore keeps one per id)."""
    client = resource.meta.client
    client.meta.events.unregister("after-call.dynamodb", unique_id=_OUTPUT_MAPPING)
    client.meta.events.register("after-call.dynamodb", _mapped_by_the_store, unique_id=_OUTPUT_MAPPING)
    client._make_api_call = StoreTransport(client, store, python=True)
    return resource


def _mapped_by_the_store(**_: Any) -> None:
    """boto3's output mapping, for a client whose answers come in Python types already."""


def serve_dynamodb_from(session: Any, store: MemoryDynamo) -> None:
    """Every DynamoDB client and resource ``session`` (a boto3 Session) makes from now on is
    answered by ``store``; other services are untouched."""
    make_client, make_resource = session.client, session.resource

    def client(service_name: str, *args: Any, **kwargs: Any) -> Any:
        made = make_client(service_name, *args, **kwargs)
        return serve_client(made, store) if service_name == "dynamodb" else made

    def resource(service_name: str, *args: Any, **kwargs: Any) -> Any:
        made = make_resource(service_name, *args, **kwargs)
        return serve_resource(made, store) if service_name == "dynamodb" else made

    session.client = client
    session.resource = resource
