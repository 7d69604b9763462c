"""What starting one rank of an attempt takes, whichever source gave it: the previous
attempt's rank item (a gang restart) or the job's stored spec and launch plan (a queue
launch). The start fan-out (``recovery.gang``) starts, groups and registers ranks from these
alone, so both start the same way (``recovery.rank_templates``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpu_recovery.domain.models import Rank

RESTART = "restart"
LAUNCH = "launch"


@dataclass(frozen=True)
class RankTemplate:
    """One rank's StartTask for an attempt (overrides and tags already the attempt's) and
    where it starts. ``launch_attempt``: the attempt whose launch lease the rank's item holds
    (a lease taken over: its task may exist already), held until ``lease_until`` (0: not
    known); ``previous``: the rank's item before this attempt (its earlier tasks are kept on
    the new one), None for a rank never started."""

    job_id: str
    rank: int
    task_definition_arn: str
    overrides: dict[str, Any]
    tags: list[dict[str, str]]
    group: str
    gpus: int
    node: str  # container instance id it starts on
    container_instance_arn: str
    ec2_instance_id: str = ""
    subnet: str = ""
    launch_attempt: int = 0
    lease_until: float = 0.0
    previous: Rank | None = field(default=None, compare=False)


def intent_kind(start_fanout: dict[str, Any]) -> str:
    """A start intent's kind; an intent stored before kinds existed is a restart's."""
    return str(start_fanout.get("kind") or RESTART)
