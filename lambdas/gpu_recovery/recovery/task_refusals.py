"""Why a task cannot be protected: refused loudly (a WARNING every time, one e-mail) or
not protected at all (no recovery tags), as ``recovery.ranks`` reads a task's registration."""

from __future__ import annotations

from gpu_recovery.constants import (
    ENV_VAR_SECURITY_GROUPS,
    ENV_VAR_SUBNETS,
    MAX_TASK_TAGS,
    MAX_WORLD_SIZE,
    TAG_ATTEMPT,
    TAG_SECURITY_GROUPS,
    TAG_SUBNETS,
)


class NotProtected(ValueError):
    """The task carries no (or malformed) recovery tags."""


class Refused(NotProtected):
    """A tagged job the loop cannot protect: refused loudly (a WARNING every time, one e-mail),
    never ignored."""

    headline = "Job not protected"
    log_message = "job not protected: not registered"
    operator_action = ""

    def __init__(self, job_id: str, world_size: int, why: str) -> None:
        super().__init__(why)
        self.job_id = job_id
        self.world_size = world_size


class TooLarge(Refused):
    """A tagged job larger than the loop protects."""

    headline = "Job not protected: too many tasks"
    log_message = "job too large to protect: not registered"
    operator_action = (f"Run jobs of at most {MAX_WORLD_SIZE} tasks (e.g. one task per node instead of "
                       "one per GPU), or remove the gpu-recovery tags from this job's tasks.")

    def __init__(self, job_id: str, world_size: int) -> None:
        super().__init__(job_id, world_size, f"job {job_id} has {world_size} tasks; the recovery loop "
                                             f"protects jobs of at most {MAX_WORLD_SIZE}")


class NetworkUnknown(Refused):
    """A task in the awsvpc network mode whose security groups the loop cannot learn (ECS
    tells none): it could not be restarted as it was (domain.task_network)."""

    headline = "Job not protected: its awsvpc network is not known"
    log_message = "awsvpc job without its security groups: not registered"
    operator_action = (f"Start the job's tasks with the tag {TAG_SECURITY_GROUPS} (or, under the "
                       f"registration convention, the environment variable {ENV_VAR_SECURITY_GROUPS}): "
                       "their security group ids, separated by spaces (and, optionally, "
                       f"{TAG_SUBNETS} / {ENV_VAR_SUBNETS}: their subnets).")


class TooManyTags(Refused):
    """A tagged job whose tasks carry so many tags that a restart could not tag its tasks with
    their attempt: ECS allows 50 tags a task (``aws:`` ones aside), and a restarted task
    carries the original's tags plus ``gpu-recovery:attempt`` (ECS API Reference, Tag)."""

    headline = "Job not protected: its tasks carry too many tags"
    log_message = "job whose tasks carry too many tags to restart: not registered"
    operator_action = (f"Remove a tag from the job's tasks (or tag them {TAG_ATTEMPT}=1 in place of "
                       f"another tag) and start the job again: a restarted task carries its tags plus "
                       f"{TAG_ATTEMPT}, and ECS takes at most {MAX_TASK_TAGS} tags a task.")

    def __init__(self, job_id: str, world_size: int, tags: int) -> None:
        super().__init__(job_id, world_size, f"the tasks of job {job_id} carry {tags} tags; a restart adds "
                                             f"{TAG_ATTEMPT}, and ECS takes at most {MAX_TASK_TAGS} tags "
                                             "a task")
        self.tags = tags


class StartedForSeveralRanks(NotProtected):
    """A task one StartTask started for several identical ranks (tag ``gpu-recovery:ranks``):
    its rank is the one planned on its container instance."""

    def __init__(self, job_id: str, attempt: int, ranks: list[int]) -> None:
        super().__init__(f"task started for ranks {ranks} of job {job_id}")
        self.job_id = job_id
        self.attempt = attempt
        self.ranks = ranks
