"""What a user submits to the job queue (``JobSpec``) and the priority levels.

The validated spec is stored as ``spec_json`` on the job item (task definition pinned to
its ARN, container name resolved, environment in ECS ``[{name, value}]`` form); the
scheduler's launcher reads it back (``launcher.LaunchSpec``) to build the ECS ``StartTask``
overrides.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpu_recovery.constants import MAX_QUEUE_NODES
from gpu_recovery.domain.job_budgets import MAX_BUDGET
from gpu_recovery.domain.task_network import (
    MAX_SECURITY_GROUPS,
    MAX_SUBNETS,
    NetworkError,
    awsvpc_configuration,
)
from gpu_recovery.domain.time_sharing import (
    AUTO_PRIORITY,
    MAX_SUSPEND_GRACE_SECONDS,
    MIN_SUSPEND_GRACE_SECONDS,
    PRIORITY_NAMES,
    PRIORITY_VALUES,
    Priority,
    priority_name,
)

# The levels live in the domain (the time-sharing policy orders and preempts by them).
__all__ = ["AUTO_PRIORITY", "PRIORITY_NAMES", "PRIORITY_VALUES", "JobSpec", "Priority", "priority_name"]


NAME_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
# arn:aws:ecs:<region>:<account>:task-definition/<family>[:<revision>] or <family>:<revision>
TASK_DEFINITION_PATTERN = (
    r"^(arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:task-definition/[A-Za-z0-9_-]{1,255}(:\d+)?"
    r"|[A-Za-z0-9_-]{1,255}:\d+)$"
)
CONTAINER_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,255}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,254}$"
MAX_LABELS = 20
MAX_LABEL_KEY = 128
MAX_LABEL_VALUE = 256
MAX_COMMAND_ARGS = 256
MAX_ENV_VARS = 200
MAX_ARG_LENGTH = 8192
# ECS refuses a StartTask whose overrides exceed 8192 characters of JSON; the launcher adds
# the container name, the rendezvous variables and the GPU requirement (under 1 KiB).
ECS_OVERRIDES_LIMIT = 8192
MAX_OVERRIDES_BYTES = ECS_OVERRIDES_LIMIT - 1024


class EnvVar(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=ENV_NAME_PATTERN)
    value: str = Field(max_length=MAX_ARG_LENGTH)


class ContainerOverrides(BaseModel):
    """Overrides of the training container (the same for every rank).

    ``environment`` accepts ``{"NAME": "value"}`` or ECS's ``[{"name", "value"}]``; it is
    stored in the ECS list form.
    """

    model_config = ConfigDict(extra="forbid")

    command: list[str] | None = Field(default=None, max_length=MAX_COMMAND_ARGS)
    environment: list[EnvVar] = Field(default_factory=list, max_length=MAX_ENV_VARS)

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(len(arg) > MAX_ARG_LENGTH for arg in value):
            raise ValueError(f"each argument must be at most {MAX_ARG_LENGTH} characters")
        return value

    @field_validator("environment", mode="before")
    @classmethod
    def _environment(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return [{"name": k, "value": v} for k, v in value.items()]
        return value

    @field_validator("environment")
    @classmethod
    def _unique(cls, value: list[EnvVar]) -> list[EnvVar]:
        names = [v.name for v in value]
        if len(names) != len(set(names)):
            raise ValueError("environment variable names must be unique")
        return value

    @model_validator(mode="after")
    def _fits_ecs(self) -> ContainerOverrides:
        size = len(json.dumps(self.model_dump(exclude_none=True), separators=(",", ":")))
        if size > MAX_OVERRIDES_BYTES:
            raise ValueError(
                f"command and environment take {size} characters of JSON; at most "
                f"{MAX_OVERRIDES_BYTES} fit in ECS's {ECS_OVERRIDES_LIMIT}-character task overrides"
            )
        return self


class NetworkSpec(BaseModel):
    """The job's tasks' network, for a task definition in the ``awsvpc`` network mode (ECS
    requires it then, and refuses it otherwise: checked at submission)."""

    model_config = ConfigDict(extra="forbid")

    subnets: list[str] = Field(min_length=1, max_length=MAX_SUBNETS,
                               description="Subnet ids (1-16, one VPC; ECS puts each task in the one "
                                           "of its node's availability zone)")
    security_groups: list[str] = Field(default_factory=list, max_length=MAX_SECURITY_GROUPS,
                                       description="Security group ids (0-5, the same VPC; none: the "
                                                   "VPC's default group)")
    assign_public_ip: Literal["DISABLED"] = Field(
        default="DISABLED", description="DISABLED only: ECS gives no public IP to tasks on EC2 instances")

    @model_validator(mode="after")
    def _ids(self) -> NetworkSpec:
        try:
            awsvpc_configuration(self.subnets, self.security_groups)
        except NetworkError as error:
            raise ValueError(str(error)) from error
        return self

    def awsvpc(self) -> dict[str, Any]:
        """StartTask's ``awsvpcConfiguration``."""
        return awsvpc_configuration(self.subnets, self.security_groups)


class JobSpec(BaseModel):
    """A multi-node training job: ``nnodes`` ECS tasks with ``gpus_per_node`` GPUs each."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "llama-ft",
                    "task_definition": "llama-train:3",
                    "nnodes": 2,
                    "gpus_per_node": 8,
                    "priority": "HIGH",
                    "overrides": {"command": ["torchrun", "train.py"], "environment": {"EPOCHS": "3"}},
                    "labels": {"team": "nlp"},
                }
            ]
        },
    )

    name: str = Field(pattern=NAME_PATTERN, description="1-64 characters: letters, digits, . _ -")
    task_definition: str = Field(
        pattern=TASK_DEFINITION_PATTERN,
        description="Task definition ARN or family:revision (pinned to its ARN on submit)",
    )
    container_name: str | None = Field(
        default=None,
        pattern=CONTAINER_NAME_PATTERN,
        description="Training container; default: the task definition's first container",
    )
    overrides: ContainerOverrides = Field(default_factory=ContainerOverrides)
    nnodes: int = Field(ge=1, le=MAX_QUEUE_NODES, strict=True,
                        description="Ranks (ECS tasks), one per node")
    gpus_per_node: int = Field(ge=1, le=16, strict=True)
    priority: int | Literal[
        "LOW", "BELOW_NORMAL", "NORMAL", "ABOVE_NORMAL", "HIGH", "VERY_HIGH", "EXTREME_HIGH", "AUTO"
    ] = Field(default=int(Priority.NORMAL),
              description="A level name or its value; AUTO: the highest level where you have a node "
                          "quota with room for the job (NORMAL if none)")
    suspend_grace_seconds: int | None = Field(
        default=None, ge=MIN_SUSPEND_GRACE_SECONDS, le=MAX_SUSPEND_GRACE_SECONDS, strict=True,
        description="Seconds rank 0 has to checkpoint and call go_suspend() once told to suspend, "
                    "before the job's tasks are stopped; default: the deployment's (60)")
    max_infra_recoveries: int | None = Field(
        default=None, ge=0, le=MAX_BUDGET, strict=True,
        description="Infrastructure recoveries (node faults fixed by a reboot or by moving the job "
                    "to healthy nodes); default: the deployment's (3)")
    max_app_restarts: int | None = Field(
        default=None, ge=0, le=MAX_BUDGET, strict=True,
        description="Restarts after an application error (the job's own fault, no node action); "
                    "default: the deployment's (0: the job fails)")
    max_recovery_attempts: int | None = Field(
        default=None, ge=0, le=MAX_BUDGET, strict=True, description="Older name of max_infra_recoveries")
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)
    network: NetworkSpec | None = Field(
        default=None, description="Subnets and security groups, for a task definition in the awsvpc "
                                  "network mode (required then, refused otherwise)")
    preflight: Literal["auto", "restarts", "always", "off"] | None = Field(
        default=None,
        description="Gang preflight before the command (its command starts with the training client's "
                    "wrapper: docs/preflight.md): restarts (after every recovery restart), always (also "
                    "at the first start), off, or auto (the deployment's default: restarts for jobs of "
                    "preflight_min_nodes nodes or more; the default)")

    @model_validator(mode="after")
    def _one_infra_budget(self) -> JobSpec:
        if (self.max_infra_recoveries is not None and self.max_recovery_attempts is not None
                and self.max_infra_recoveries != self.max_recovery_attempts):
            raise ValueError("give max_infra_recoveries or its older name max_recovery_attempts, not "
                             "two different values")
        return self

    def budgets(self, default_infra: int, default_app: int) -> tuple[int, int]:
        """(infrastructure recoveries, application-error restarts) of this job."""
        infra = self.max_infra_recoveries
        if infra is None:
            infra = self.max_recovery_attempts
        return (default_infra if infra is None else infra,
                default_app if self.max_app_restarts is None else self.max_app_restarts)

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a priority level name or value")
        if isinstance(value, str):
            upper = value.strip().upper()
            if upper == AUTO_PRIORITY:
                return AUTO_PRIORITY
            if upper in PRIORITY_NAMES:
                return PRIORITY_NAMES[upper]
            if re.fullmatch(r"\d{1,3}", upper):
                value = int(upper)
            else:
                raise ValueError(f"must be one of {', '.join(PRIORITY_NAMES)}, {AUTO_PRIORITY}")
        if isinstance(value, float):
            # JSON's 10.0 is the level 10; -5.0 or 12.5 is no level (pydantic would turn -5.0 into
            # the int -5, sorting ahead of every level and matching no quota).
            if not value.is_integer():
                raise ValueError("must be a priority level name or value, not a fraction")
            value = int(value)
        if isinstance(value, int) and value not in PRIORITY_VALUES:
            allowed = ", ".join(f"{n}={v}" for n, v in PRIORITY_NAMES.items())
            raise ValueError(f"must be one of {allowed}")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not 1 <= len(key) <= MAX_LABEL_KEY:
                raise ValueError(f"label keys must be 1-{MAX_LABEL_KEY} characters")
            if len(val) > MAX_LABEL_VALUE:
                raise ValueError(f"label values must be at most {MAX_LABEL_VALUE} characters")
        return value

    @property
    def is_auto_priority(self) -> bool:
        return self.priority == AUTO_PRIORITY

    @property
    def priority_value(self) -> int:
        """The level (AUTO is resolved at submit, before this is read)."""
        if self.priority == AUTO_PRIORITY:
            raise ValueError("priority AUTO is resolved at submit")
        return int(self.priority)

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)
