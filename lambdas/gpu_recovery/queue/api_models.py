"""Response bodies of the jobs API (they document the OpenAPI schema and shape the JSON)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class GoodputView(BaseModel):
    wall_seconds: float = Field(default=0.0, description="Since the job first started (to its end or now)")
    seconds: dict[str, float] = Field(default_factory=dict, description="Seconds per cause (docs/goodput.md)")
    ettr: float | None = Field(default=None, description="productive / (wall - the job's own time)")
    stack_share_seconds: float = Field(default=0.0, description="The stack's own badput: all but lost work "
                                                                "and repair")
    own_seconds: float = Field(default=0.0, description="Suspended, preempted, queued, application errors")
    faults: int = 0
    lost_work_unknown_faults: int = Field(default=0, description="Faults with no checkpoint reported")
    lost_work: float | str = Field(default=0.0, description="Seconds, or unknown (no checkpoint)")
    top_nodes: list[dict[str, Any]] = Field(default_factory=list, description="The nodes that cost the most")
    top_rules: list[dict[str, Any]] = Field(default_factory=list, description="The rules that cost the most")
    checkpoint: dict[str, Any] | None = Field(default=None, description="The last checkpoint rank 0 reported")


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
    goodput: GoodputView = Field(default_factory=GoodputView,
                                 description="The job's goodput ledger: productive time and badput by cause")


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


class SuspendView(BaseModel):
    kind: str = Field(description="preempted (by a higher-priority job), user, self (go_suspend()), or moved "
                                  "(off a node with a driver warning, at the job's checkpoint)")
    reason: str = ""
    requested_at: float | None = None
    deadline_at: float | None = Field(default=None, description="Ranks are stopped by force after this")
    grace_seconds: int | None = None
    hold: bool = False
    by_job: str = ""
    by_user: str = ""
    stop_requested_at: float | None = None
    stop_reason: str = ""
    avoid: dict[str, Any] | None = Field(
        default=None, description="moved: the node and its driver warning (rule, action, confidence, reason)")


class PreflightView(BaseModel):
    mode: str = Field(default="auto", description="The job's choice: auto, restarts, always, off")
    attempt: int | None = Field(default=None, description="The attempt whose preflight is shown")
    status: str = Field(default="", description="running, passed, pinned, inconclusive, abandoned")
    round: int = 0
    verdict: str = ""
    summary: list[str] = Field(default_factory=list, description="One line per round, newest last")
    pinned: list[dict[str, Any]] = Field(default_factory=list, description="Nodes pinned, and why")


class JobDetail(JobSummary):
    spec: dict[str, Any]
    source: str
    recoveries_used: int = Field(description="Infrastructure recoveries used")
    max_recovery_attempts: int = Field(description="Infrastructure recoveries allowed")
    app_restarts_used: int = 0
    max_app_restarts: int = 0
    relocations: list[dict[str, Any]] = Field(
        default_factory=list, description="Where each rank moved after a node fault, and why")
    moves: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Moves off nodes with a driver warning: the node, the warning, outcome moved (at its "
                    "checkpoint) or declined (no checkpoint in time)")
    breaker_hold: dict[str, Any] | None = Field(
        default=None, description="HELD: the nodes whose reboot the breaker held back, since, until")
    not_before: float = Field(description="Scheduler backoff: not started before (epoch seconds)")
    last_error: str
    wait_reason: str = Field(default="", description="Why a waiting job is not starting yet (quota, GPUs)")
    quota_user: str = Field(default="", description="The user whose node quota the job counts against")
    priority_requested: str = Field(default="", description="AUTO when the priority was chosen at submit")
    demoted_from: int | None = Field(default=None, description="ABOVE_NORMAL demoted to NORMAL after 30 min")
    suspend_grace_seconds: int = Field(default=60, description="Seconds rank 0 has to checkpoint")
    suspend: SuspendView | None = Field(default=None, description="The last (or current) suspension")
    preflight: PreflightView = Field(default_factory=PreflightView,
                                     description="The gang preflight: the job's choice, the attempt's run")
    held: bool = Field(default=False, description="SUSPENDED and held until resumed (a user's suspend)")
    suspend_count: int = 0
    resume_count: int = Field(default=0, description="Times resumed (the RESUME_COUNT its ranks get)")
    ranks: list[RankView] = Field(
        description="A page of the job's ranks (ranks_from, ranks_limit: 100 by default)")
    ranks_next: int | None = Field(
        default=None, description="The first rank of the next page (pass as ranks_from); null: no more")
    ranks_live: int | None = Field(
        default=None,
        description="When the page is not every rank: the attempt's ranks started and not ended")
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
    end_of_stream: bool = Field(description="True when no newer events exist right now (CloudWatch Logs gave "
                                            "the token back unchanged; a page without events is not the end)")


class SuspendResult(BaseModel):
    job_id: str
    state: str = Field(description="SUSPENDING (rank 0 told, ranks stopped after go_suspend() or the "
                                   "grace) or SUSPENDED")
    previous_state: str
    changed: bool = Field(description="False when the job already was in the wanted condition")
    held: bool = Field(description="Held until resumed (suspend) or queued again (resume)")
    deadline_at: float | None = Field(default=None, description="A running job's ranks are stopped by "
                                                                 "force after this (epoch seconds)")


class QuotaLevel(BaseModel):
    priority: int
    priority_name: str
    max_nodes: int | None = Field(description="Nodes the user may hold at once at this level; null: no limit")
    source: str = Field(description="set (by an administrator), default (the deployment's) or unlimited")
    used_nodes: int = Field(description="Nodes the user's running jobs admitted at this level hold")
    room: int | None = Field(description="max_nodes - used_nodes; null: no limit")


class QuotaView(BaseModel):
    user: str = Field(description="The quota's user: IAM user name, or <role>/<session>")
    quotas: list[QuotaLevel]


class QuotaRow(QuotaLevel):
    user: str


class QuotaList(BaseModel):
    quotas: list[QuotaRow]
    next_token: str | None = Field(description="Pass back as next_token for the next page; null: last page")


class QuotaChange(BaseModel):
    """PUT /v1/quotas: set a user's node quota at one level."""

    model_config = ConfigDict(extra="forbid")

    user: str = Field(min_length=1, max_length=512, description="IAM ARN, or the user gpujobs quota shows")
    priority: int | str = Field(description="A level name or its value")
    max_nodes: int = Field(ge=0, le=100_000, strict=True)


class QuotaRemoved(BaseModel):
    user: str
    priority: int
    priority_name: str
    removed: bool = Field(description="False when no quota was set at that level")
    max_nodes: int | None = Field(description="What applies now: the deployment's default, or null")
    source: str
