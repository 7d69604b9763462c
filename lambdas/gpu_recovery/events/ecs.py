"""Parser models for the ECS events the recovery loop consumes (Powertools parser).

Only the fields the logic reads are declared; everything else AWS sends is kept
(``extra="allow"``) so nothing is lost when an event is logged.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field


class EcsContainer(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = ""
    exitCode: int | None = None
    lastStatus: str = ""
    reason: str = ""


class EcsTaskDetail(BaseModel):
    model_config = ConfigDict(extra="allow")

    taskArn: str = Field(min_length=1)
    clusterArn: str = Field(min_length=1)
    lastStatus: str
    desiredStatus: str = ""
    taskDefinitionArn: str = ""
    containerInstanceArn: str = ""
    containers: list[EcsContainer] = Field(default_factory=list)
    overrides: dict[str, Any] = Field(default_factory=dict)
    group: str = ""
    startedBy: str = ""
    stopCode: str = ""
    stoppedReason: str = ""
    version: int = 0
    updatedAt: datetime | None = None
    # When ECS created the task and when it began RUNNING: a node task's own time counts from
    # them (``domain.validation.task_time_up``), not from when the stack wanted it.
    createdAt: datetime | None = None
    startedAt: datetime | None = None
    stoppedAt: datetime | None = None
    # When the task's containers stopped (its own exit; ``stoppedAt`` is the later transition).
    executionStoppedAt: datetime | None = None

    def exit_code(self) -> int | None:
        """The task's exit code: the first non-zero container exit, else 0, else None."""
        codes = [c.exitCode for c in self.containers if c.exitCode is not None]
        if not codes:
            return None
        failing = [code for code in codes if code != 0]
        return failing[0] if failing else 0


class EcsTaskStateChangeEvent(EventBridgeModel):
    detail: EcsTaskDetail


class EcsAttribute(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    value: str | None = None


class EcsContainerInstanceDetail(BaseModel):
    model_config = ConfigDict(extra="allow")

    containerInstanceArn: str = Field(min_length=1)
    clusterArn: str = Field(min_length=1)
    status: str
    agentConnected: bool
    ec2InstanceId: str = ""
    version: int = 0
    updatedAt: datetime | None = None
    # The ContainerInstance's attributes, the agent's and the custom ones (PutAttributes).
    attributes: list[EcsAttribute] = Field(default_factory=list)
    # agentVersion changes when the agent is updated ("Amazon ECS container instance state
    # change events"): a reconnect with another version is an agent update, not a reboot.
    versionInfo: dict[str, Any] = Field(default_factory=dict)

    def attribute(self, name: str) -> str | None:
        """The value of attribute ``name`` ("" for a name without value); None if absent."""
        found = next((a for a in self.attributes if a.name == name), None)
        return None if found is None else (found.value or "")

    @property
    def agent_version(self) -> str:
        return str(self.versionInfo.get("agentVersion") or "")


class EcsContainerInstanceStateChangeEvent(EventBridgeModel):
    detail: EcsContainerInstanceDetail
