"""Response bodies of the jobs API (they document the OpenAPI schema and shape the JSON)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ErrorBody(BaseModel):
    error: str = Field(description="validation_error | not_found | conflict | payload_too_large | ...")
    message: str = Field(description="Human-readable; for 400 it starts with '<field>: '")
    field: str | None = Field(default=None, description="The offending field (400 only)")


class JobSummary(BaseModel):
    job_id: str
    name: str
    user: str
    state: str
    priority: int
    priority_name: str
    nnodes: int
    gpus_per_node: int
    attempt: int = Field(description="0 until the scheduler first starts the job")
    submitted_at: float = Field(description="Epoch seconds")
    updated_at: float = Field(description="Epoch seconds")


class RankView(BaseModel):
    rank: int
    attempt: int
    state: str
    task_arn: str
    container_instance_id: str
    ec2_instance_id: str
    last_heartbeat_at: float | None = None
    exit_code: int | None = None
    stop_reason: str = ""


class AttemptView(BaseModel):
    attempt: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    outcome: str = ""
    failure_kind: str = ""
    reason: str = ""


class JobDetail(JobSummary):
    spec: dict[str, Any]
    source: str
    recoveries_used: int = Field(description="Infrastructure recoveries used")
    max_recovery_attempts: int = Field(description="Infrastructure recoveries allowed")
    app_restarts_used: int = 0
    max_app_restarts: int = 0
    relocations: list[dict[str, Any]] = Field(
        default_factory=list, description="Where each rank moved after a node fault, and why")
    not_before: float = Field(description="Scheduler backoff: not started before (epoch seconds)")
    last_error: str
    ranks: list[RankView]
    attempts: list[AttemptView]


class JobList(BaseModel):
    jobs: list[JobSummary]
    next_token: str | None = Field(description="Pass back as next_token for the next page; null: last page")


class CancelResult(BaseModel):
    job_id: str
    state: str = Field(description="CANCELED, CANCELING (ranks stopping) or the terminal state it had")
    previous_state: str
    changed: bool = Field(description="False when the job was already terminal or CANCELING")
    stopping_ranks: list[int] = Field(description="Ranks asked to stop (StopTask) by this call")


class JobEvent(BaseModel):
    at: float
    from_: str = Field(alias="from", serialization_alias="from")
    to: str
    reason: str
    actor: str

    model_config = {"populate_by_name": True}


class JobEvents(BaseModel):
    job_id: str
    state: str
    events: list[JobEvent]


class LogEvent(BaseModel):
    timestamp: int | None = None
    message: str


class JobLogs(BaseModel):
    job_id: str
    rank: int
    attempt: int
    task_arn: str
    log_group: str
    log_stream: str
    events: list[LogEvent]
    next_token: str | None = Field(
        description="CloudWatch Logs forward token: pass it back to read on (also when following)"
    )
    end_of_stream: bool = Field(description="True when no newer events exist right now")
