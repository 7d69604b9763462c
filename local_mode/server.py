"""The REST API on 127.0.0.1: HTTP -> API Gateway REST proxy events (1.0) -> the SAME handlers.

Routes (what API Gateway does in AWS, reproduced here):

* ``POST /v1/report_tasks``, ``POST /v1/report_gpu`` -> ``handlers.node_api`` behind
  ``handlers.node_authorizer`` (invoked first, like a TOKEN authorizer without cache:
  no ``Authorization`` header or ``Unauthorized`` -> 401, Deny -> 403, Allow ->
  its ``context`` lands in ``requestContext.authorizer``).
* ``GET /v1/control``, ``POST /v1/control/suspend`` (the training client's suspend
  channel) -> ``handlers.job_control_api`` behind ``handlers.job_control_authorizer``,
  invoked first in the same way (its ``context`` carries the token's ``job_id`` and ``rank``).
* ``/v1/jobs``, ``/v1/jobs/...``, ``/v1/quotas``, ``/swagger`` -> ``handlers.jobs_api``
  (imported lazily; 404 while it does not exist). IAM auth in AWS; locally the caller is
  ``requestContext.identity.userArn`` = ``X-Local-User`` (an ARN, or a user name made
  into ``arn:aws:iam::123456789012:user/<name>``), default ``.../user/local``. No
  signature is checked.

A path may carry the stage prefix (``/prod/v1/report_tasks``), as with the
execute-api URL of the deployed stage.

What API Gateway answers itself is answered here the same way, in the APIs' error shape
(``gpu_recovery.api_routes.GATEWAY_ERRORS``): a method or path the stage does not define
(TRACE, DELETE, ...) -> 403 ``MISSING_AUTHENTICATION_TOKEN``; an ``Authorization`` header
that fails the authorizer's identity validation expression -> 401 without invoking it;
a body over 10 MB -> 413, sent after the body was read so the client sees it.

Run it alone (no cluster behind it; ``make playground`` / ``make local-api`` run it with a
simulated cluster, :mod:`local_mode.playground`)::

    python -m local_mode.server [--port 8080] [--node-id NODE] [--sweep-seconds 60]

It starts the embedded emulator (:class:`local_mode.emulator.LocalAws`), adds the
node-token table, issues a token for ``--node-id`` and prints it, then serves until
Ctrl-C, running the heartbeat sweep every ``--sweep-seconds`` (for trying the node agent).
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import importlib
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpu_recovery.api_routes import (
    CONTROL_API_ROUTES,
    GATEWAY_ERRORS,
    JOBS_API_ROUTES,
    NODE_API_ROUTES,
    NODE_TOKEN_HEADER_PATTERN,
)

from .events import ACCOUNT_ID, REGION
from .sim.lambda_context import LambdaContext

API_ID = "local"
STAGE = "prod"
DEFAULT_USER_ARN = f"arn:aws:iam::{ACCOUNT_ID}:user/local"
MAX_REQUEST_BYTES = 10 * 1024 * 1024  # API Gateway's payload limit
API_TIMEOUT_SECONDS = 29  # API Gateway's integration timeout: what an API Lambda has
MAX_DRAIN_BYTES = 64 * 1024 * 1024  # read (and drop) at most this much of an oversized body
NODE_ROUTES = tuple(f"/{path}" for _, path in NODE_API_ROUTES)
CONTROL_ROUTES = tuple(f"/{path}" for _, path in CONTROL_API_ROUTES)

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


@dataclass
class ApiResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"null")


def _json(status: int, payload: Any) -> ApiResponse:
    return ApiResponse(status, {"Content-Type": "application/json"}, json.dumps(payload).encode())


def gateway_error(response_type: str) -> ApiResponse:
    """What API Gateway answers itself (gateway response), in the APIs' error shape."""
    status, message = GATEWAY_ERRORS[response_type]
    return _json(status, {"error": response_type, "message": message})


def _template_matches(template: str, path: str) -> bool:
    parts, wanted = path.strip("/").split("/"), template.split("/")
    return len(parts) == len(wanted) and all(
        w == p or (w.startswith("{") and p != "") for w, p in zip(wanted, parts, strict=True))


def route_defined(method: str, path: str) -> bool:
    """Does the deployed stage define this method on this path (jobs, node and control routes)?"""
    return any(m == method and _template_matches(t, path)
               for m, t in NODE_API_ROUTES + CONTROL_API_ROUTES + JOBS_API_ROUTES)


# A route kind behind an authorizer: (its authorizer's module, its API's) in ``handlers``.
AUTHORIZED = {"node": ("node_authorizer", "node_api"),
              "control": ("job_control_authorizer", "job_control_api")}


def _function_name(module: str) -> str:
    """The function's name in the logs: its module's, hyphenated (``node-api``)."""
    return module.replace("_", "-")


class LocalApi:
    """The routing and event building, without sockets (tests call :meth:`handle`)."""

    def __init__(self, *, stage: str = STAGE, node_handler: Handler | None = None,
                 authorizer: Handler | None = None, jobs_module: str = "handlers.jobs_api",
                 control_handler: Handler | None = None, control_authorizer: Handler | None = None) -> None:
        self.stage = stage
        # The handlers given, by module name; the others are imported on their first request.
        given = {"node_api": node_handler, "node_authorizer": authorizer,
                 "job_control_api": control_handler, "job_control_authorizer": control_authorizer}
        self._handlers: dict[str, Handler] = {m: h for m, h in given.items() if h is not None}
        self._jobs_module = jobs_module
        # Powertools resolvers keep the current event on a module-level app: one at a time.
        self._lock = threading.Lock()

    # --------------------------------------------------------------- handlers
    def _handler(self, name: str) -> Handler:
        if name not in self._handlers:
            self._handlers[name] = importlib.import_module(f"handlers.{name}").lambda_handler
        return self._handlers[name]

    def jobs_handler(self) -> Handler | None:
        try:
            return importlib.import_module(self._jobs_module).lambda_handler
        except ModuleNotFoundError as error:
            if error.name and self._jobs_module.startswith(error.name):
                return None
            raise

    # ---------------------------------------------------------------- routing
    def _route(self, path: str) -> tuple[str, str, dict[str, str] | None] | None:
        """path -> (kind, resource, pathParameters)."""
        for candidate in (path, path[len(self.stage) + 1:] if path.startswith(f"/{self.stage}/") else None):
            if candidate is None:
                continue
            if candidate in NODE_ROUTES:
                return "node", candidate, None
            if candidate in CONTROL_ROUTES:
                return "control", candidate, None
            if candidate == "/swagger":
                return "jobs", "/swagger", None
            if candidate in ("/v1/jobs", "/v1/quotas"):
                return "jobs", candidate, None
            if candidate.startswith("/v1/jobs/"):
                return "jobs", "/v1/jobs/{proxy+}", {"proxy": candidate[len("/v1/jobs/"):]}
        return None

    @staticmethod
    def _strip_stage(path: str, stage: str) -> str:
        return path[len(stage) + 1:] if path.startswith(f"/{stage}/") else path

    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes,
               source_ip: str = "127.0.0.1") -> ApiResponse:
        path, _, query = raw_path.partition("?")
        route = self._route(path)
        if route is None or not route_defined(method, self._strip_stage(path, self.stage)):
            return gateway_error("MISSING_AUTHENTICATION_TOKEN")
        kind, resource, path_params = route
        path = self._strip_stage(path, self.stage)
        event = self._event(method, path, resource, path_params, headers, body, query, source_ip)
        with self._lock:
            if kind in AUTHORIZED:
                authorizer, api = AUTHORIZED[kind]
                denied = self._authorize(event, headers, self._handler(authorizer),
                                         _function_name(authorizer))
                if denied is not None:
                    return denied
                return self._invoke(self._handler(api), event, _function_name(api))
            handler = self.jobs_handler()
            if handler is None:
                return _json(404, {"message": "jobs API not available (handlers.jobs_api is missing)"})
            user = headers_lower(headers).get("x-local-user") or DEFAULT_USER_ARN
            if not user.startswith("arn:"):
                user = f"arn:aws:iam::{ACCOUNT_ID}:user/{user}"
            event["requestContext"]["identity"].update(
                userArn=user, user=user.rsplit("/", 1)[-1], accountId=ACCOUNT_ID, caller=user,
                accessKey="ASIALOCALLOCALLOCAL0")
            return self._invoke(handler, event, "jobs-api")

    def _event(self, method: str, path: str, resource: str, path_params: dict[str, str] | None,
               headers: dict[str, str], body: bytes, query: str, source_ip: str) -> dict[str, Any]:
        from urllib.parse import parse_qs

        multi_query = parse_qs(query, keep_blank_values=True) if query else {}
        try:
            text, is_b64 = body.decode("utf-8"), False
        except UnicodeDecodeError:
            text, is_b64 = base64.b64encode(body).decode(), True
        now = time.time()
        request_id = str(uuid.uuid4())
        return {
            "resource": resource,
            "path": path,
            "httpMethod": method,
            "headers": dict(headers),
            "multiValueHeaders": {k: [v] for k, v in headers.items()},
            "queryStringParameters": {k: v[-1] for k, v in multi_query.items()} or None,
            "multiValueQueryStringParameters": multi_query or None,
            "pathParameters": path_params,
            "stageVariables": None,
            "requestContext": {
                "resourceId": "local", "resourcePath": resource, "httpMethod": method,
                "extendedRequestId": request_id, "requestTime": formatdate(now, usegmt=True),
                "path": f"/{self.stage}{path}", "accountId": ACCOUNT_ID, "protocol": "HTTP/1.1",
                "stage": self.stage, "domainPrefix": API_ID, "requestTimeEpoch": int(now * 1000),
                "requestId": request_id, "apiId": API_ID, "domainName": "127.0.0.1",
                "identity": {"sourceIp": source_ip, "userAgent": headers_lower(headers).get("user-agent"),
                             "accessKey": None, "accountId": None, "caller": None, "user": None,
                             "userArn": None, "cognitoIdentityId": None},
                "authorizer": None,
            },
            "body": text if body else None,
            "isBase64Encoded": is_b64,
        }

    def _authorize(self, event: dict[str, Any], headers: dict[str, str], authorizer: Handler,
                   name: str) -> ApiResponse | None:
        """A TOKEN authorizer without cache (both APIs' authorizers share the identity
        validation expression)."""
        token = headers_lower(headers).get("authorization")
        if not token or not re.fullmatch(NODE_TOKEN_HEADER_PATTERN, token):
            # Identity source missing or failing the validation expression: API Gateway
            # answers without invoking the authorizer.
            return gateway_error("UNAUTHORIZED")
        method_arn = (f"arn:aws:execute-api:{REGION}:{ACCOUNT_ID}:{API_ID}/{self.stage}/"
                      f"{event['httpMethod']}{event['path']}")
        auth_event = {"type": "TOKEN", "authorizationToken": token, "methodArn": method_arn}
        try:
            result = authorizer(auth_event, LambdaContext(name, timeout_seconds=API_TIMEOUT_SECONDS))
        except Exception as error:
            if str(error) == "Unauthorized":
                return gateway_error("UNAUTHORIZED")
            return _json(500, {"error": "AUTHORIZER_FAILURE", "message": "authorizer error"})
        statements = (result.get("policyDocument") or {}).get("Statement") or []
        allowed = False
        for statement in statements:
            resources = statement.get("Resource")
            resources = [resources] if isinstance(resources, str) else resources or []
            if any(fnmatch.fnmatchcase(method_arn, r) for r in resources):
                if statement.get("Effect") == "Deny":
                    return gateway_error("ACCESS_DENIED")
                allowed = allowed or statement.get("Effect") == "Allow"
        if not allowed:
            return gateway_error("ACCESS_DENIED")
        event["requestContext"]["authorizer"] = {
            "principalId": result.get("principalId"),
            **{k: str(v) for k, v in (result.get("context") or {}).items()},
        }
        return None

    @staticmethod
    def _invoke(handler: Handler, event: dict[str, Any], name: str) -> ApiResponse:
        try:
            result = handler(event, LambdaContext(name, timeout_seconds=API_TIMEOUT_SECONDS))
        except Exception:
            import logging

            logging.getLogger(__name__).exception("handler %s failed", name)
            return _json(502, {"message": "Internal server error"})
        headers = {k: str(v) for k, v in (result.get("headers") or {}).items()}
        for key, values in (result.get("multiValueHeaders") or {}).items():
            headers[key] = ", ".join(str(v) for v in values)
        raw = result.get("body") or ""
        body = base64.b64decode(raw) if result.get("isBase64Encoded") else str(raw).encode()
        return ApiResponse(int(result.get("statusCode", 200)), headers, body)


class InProcessOpener:
    """``urllib``'s opener interface (``open(request, timeout=)``) over :meth:`LocalApi.handle`:
    the shipped clients and the real handlers, without a socket (the campaigns' and the
    benches' simulated training programs). The URL's host is ignored: any URL is this API."""

    def __init__(self, api: LocalApi) -> None:
        self.api = api

    def open(self, request: Any, timeout: float | None = None) -> Any:
        import io
        import urllib.error
        from email.message import Message
        from urllib.parse import urlsplit

        parts = urlsplit(request.full_url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        data = request.data if isinstance(request.data, bytes) else b""
        response = self.api.handle(request.get_method(), path, dict(request.header_items()), data)
        headers = Message()
        for key, value in response.headers.items():
            headers[key] = value
        if response.status >= 400:
            raise urllib.error.HTTPError(request.full_url, response.status, "error", headers,
                                         io.BytesIO(response.body))
        return _OpenedResponse(response)


class _OpenedResponse:
    def __init__(self, response: ApiResponse) -> None:
        self.status = response.status
        self._body = response.body

    def read(self, limit: int = -1) -> bytes:
        return self._body if limit < 0 else self._body[:limit]

    def __enter__(self) -> _OpenedResponse:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def headers_lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


class LocalApiServer:
    """``ThreadingHTTPServer`` on 127.0.0.1 in front of :class:`LocalApi`."""

    def __init__(self, api: LocalApi | None = None, host: str = "127.0.0.1", port: int = 0,
                 clock: Callable[[], float] | None = None) -> None:
        """``clock``: the time the ``Date`` header tells (default: the wall clock); the
        playground passes its simulated clock, which clients read as the API's time."""
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("the local API only listens on the loopback interface")
        self.api = api or LocalApi()
        api_ref = self.api

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def date_time_string(self, timestamp: float | None = None) -> str:
                if timestamp is None and clock is not None:
                    timestamp = clock()
                return super().date_time_string(timestamp)

            def _drain(self, length: int) -> None:
                """Read and drop an oversized body, so the client (still sending) reads
                our 413 instead of a reset connection."""
                left = min(length, MAX_DRAIN_BYTES)
                self.connection.settimeout(5)
                try:
                    while left > 0:
                        chunk = self.rfile.read(min(left, 1 << 16))
                        if not chunk:
                            break
                        left -= len(chunk)
                except OSError:  # timeouts included
                    pass

            def _serve(self) -> None:
                raw_length = self.headers.get("Content-Length") or "0"
                length = int(raw_length) if raw_length.isdigit() else -1
                if length < 0:
                    response = _json(400, {"error": "BAD_REQUEST", "message": "invalid Content-Length"})
                    self.close_connection = True
                elif length > MAX_REQUEST_BYTES:
                    self._drain(length)
                    response = gateway_error("REQUEST_TOO_LARGE")
                    self.close_connection = True
                else:
                    body = self.rfile.read(length) if length else b""
                    response = api_ref.handle(self.command, self.path, dict(self.headers.items()), body,
                                              self.client_address[0])
                self.send_response(response.status)
                for key, value in response.headers.items():
                    if key.lower() not in ("content-length", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(response.body)))
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(response.body)

            def __getattr__(self, name: str) -> Any:
                # Every method (TRACE, CONNECT, made-up ones) reaches the router, which
                # answers what the stage does not define with 403 as API Gateway does
                # (http.server would answer 501 in HTML).
                if name.startswith("do_"):
                    return self._serve
                raise AttributeError(name)

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.1}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        if isinstance(host, bytes):  # typeshed allows bytes (AF_UNIX); this server is AF_INET
            host = host.decode()
        return f"http://{host}:{port}"

    def start(self) -> LocalApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> LocalApiServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def create_node_token_table(local: Any) -> str:
    """The node-token table in the emulator (``LocalAws`` creates it too: then it is reused)."""
    import os

    from gpu_recovery.constants import DEFAULT_NODE_TOKEN_TABLE_NAME, ENV_NODE_TOKEN_TABLE, table_definitions

    name = os.environ.get(ENV_NODE_TOKEN_TABLE) or DEFAULT_NODE_TOKEN_TABLE_NAME
    ddb = local.client("dynamodb")
    if name not in ddb.list_tables()["TableNames"]:
        ddb.create_table(TableName=name, BillingMode="PAY_PER_REQUEST", **table_definitions()["node_token"])
    os.environ[ENV_NODE_TOKEN_TABLE] = name
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Local REST API (node, jobs and control routes) on 127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--node-id", default="0f1e2d3c4b5a69788796a5b4c3d2e1f0",
                        help="issue (and print) a report token for this node")
    parser.add_argument("--sweep-seconds", type=float, default=60.0,
                        help="run the heartbeat sweep this often (0: never)")
    args = parser.parse_args(argv)

    from gpu_recovery import runtime
    from gpu_recovery.adapters import aws
    from gpu_recovery.heartbeat.tokens import TokenStore
    from handlers import heartbeat_sweep
    from local_mode.emulator import LocalAws

    with LocalAws() as local:
        table = create_node_token_table(local)
        token = TokenStore(aws.resource("dynamodb").Table(table)).issue(args.node_id, issued_by="local")
        stop = threading.Event()

        def sweeper() -> None:
            while not stop.wait(args.sweep_seconds):
                try:
                    # The heartbeat sweep Lambda's body, on the local service.
                    print("sweep:", heartbeat_sweep.handle({}, runtime.heartbeat_service()), flush=True)
                except Exception as error:  # keep serving
                    print("sweep failed:", error, flush=True)

        if args.sweep_seconds > 0:
            threading.Thread(target=sweeper, daemon=True).start()
        with LocalApiServer(port=args.port) as server:
            print(f"local API on {server.url} (stage prefix /{STAGE} optional)", flush=True)
            print(f"node {args.node_id} token: {token}", flush=True)
            print(f"try: GPU_AGENT_API_URL={server.url} GPU_AGENT_TOKEN={token} "
                  f"GPU_AGENT_NODE_ID={args.node_id} python3 agent/gpu_node_agent.py --once", flush=True)
            try:
                while True:  # short sleeps: see Playground.serve_forever
                    time.sleep(0.5)
            except KeyboardInterrupt:
                pass
            finally:
                stop.set()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
