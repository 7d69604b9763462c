"""Where a start batch's ranks come from, chosen by the start intent's kind
(``domain.rank_template``): the start fan-out (``recovery.gang``) is the one launcher, and
only what each rank is started from differs.

* a **restart** (the recovery's gang restart): the previous attempt's rank items, each on its
  node or where the restart's relocation moved it;

A source also registers a rank it gave once its task is known (the new attempt's rank item,
and its arrival at the attempt's registered latch), with when its task was started when that
was before now (a task a dead holder of its lease started, found by its ``startedBy``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.rank_template import RankTemplate
from gpu_recovery.recovery.ranks import RankOperations, overrides_for_attempt, tags_for_attempt
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.latches import Arrival


@dataclass
class BatchTemplates:
    """A batch's ranks: those registered for the attempt already (their latch arrival may be
    lost: arrived again), and a template of every rank the batch plans (``startable``: those
    still to start)."""

    registered: list[Rank] = field(default_factory=list)
    planned: list[RankTemplate] = field(default_factory=list)
    startable: dict[int, RankTemplate] = field(default_factory=dict)


class RankTemplates(Protocol):
    """A start intent's source of ranks."""

    def read(self, job: Job, first: int, last: int) -> BatchTemplates: ...
    def register(self, job: Job, template: RankTemplate, task_arn: str, started_by: str,
                 started_at: float | None = None) -> Arrival: ...


class RestartRanks(Protocol):
    """A batch's rank items (``recovery.gang.GangData``)."""

    def get_rank_range(self, job_id: str, first: int, last: int) -> list[Rank]: ...


def restart_template(rank: Rank, attempt: int, moves: Mapping[str, Mapping[str, str]]) -> RankTemplate:
    """``rank``'s item started again for ``attempt``: on its node, or where the restart moved
    that node's ranks."""
    move = moves.get(rank.container_inst_id)
    if move:
        node, arn, ec2 = move["node"], move["arn"], move.get("ec2", "")
    else:
        node, arn = rank.container_inst_id, rank.container_instance_arn or rank.container_inst_id
        ec2 = rank.ec2_instance_id
    return RankTemplate(
        job_id=rank.job_id, rank=rank.rank, task_definition_arn=rank.task_definition_arn,
        overrides=overrides_for_attempt(rank.overrides, attempt), tags=tags_for_attempt(rank.tags, attempt),
        group=rank.group, gpus=rank.gpus, node=node, container_instance_arn=arn, ec2_instance_id=ec2,
        subnet=rank.subnet, launch_attempt=rank.launch_attempt or 0,
        lease_until=float(rank.launch_lease_until or 0.0), previous=rank)


@dataclass(eq=False, repr=False)
class RestartTemplates:
    """A gang restart's ranks: the previous attempt's items (and the relocation's moves)."""

    data: RestartRanks
    faults: FaultRepository
    ranks: RankOperations

    def read(self, job: Job, first: int, last: int) -> BatchTemplates:
        moves = self.faults.placement(job.job_id, job.attempt) if job.relocated else {}
        ranks = self.data.get_rank_range(job.job_id, first, last)
        out = BatchTemplates(registered=[r for r in ranks if r.attempt == job.attempt])
        for rank in ranks:
            if rank.attempt in (job.attempt, job.attempt - 1):
                template = restart_template(rank, job.attempt, moves)
                out.planned.append(template)
                if rank.attempt == job.attempt - 1:
                    out.startable[rank.rank] = template
        return out

    def register(self, job: Job, template: RankTemplate, task_arn: str, started_by: str,
                 started_at: float | None = None) -> Arrival:
        assert template.previous is not None  # a restart's ranks all have one
        return self.ranks.register_restarted(
            job, template.previous, task_arn=task_arn, container_instance_arn=template.container_instance_arn,
            ec2_instance_id=template.ec2_instance_id, started_by=started_by, registered_at=started_at)
