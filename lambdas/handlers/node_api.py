"""Node API (API Gateway REST, Lambda proxy): heartbeats and GPU telemetry of GPU nodes.

Routes (every one behind the node-token Lambda authorizer, which puts the caller's
``node_id`` into ``requestContext.authorizer``):

* ``POST /v1/report_tasks`` -- every task running on the node (``[]`` is valid)
* ``POST /v1/report_gpu``   -- the node's GPU telemetry

Status codes: 200 accepted; 400 malformed (the message says what to fix: not UTF-8,
not JSON, nested deeper than 32 levels, a field out of its documented bounds) or a
timestamp more than ``HEARTBEAT_MAX_SKEW_SECONDS`` off; 403 body ``node_id`` is not the
token's node; 409 a repeat of the node's last accepted report (same ``timestamp``);
413 body over 256 KB, more than 512 tasks or more than 64 GPUs. (401/403 for a
missing, wrong or revoked token and 429 come from API Gateway.) Error body:
``{"error": "<code>", "message": "<what to fix>", "field": "<field>"}``. Nothing is
written on any error. Reports are ordered by the server's receive time: a node clock
that steps back within the allowed skew is accepted. ``python -m handlers.node_api
--openapi`` prints the routes' OpenAPI document (committed as ``docs/node-api.openapi.json``).
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gpu_recovery import clock, runtime
from gpu_recovery.domain.heartbeat_policy import ReportedTask, timestamp_acceptable
from gpu_recovery.heartbeat.ports import MetricsPort
from gpu_recovery.heartbeat.results import GpuResult, ReplayedReport
from gpu_recovery.heartbeat.service import HeartbeatService
from gpu_recovery.heartbeat.tokens import NODE_ID_RE
from handlers._common import powertools
from handlers._http import BodyError, body_text, parse_json
from handlers._openapi import print_document

logger, tracer, metrics = powertools("node-api")
app = APIGatewayRestResolver()

MAX_BODY_BYTES = 256 * 1024
MAX_TASKS = 512
MAX_GPUS = 64
MAX_XIDS = 256
NODE_ID_PATTERN = NODE_ID_RE.pattern
TASK_ARN_PATTERN = r"^arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:task/[A-Za-z0-9_/-]{1,1024}$"


# Epoch seconds accepted for a node's boot time: 2001-09-09 .. 2100-01-01.
MIN_EPOCH = 1_000_000_000
MAX_EPOCH = 4_102_444_800


def service(metrics: MetricsPort | None = None) -> HeartbeatService:
    """The heartbeat service behind these routes (``runtime`` builds it; local mode's
    simulated node agents report through it too)."""
    return runtime.heartbeat_service(metrics)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field


# ------------------------------------------------------------------------ models
def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be a number, not true/false")
    return value


NotBool = BeforeValidator(_not_bool)
# Every number has bounds (DynamoDB stores 38 significant digits, 1e-130..1e126).
Int64 = Annotated[int, NotBool, Field(ge=0, le=2**63 - 1)]
Pid = Annotated[int, NotBool, Field(ge=0, le=2**31 - 1)]
Num = Annotated[float, NotBool, Field(ge=0, le=1e12, allow_inf_nan=False)]
Count = Annotated[int, NotBool, Field(ge=0, le=2**31 - 1)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)


class TaskIn(_Model):
    task_arn: str | None = Field(None, max_length=1600, pattern=TASK_ARN_PATTERN)
    running_log_id: str | None = Field(None, min_length=1, max_length=128)
    remote_pid: Pid | None = None
    remote_pgid: Pid | None = None
    step: Int64 | None = None

    @field_validator("running_log_id", mode="before")
    @classmethod
    def _log_id_text(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value

    @model_validator(mode="after")
    def _identified(self) -> TaskIn:
        if not self.task_arn and not self.running_log_id:
            raise ValueError("each task needs a task_arn or a running_log_id")
        return self


class _Report(_Model):
    node_id: str = Field(..., pattern=NODE_ID_PATTERN, description="The token's node")
    timestamp: Annotated[float, NotBool] = Field(
        ..., allow_inf_nan=False, gt=0, le=MAX_EPOCH,
        description="Send time (epoch seconds), within the allowed skew of the server's clock")


class ReportTasksIn(_Report):
    tasks: list[TaskIn] = Field(..., max_length=MAX_TASKS)
    # Host boot time (epoch seconds, /proc/stat btime): lets a rebooted node count as
    # back even when its agent-disconnect event was missed.
    boot_time: Annotated[float, NotBool] | None = Field(None, ge=MIN_EPOCH, le=MAX_EPOCH,
                                                        allow_inf_nan=False)


RecoveryAction = Literal["none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset", "unknown"]


class GpuIn(_Model):
    index: Annotated[int, NotBool] = Field(..., ge=0, le=1023)
    uuid: str | None = Field(None, max_length=128)
    utilization_gpu: Num | None = None
    memory_used_mib: Num | None = None
    memory_total_mib: Num | None = None
    temperature_c: Annotated[float, NotBool] | None = Field(None, ge=-100, le=300, allow_inf_nan=False)
    ecc_uncorrected_volatile: Int64 | None = None
    ecc_corrected_volatile: Int64 | None = None
    remapped_rows_pending: bool | Count | None = None
    remapped_rows_failure: bool | Count | None = None
    # The driver's recovery action (nvidia-smi gpu_recovery_action, as the health check names
    # it); null when the driver does not say (before R565).
    recovery_action: RecoveryAction | None = Field(
        None, description="none | gpu_reset | node_reboot | drain_p2p | drain_and_reset | unknown")
    nvlink_crc_errors: Int64 | None = None
    nvlink_replay_errors: Int64 | None = None
    nvlink_recovery_errors: Int64 | None = None
    xids: list[Annotated[int, NotBool, Field(ge=0, le=100000)]] = Field(default_factory=list,
                                                                        max_length=MAX_XIDS)


class UnmappedXidIn(_Model):
    pci_bus_id: str | None = Field(None, max_length=64)
    xid: Annotated[int, NotBool] = Field(..., ge=0, le=100000)


class ReportGpuIn(_Report):
    gpus: list[GpuIn] = Field(..., max_length=MAX_GPUS)
    unmapped_xids: list[UnmappedXidIn] = Field(default_factory=list, max_length=MAX_XIDS)
    error: str | None = Field(None, max_length=4000)


class TasksAccepted(BaseModel):
    accepted: bool
    server_time: float
    node_id: str
    refreshed: int = Field(description="Watched ranks whose heartbeat this report refreshed")
    unknown: list[str] = Field(description="Reported tasks this system does not track")
    ignored: dict[str, str] = Field(description="Task -> why its rank was not refreshed")
    revived: list[str]
    hung: list[str]
    unhung: list[str]


class GpusAccepted(BaseModel):
    accepted: bool
    server_time: float
    node_id: str
    gpus: int
    signals: list[str] = Field(description="Hardware signals in this report (kind:GPU)")
    new_signals: list[str] = Field(description="Signals not known for this node before")
    suspect: bool = Field(description="This report flagged the node SUSPECT")
    notified: bool = Field(description="Operators were e-mailed about new signals")
    suppressed: list[str] = Field(description="New signals not e-mailed (rate limit per kind)")
    warning: str = Field("", description="The driver warning this report raised, acted on by the "
                                         "recovery loop (the catalog rule; empty: none)")


class NodeError(BaseModel):
    error: str
    message: str = Field(description="What to fix")
    field: str | None = Field(default=None, description="The offending field, when one is")


# ---------------------------------------------------------------------- helpers
def _error(status: int, code: str, message: str, field: str | None = None) -> Response:
    body: dict[str, Any] = {"error": code, "message": message}
    if field:
        body["field"] = field
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON,
                    body=json.dumps(body))


@app.exception_handler(ApiError)
def _api_error(error: ApiError) -> Response:
    return _reject(error)


def _reject(error: ApiError) -> Response:
    logger.warning("report rejected", extra={"status": error.status, "error": error.code,
                                             "why": error.message[:500]})
    metrics.add_metric(name=f"Rejected{error.status}", unit="Count", value=1)
    return _error(error.status, error.code, error.message, error.field)


@app.exception_handler(BodyError)
def _body_error(error: BodyError) -> Response:
    return _reject(ApiError(error.status, error.code, error.message, error.field))


@app.exception_handler(ReplayedReport)
def _replayed(error: ReplayedReport) -> Response:
    return _reject(ApiError(409, "replayed_report", str(error)))


_UNION_TAGS = ("bool", "int", "float", "str")


def _where(detail: Any) -> str:
    """The field path of a pydantic error, without union-member tags ("bool", "int")."""
    return ".".join(str(p) for p in detail.get("loc", ()) if str(p) not in _UNION_TAGS
                    and not str(p).startswith(("function-", "constrained-"))) or "body"


def _describe_validation(error: ValidationError) -> tuple[str, str]:
    """(message, first offending field)."""
    details = error.errors()
    parts = [f"{_where(d)}: {d.get('msg')}" for d in details[:10]]
    more = len(details) - 10
    return ("; ".join(parts) + (f"; and {more} more" if more > 0 else ""),
            _where(details[0]) if details else "body")


def _read_body() -> dict[str, Any]:
    text = body_text(app.current_event.raw_event, MAX_BODY_BYTES)
    body = parse_json(text) if text.strip() else None
    if not isinstance(body, dict):
        raise ApiError(400, "malformed_body", "request body must be a JSON object")
    return body


def _parse(model: type[BaseModel], body: dict[str, Any], list_field: str, limit: int) -> Any:
    """The report in ``body``: its list within ``limit`` (413), then the parser model (400)."""
    items = body.get(list_field)
    if isinstance(items, list) and len(items) > limit:
        raise ApiError(413, f"too_many_{list_field}",
                       f"{list_field} lists {len(items)} entries; the limit is {limit} per report",
                       list_field)
    return _validate(model, body)


def _authorized_node() -> str:
    authorizer = (app.current_event.raw_event.get("requestContext") or {}).get("authorizer") or {}
    node_id = authorizer.get("node_id") or authorizer.get("principalId")
    if not node_id:
        # API Gateway never invokes us without the authorizer; refuse rather than guess.
        raise ApiError(401, "unauthenticated", "no authenticated node in the request context")
    return str(node_id)


def _validate(model: type[BaseModel], body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as error:
        message, field = _describe_validation(error)
        raise ApiError(400, "invalid_report", message, field) from error


def _check_common(report: _Report, node_id: str, heartbeats: HeartbeatService) -> None:
    """The report is the token's node's (``node_id``) and its clock is within the skew."""
    if report.node_id != node_id:
        raise ApiError(403, "node_mismatch",
                       f"node_id {report.node_id!r} is not the node this token belongs to; "
                       "send the node's own id or use that node's token", "node_id")
    # The heartbeat service's settings, validated once when runtime.py built it.
    settings = heartbeats.settings
    now = clock.now()
    if not math.isfinite(report.timestamp) or not timestamp_acceptable(
        report.timestamp, now, settings.max_skew_seconds
    ):
        raise ApiError(400, "clock_skew",
                       f"timestamp {report.timestamp} is {abs(now - report.timestamp):.0f} s away from "
                       f"the server's time {now:.0f}; the limit is {settings.max_skew_seconds} s "
                       "(synchronise the node's clock, e.g. chrony)", "timestamp")


# ----------------------------------------------------------------------- routes
@app.post("/v1/report_tasks")
@tracer.capture_method
def report_tasks() -> dict[str, Any]:
    report: ReportTasksIn = _parse(ReportTasksIn, _read_body(), "tasks", MAX_TASKS)
    heartbeats = service(runtime.PowertoolsMetrics(metrics))
    _check_common(report, _authorized_node(), heartbeats)
    tasks = [ReportedTask(t.task_arn, t.running_log_id, t.remote_pid, t.remote_pgid, t.step)
             for t in report.tasks]
    result = heartbeats.report_tasks(report.node_id, report.timestamp, tasks, boot_time=report.boot_time)
    logger.info("tasks reported", extra=result.as_dict())
    return {"accepted": True, "server_time": clock.now(), **result.as_dict()}


@app.post("/v1/report_gpu")
@tracer.capture_method
def report_gpu() -> dict[str, Any]:
    body = _read_body()
    result = accept_gpu_report(body, _authorized_node(), service(runtime.PowertoolsMetrics(metrics)))
    logger.info("gpus reported", extra=result.as_dict())
    return {"accepted": True, "server_time": clock.now(), **result.as_dict()}


def accept_gpu_report(body: dict[str, Any], node_id: str, heartbeats: HeartbeatService) -> GpuResult:
    """A ``POST /v1/report_gpu`` body from the token's node ``node_id``, checked as the route
    checks it (the parser model, the node, the clock skew; ``ApiError`` says what to fix),
    into the heartbeat service. Local mode's simulated node agents report through here too."""
    report: ReportGpuIn = _parse(ReportGpuIn, body, "gpus", MAX_GPUS)
    _check_common(report, node_id, heartbeats)
    return heartbeats.report_gpu(
        report.node_id, report.timestamp,
        [g.model_dump() for g in report.gpus],
        [x.model_dump() for x in report.unmapped_xids], report.error,
    )


@app.not_found
def _no_route(error: Exception) -> Response:
    return _error(404, "not_found", f"no route {app.current_event.http_method} {app.current_event.path}")


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)


# ---------------------------------------------------------------------- OpenAPI
_ERROR_CODES = {
    400: "Malformed or out-of-bounds report (not UTF-8, not JSON, nested deeper than 32 levels, "
         "a field outside its bounds) or a timestamp outside the allowed clock skew",
    401: "Missing, malformed, unknown or revoked node token (API Gateway, token authorizer)",
    403: "Wrong token secret (authorizer Deny), or the body's node_id is not the token's node",
    409: "A repeat of the node's last accepted report (same timestamp)",
    413: "Body over 256 KB, more than 512 tasks or more than 64 GPUs",
    429: "Throttled by the API stage (API Gateway)",
}


def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.1 description of the node routes, from the same models the handler uses."""
    schemas: dict[str, Any] = {}

    def ref(model: type[BaseModel], mode: str) -> dict[str, str]:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}", mode=mode)  # type: ignore[arg-type]
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
        return {"$ref": f"#/components/schemas/{model.__name__}"}

    def operation(summary: str, request: type[BaseModel], response: type[BaseModel]) -> dict[str, Any]:
        errors = {str(code): {"description": text, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/NodeError"}}}} for code, text in _ERROR_CODES.items()}
        return {
            "summary": summary,
            "security": [{"nodeToken": []}],
            "requestBody": {"required": True,
                            "content": {"application/json": {"schema": ref(request, "validation")}}},
            "responses": {"200": {"description": "Accepted", "content": {"application/json": {
                "schema": ref(response, "serialization")}}}, **errors},
        }

    paths = {
        "/v1/report_tasks": {"post": operation("Heartbeat: every task running on the node",
                                               ReportTasksIn, TasksAccepted)},
        "/v1/report_gpu": {"post": operation("GPU telemetry of the node", ReportGpuIn, GpusAccepted)},
    }
    ref(NodeError, "serialization")
    return {
        "openapi": "3.1.0",
        "info": {"title": "GPU node API", "version": "1.0.0",
                 "description": "Heartbeats and GPU telemetry of GPU nodes (node agent)."},
        "paths": paths,
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "securitySchemes": {"nodeToken": {
                "type": "apiKey", "in": "header", "name": "Authorization",
                "description": "Bearer <node_id>.<secret> (gpu-recovery-admin issue-token)"}},
        },
    }


def main(argv: list[str] | None = None) -> int:
    return print_document("node_api", "docs/node-api.openapi.json", openapi_document, argv)


if __name__ == "__main__":
    raise SystemExit(main())
