"""Node API (API Gateway REST, Lambda proxy): heartbeats and GPU telemetry of GPU nodes.

Routes (every one behind the node-token Lambda authorizer, which puts the caller's
``node_id`` into ``requestContext.authorizer``):

* ``POST /v1/report_tasks`` -- every task running on the node (``[]`` is valid)
* ``POST /v1/report_gpu``   -- the node's GPU telemetry

Status codes: 200 accepted; 400 malformed (the message says what to fix) or a
timestamp more than ``HEARTBEAT_MAX_SKEW_SECONDS`` off; 403 body ``node_id`` is not the
token's node; 409 replayed report (timestamp not newer than the last accepted one);
413 body over 256 KB, more than 512 tasks or more than 64 GPUs. (401/403 for a
missing, wrong or revoked token come from API Gateway via the authorizer.) Error body:
``{"error": "<code>", "message": "<what to fix>"}``. Nothing is written on any error.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpu_recovery import clock, heartbeat, runtime
from gpu_recovery.domain.heartbeat_policy import HeartbeatSettings, ReportedTask, timestamp_acceptable
from gpu_recovery.tokens import NODE_ID_RE
from handlers._common import powertools

logger, tracer, metrics = powertools("node-api")
app = APIGatewayRestResolver()

MAX_BODY_BYTES = 256 * 1024
MAX_TASKS = 512
MAX_GPUS = 64
MAX_XIDS = 256
NODE_ID_PATTERN = NODE_ID_RE.pattern
TASK_ARN_PATTERN = r"^arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:task/[A-Za-z0-9_/-]{1,1024}$"


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


# ------------------------------------------------------------------------ models
Int64 = Annotated[int, Field(ge=0, le=2**63 - 1)]
Pid = Annotated[int, Field(ge=0, le=2**31 - 1)]
Num = Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)]


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
    node_id: str = Field(..., pattern=NODE_ID_PATTERN)
    timestamp: float = Field(..., allow_inf_nan=False, gt=0)


class ReportTasksIn(_Report):
    tasks: list[TaskIn] = Field(..., max_length=MAX_TASKS)
    # Host boot time (epoch seconds, /proc/stat btime): lets a rebooted node count as
    # back even when its agent-disconnect event was missed.
    boot_time: float | None = Field(None, gt=0, allow_inf_nan=False)


class GpuIn(_Model):
    index: int = Field(..., ge=0, le=1023)
    uuid: str | None = Field(None, max_length=128)
    utilization_gpu: Num | None = None
    memory_used_mib: Num | None = None
    memory_total_mib: Num | None = None
    temperature_c: float | None = Field(None, ge=-100, le=300, allow_inf_nan=False)
    ecc_uncorrected_volatile: Int64 | None = None
    remapped_rows_pending: bool | int | None = None
    remapped_rows_failure: bool | int | None = None
    xids: list[Annotated[int, Field(ge=0, le=100000)]] = Field(default_factory=list, max_length=MAX_XIDS)


class UnmappedXidIn(_Model):
    pci_bus_id: str | None = Field(None, max_length=64)
    xid: int = Field(..., ge=0, le=100000)


class ReportGpuIn(_Report):
    gpus: list[GpuIn] = Field(..., max_length=MAX_GPUS)
    unmapped_xids: list[UnmappedXidIn] = Field(default_factory=list, max_length=MAX_XIDS)
    error: str | None = Field(None, max_length=4000)


# ---------------------------------------------------------------------- helpers
def _error(status: int, code: str, message: str) -> Response:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON,
                    body=json.dumps({"error": code, "message": message}))


@app.exception_handler(ApiError)
def _api_error(error: ApiError) -> Response:
    return _reject(error)


def _reject(error: ApiError) -> Response:
    logger.warning("report rejected", extra={"status": error.status, "error": error.code,
                                             "why": error.message[:500]})
    metrics.add_metric(name=f"Rejected{error.status}", unit="Count", value=1)
    return _error(error.status, error.code, error.message)


@app.exception_handler(heartbeat.ReplayedReport)
def _replayed(error: heartbeat.ReplayedReport) -> Response:
    return _reject(ApiError(409, "replayed_report", str(error)))


def _describe_validation(error: ValidationError) -> str:
    parts = []
    for detail in error.errors()[:10]:
        where = ".".join(str(p) for p in detail.get("loc", ())) or "body"
        parts.append(f"{where}: {detail.get('msg')}")
    more = len(error.errors()) - 10
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _read_body(list_field: str, limit: int) -> dict[str, Any]:
    event = app.current_event
    raw = event.raw_event.get("body") or ""
    try:
        data = (base64.b64decode(raw, validate=True) if event.raw_event.get("isBase64Encoded")
                else raw.encode("utf-8"))
    except (ValueError, UnicodeEncodeError) as exc:
        raise ApiError(400, "malformed_body", f"request body is not valid base64: {exc}") from exc
    if len(data) > MAX_BODY_BYTES:
        raise ApiError(413, "body_too_large",
                       f"request body is {len(data)} bytes; the limit is {MAX_BODY_BYTES} bytes")
    try:
        body = json.loads(data or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "malformed_json", f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "malformed_body", "request body must be a JSON object")
    items = body.get(list_field)
    if isinstance(items, list) and len(items) > limit:
        raise ApiError(413, f"too_many_{list_field}",
                       f"{list_field} lists {len(items)} entries; the limit is {limit} per report")
    return body


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
        raise ApiError(400, "invalid_report", _describe_validation(error)) from error


def _check_common(report: _Report) -> None:
    node_id = _authorized_node()
    if report.node_id != node_id:
        raise ApiError(403, "node_mismatch",
                       f"node_id {report.node_id!r} is not the node this token belongs to; "
                       "send the node's own id or use that node's token")
    settings = HeartbeatSettings.from_env()
    now = clock.now()
    if not math.isfinite(report.timestamp) or not timestamp_acceptable(
        report.timestamp, now, settings.max_skew_seconds
    ):
        raise ApiError(400, "clock_skew",
                       f"timestamp {report.timestamp} is {abs(now - report.timestamp):.0f} s away from "
                       f"the server's time {now:.0f}; the limit is {settings.max_skew_seconds} s "
                       "(synchronise the node's clock, e.g. chrony)")


# ----------------------------------------------------------------------- routes
@app.post("/v1/report_tasks")
@tracer.capture_method
def report_tasks() -> dict[str, Any]:
    report: ReportTasksIn = _validate(ReportTasksIn, _read_body("tasks", MAX_TASKS))
    _check_common(report)
    tasks = [ReportedTask(t.task_arn, t.running_log_id, t.remote_pid, t.remote_pgid, t.step)
             for t in report.tasks]
    result = heartbeat.service(runtime.PowertoolsMetrics(metrics)).report_tasks(
        report.node_id, report.timestamp, tasks, boot_time=report.boot_time)
    logger.info("tasks reported", extra=result.as_dict())
    return {"accepted": True, "server_time": clock.now(), **result.as_dict()}


@app.post("/v1/report_gpu")
@tracer.capture_method
def report_gpu() -> dict[str, Any]:
    report: ReportGpuIn = _validate(ReportGpuIn, _read_body("gpus", MAX_GPUS))
    _check_common(report)
    result = heartbeat.service(runtime.PowertoolsMetrics(metrics)).report_gpu(
        report.node_id, report.timestamp,
        [g.model_dump() for g in report.gpus],
        [x.model_dump() for x in report.unmapped_xids], report.error,
    )
    logger.info("gpus reported", extra=result.as_dict())
    return {"accepted": True, "server_time": clock.now(), **result.as_dict()}


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)
