"""The registration convention (docs/architecture.md): what an ECS task's own event says
about the job and rank it serves, its ``group`` ``gpu-recovery:<job-id>`` and the RANK,
WORLD_SIZE and ATTEMPT of its container environment."""

from __future__ import annotations

from typing import Any

from gpu_recovery.constants import ENV_VAR_RANK, JOB_GROUP_PREFIX


def container_environment(overrides: dict[str, Any]) -> dict[str, str]:
    """The environment of a task's container overrides (the first value of a name wins)."""
    env: dict[str, str] = {}
    for container in (overrides or {}).get("containerOverrides") or []:
        if not isinstance(container, dict):
            continue
        for entry in container.get("environment") or []:
            if isinstance(entry, dict) and "name" in entry:
                env.setdefault(str(entry["name"]), str(entry.get("value", "")))
    return env


def convention_job_id(group: str) -> str:
    """The job a task's ``group`` names under the registration convention ("" if none)."""
    return group[len(JOB_GROUP_PREFIX):].strip() if group.startswith(JOB_GROUP_PREFIX) else ""


def convention_rank(group: str, overrides: dict[str, Any]) -> tuple[str, int] | None:
    """The job and rank a task's event names under the convention (its ``group`` and the
    RANK of its environment), or None. What it names is only where to look: the rank item
    found there is the task's only if it records this task."""
    job_id = convention_job_id(group)
    rank = container_environment(overrides).get(ENV_VAR_RANK, "")
    if not job_id or "#" in job_id or not rank.isdigit():
        return None
    return job_id, int(rank)
