"""Job-control API (API Gateway REST, TOKEN authorizer): what training code calls through
``gpu_recovery_client`` (``training_client/``), authenticated by its rank's control token.

    GET  /v1/control?attempt=N   200 what this rank should do: ``suspend`` is true for rank 0
                                 while its job is SUSPENDING (checkpoint now, then go_suspend())
    POST /v1/control/suspend     200 go_suspend(): the job is suspended at once (every rank
                                 stopped; SUSPENDED once all stopped)
    POST /v1/control/checkpoint?attempt=N&step=S
                                 200 checkpoint_saved(step): rank 0 saved a checkpoint (the
                                 job's goodput ledger measures a fault's lost work from it)
    GET  /v1/control/preflight?attempt=N
                                 200 this rank's step in the attempt's gang preflight: skip it,
                                 run these all-reduces, wait, train, or stop (docs/preflight.md)
    POST /v1/control/preflight?attempt=N
                                 200 an all-reduce's output (all_reduce_perf's table), judged;
                                 the answer is the rank's next step

The authorizer puts ``job_id`` and ``rank`` into ``requestContext.authorizer``; the routes
take no job id from the caller. Errors: ``{"error", "message", "field"}``: 400 (a bad
``attempt``, a malformed report), 401/403 (API Gateway: token missing or refused), 404 (job
gone), 409 (the job cannot be suspended now, the caller's attempt is over, or it reports a
test it does not lead), 413 (a body over 16 KiB), 429 (API Gateway).
``python -m handlers.job_control_api --openapi`` prints the OpenAPI document (committed as
``docs/control-api.openapi.json``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, Field

from gpu_recovery import runtime
from gpu_recovery.queue.control import ControlError
from handlers._common import powertools
from handlers._http import BodyError, guarded_body
from handlers._openapi import (
    as_answered,
    authorization_header_scheme,
    error_doc,
    print_document,
)

logger, tracer, metrics = powertools("job-control-api")
app = APIGatewayRestResolver(enable_validation=True)
MAX_BODY_BYTES = 16 * 1024
MAX_OUTPUT_CHARS = 12_000  # the client sends the table, not NCCL's chatter (a few KiB)
PREFLIGHT_PATH = "/v1/control/preflight"
OPENAPI_INFO: dict[str, Any] = {
    "title": "GPU training job-control API",
    "version": "1.0.0",
    "description": "What training code calls (gpu_recovery_client): the suspend channel of a queue job.",
    "security_schemes": {"controlToken": authorization_header_scheme(
        "Bearer <the rank's GPU_RECOVERY_CONTROL_TOKEN> (API Gateway TOKEN authorizer)")},
    "security": [{"controlToken": []}],
}


class ControlStatus(BaseModel):
    job_id: str
    rank: int
    attempt: int = Field(description="The job's current attempt")
    state: str
    suspend: bool = Field(description="True for rank 0 while the job is SUSPENDING: checkpoint, then "
                                      "go_suspend()")
    deadline_at: float | None = Field(default=None, description="Ranks are stopped by force after this")
    grace_seconds: int | None = None
    reason: str = ""
    poll_seconds: int = Field(description="Ask at most this often")


class CheckpointAck(BaseModel):
    job_id: str
    attempt: int
    step: int
    recorded: bool = Field(description="False: not kept (the job is not running, or a later step is)")


class PreflightTest(BaseModel):
    id: str = Field(description="loopback, gang, or t<n> (a group of the pinning search)")
    kind: str = Field(description="loopback: this node's GPUs only; group: an all-reduce over `nodes` nodes")
    nodes: int
    group_rank: int = Field(description="This rank's place in the group (torchrun's --node-rank)")
    group_size: int
    leader: int = Field(description="The group's first rank: it hosts the rendezvous and reports")
    members: list[list[int]] = Field(default_factory=list,
                                     description="The group's ranks, as [first, last + 1) spans")
    master_addr: str = Field(description="The leader's address (empty: this job's MASTER_ADDR)")
    port_offset: int = Field(description="Rendezvous port: MASTER_PORT + this")
    report: bool = Field(description="This rank posts the result")
    min_bytes: int
    max_bytes: int
    timeout_seconds: float = Field(description="Give up (and report a failure) after this long")


class PreflightStep(BaseModel):
    job_id: str
    rank: int
    attempt: int
    action: str = Field(description="skip | run | wait | train | stop")
    status: str = Field(default="", description="running, passed, pinned, inconclusive, abandoned, skipped")
    round: int = 0
    reason: str = ""
    tests: list[PreflightTest] = Field(default_factory=list)
    poll_seconds: int = 2
    accepted: bool | None = Field(default=None, description="(a report) it counted")
    why: str | None = None
    verdict: dict[str, Any] | None = Field(default=None,
                                           description="(a report) passed, slow, failed, with busbw")


class PreflightReport(BaseModel):
    model_config = {"extra": "forbid"}

    round: int = Field(ge=1, le=64)
    test_id: str = Field(pattern=r"^(loopback|gang|t[0-9]{1,3})$")
    exit_code: int | None = Field(default=None, ge=-255, le=255)
    seconds: float | None = Field(default=None, ge=0, le=86_400)
    output: str = Field(max_length=MAX_OUTPUT_CHARS, description="What the all-reduce printed: its table")
    address: str = Field(default="", max_length=64, pattern=r"^[A-Za-z0-9.:_-]*$",
                         description="Where this rank's group peers reach it (its node's address)")


class SuspendAck(BaseModel):
    job_id: str
    rank: int
    state: str = Field(description="SUSPENDING (ranks being stopped) or SUSPENDED")
    stopping_ranks: list[int]


_ERRORS: dict[int, OpenAPIResponse] = {
    400: error_doc("Invalid request; `field` names the offending field"),
    401: error_doc("No Authorization header, or not a control token (API Gateway)"),
    403: error_doc("The control token was refused (API Gateway)"),
    404: error_doc("The job no longer exists"),
    413: error_doc("Body over 16 KiB (only the preflight report has one)"),
    429: error_doc("Throttled by the API stage (API Gateway)"),
}


def _json(status: int, body: Any) -> Response:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=json.dumps(body))


@app.exception_handler(ControlError)
def _control_error(error: ControlError) -> Response:
    return _json(error.status, {"error": error.code, "message": error.message})


@app.exception_handler(RequestValidationError)
def _invalid(error: RequestValidationError) -> Response:
    errors = list(error.errors())
    loc = [str(p) for p in (errors[0].get("loc", ()) if errors else ())][1:] or ["query"]
    field = ".".join(loc)
    message = str(errors[0].get("msg", "is invalid")) if errors else "is invalid"
    return _json(400, {"error": "validation_error", "message": f"{field}: {message}", "field": field})


@app.not_found
def _not_found(error: Exception) -> Response:
    return _json(404, {"error": "not_found",
                       "message": f"no route {app.current_event.http_method} {app.current_event.path}"})


def _caller() -> tuple[str, int]:
    authorizer = (app.current_event.raw_event.get("requestContext") or {}).get("authorizer") or {}
    job_id, rank = authorizer.get("job_id"), str(authorizer.get("rank", ""))
    if not job_id or not rank.isdigit():
        # API Gateway never invokes us without the authorizer; refuse rather than guess.
        raise ControlError(401, "unauthenticated", "no authenticated job rank in the request context")
    return str(job_id), int(rank)


@app.get("/v1/control", summary="What this rank should do now", tags=["control"],
         responses={200: {"description": "Status", "content": {"application/json": {"model": ControlStatus}}},
                    **_ERRORS})
def control_status(
    attempt: Annotated[int | None, Query(ge=1, le=100_000, description="The rank's ATTEMPT")] = None,
) -> ControlStatus:
    job_id, rank = _caller()
    status = runtime.job_control_service().status(job_id, rank, attempt)
    if status["suspend"]:
        metrics.add_metric(name="SuspendCommandsDelivered", unit="Count", value=1)
    return ControlStatus.model_validate(status)


@app.post("/v1/control/suspend", summary="go_suspend(): suspend the job now", tags=["control"],
          responses={200: {"description": "Suspending",
                           "content": {"application/json": {"model": SuspendAck}}},
                     **_ERRORS,
                     409: error_doc("Not being suspended once the call is done (the job was not RUNNING or "
                                    "SUSPENDING, or left them meanwhile), or the caller's attempt is over")})
def go_suspend(
    attempt: Annotated[int | None, Query(ge=1, le=100_000, description="The rank's ATTEMPT")] = None,
) -> SuspendAck:
    job_id, rank = _caller()
    result = runtime.job_control_service(runtime.PowertoolsMetrics(metrics)).go_suspend(job_id, rank, attempt)
    metrics.add_metric(name="GoSuspendCalls", unit="Count", value=1)
    return SuspendAck.model_validate(result)


@app.post("/v1/control/checkpoint", summary="checkpoint_saved(): rank 0 saved a checkpoint", tags=["control"],
          responses={200: {"description": "Recorded (or not, see `recorded`)",
                           "content": {"application/json": {"model": CheckpointAck}}},
                     **_ERRORS,
                     409: error_doc("Not rank 0, or the caller's attempt is over")})
def checkpoint_saved(
    attempt: Annotated[int, Query(ge=1, le=100_000, description="The rank's ATTEMPT")],
    step: Annotated[int, Query(ge=0, le=10**15, description="The training step the checkpoint holds")],
) -> CheckpointAck:
    job_id, rank = _caller()
    result = runtime.job_control_service().checkpoint_saved(job_id, rank, attempt, step)
    metrics.add_metric(name="CheckpointsReported", unit="Count", value=1)
    return CheckpointAck.model_validate(result)


@app.get(PREFLIGHT_PATH, summary="This rank's step in the gang preflight", tags=["preflight"],
         responses={200: {"description": "The step",
                          "content": {"application/json": {"model": PreflightStep}}}, **_ERRORS})
def preflight_step(
    attempt: Annotated[int, Query(ge=1, le=100_000, description="The rank's ATTEMPT")],
) -> PreflightStep:
    job_id, rank = _caller()
    service = runtime.job_control_service(runtime.PowertoolsMetrics(metrics))  # a step may start a preflight
    step = service.preflight_step(job_id, rank, attempt)
    return PreflightStep.model_validate(step)


@app.post(PREFLIGHT_PATH, summary="Report an all-reduce of the gang preflight", tags=["preflight"],
          responses={200: {"description": "Judged; the rank's next step",
                           "content": {"application/json": {"model": PreflightStep}}},
                     **_ERRORS,
                     409: error_doc("No preflight for this attempt, or a test this rank does not lead"),
                     415: error_doc("Content-Type is not application/json")})
def preflight_report(
    report: PreflightReport,
    attempt: Annotated[int, Query(ge=1, le=100_000, description="The rank's ATTEMPT")],
) -> PreflightStep:
    job_id, rank = _caller()
    answer = runtime.job_control_service(runtime.PowertoolsMetrics(metrics)).preflight_report(
        job_id, rank, attempt, round_=report.round, test_id=report.test_id, exit_code=report.exit_code,
        output=report.output, seconds=report.seconds, address=report.address)
    metrics.add_metric(name="PreflightReports", unit="Count", value=1)
    return PreflightStep.model_validate(answer)


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    report = event.get("httpMethod") == "POST" and str(event.get("path") or "").endswith(PREFLIGHT_PATH)
    try:
        # The report is the one route with a body (JSON); size and encoding: a 4xx, never a 5xx.
        text = guarded_body(event, MAX_BODY_BYTES, json_route=report)
    except BodyError as error:
        return {"statusCode": error.status, "headers": {"Content-Type": content_types.APPLICATION_JSON},
                "body": json.dumps(error.body()), "isBase64Encoded": False}
    if report:
        return app.resolve({**event, "body": text or None, "isBase64Encoded": False}, context)
    # The other routes read no body: drop it, so nothing a client sends can fail parsing.
    return app.resolve({**event, "body": None, "isBase64Encoded": False}, context)


# ---------------------------------------------------------------------------- OpenAPI
def openapi_document() -> dict[str, Any]:
    return as_answered(app.get_openapi_json_schema(**OPENAPI_INFO))


def main(argv: list[str] | None = None) -> int:
    return print_document("job_control_api", "docs/control-api.openapi.json", openapi_document, argv)


if __name__ == "__main__":
    raise SystemExit(main())
