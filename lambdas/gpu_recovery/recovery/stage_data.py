"""What the recovery loop's stages read and write, as protocols the repository provides
(mypy checks that it does): the operations several stages share, and the data of the two
largest stages (the task events and the gang restart), kept here so that their modules stay
one concern each. The other stages declare theirs in their own module.

A stage that reads one aggregate is handed it (``repo.jobs``, ``repo.instances``: its
protocol names that aggregate's few operations); a stage that needs both, or a sub-repository
of the ``Repository`` besides, is handed the container, and its protocol names each
aggregate's operations apart by extending ``HasJobs[J]`` and ``HasInstances[N]`` (``J``, ``N``: its
narrow protocols of the two aggregates). A protocol that narrows an aggregate its base already
names declares the property again (a generic base given twice would keep the first base's)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from gpu_recovery.domain.models import Instance, Job, Rank
from gpu_recovery.domain.states import JobState
from gpu_recovery.recovery.restart_waits import WaitData
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.cordons import CordonRepository
from gpu_recovery.repository.deadlines import DeadlineIndex
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.jobs_and_ranks import RankStop
from gpu_recovery.repository.latches import LatchRepository
from gpu_recovery.repository.node_decisions import NodeDecisionRepository
from gpu_recovery.repository.nodes_back import NodeBackRepository
from gpu_recovery.repository.rank_events import RankEventRepository

Jobs = TypeVar("Jobs", covariant=True)
Nodes = TypeVar("Nodes", covariant=True)


class HasJobs(Protocol[Jobs]):
    """The jobs aggregate, as the narrower protocol ``Jobs`` that names the operations a stage
    uses of it (read-only, so that the aggregate's own class satisfies it)."""

    @property
    def jobs(self) -> Jobs: ...


class HasInstances(Protocol[Nodes]):
    """The instances aggregate, as the narrower protocol ``Nodes`` (read-only: likewise)."""

    @property
    def instances(self) -> Nodes: ...


class EndsJobs(Protocol):
    """Of the jobs aggregate: a job's terminal transition (with its ranks' stop and the e-mails it
    owes), and its item read after it (its goodput metrics)."""

    def get_job_item(self, job_id: str) -> dict[str, Any] | None: ...
    def finish_job(self, job_id: str, attempt: int | None, to: JobState, reason: str, *,
                   actor: str = ..., fields: dict[str, Any] | None = None,
                   from_states: Iterable[JobState] | None = None,
                   rank_stop: RankStop | None = None, stop_ranks_of: int | None = None,
                   stop_why: str = "", also: Sequence[Update] = (),
                   ledger: Mapping[str, Any] | None = None) -> bool: ...


class ReadsJob(Protocol):
    """Of the jobs aggregate: a job read."""

    def get_job(self, job_id: str) -> Job | None: ...


class ReadsNode(Protocol):
    """Of the instances aggregate: a node read."""

    def get_instance(self, container_inst_id: str) -> Instance | None: ...


class ReadsInstances(Protocol):
    """Of the instances aggregate: nodes read in one batch."""

    def get_instances(self, ids: Iterable[str]) -> dict[str, Instance]: ...


class ReadsNodeItems(Protocol):
    """Of the instances aggregate: a node's item as stored (its fault history, its evidence) and
    as a record."""

    def get_instance_item(self, container_inst_id: str) -> dict[str, Any] | None: ...
    def instance_from_item(self, item: Mapping[str, Any]) -> Instance: ...


class MarksNodesBack(Protocol):
    """A repaired node back (after a reboot, or a GPU reset that passed), its validation next,
    the jobs waiting for it released (``repo.nodes_back``)."""

    nodes_back: NodeBackRepository


class RecordsNodeDecisions(Protocol):
    """A node's decision in one transaction: the instance, the jobs it settles, the breaker
    (``repo.decisions``)."""

    decisions: NodeDecisionRepository


class RecordsObservedFaults(Protocol):
    """Of the instances aggregate: a fault observed only (observe mode, a node lost): the node's
    last fault recorded."""

    def record_observed_fault(self, inst_id: str, *, fault_history: list[dict[str, Any]] | None,
                              last_fault: dict[str, Any]) -> bool: ...


class TaskEventJobs(EndsJobs, Protocol):
    """The job and rank a task event is about, a job's cancel confirmed."""

    def get_job(self, job_id: str) -> Job | None: ...
    def get_rank(self, job_id: str, rank: int) -> Rank | None: ...
    def mark_job_canceled(self, job_id: str, reason: str, actor: str = ...) -> bool: ...


class TaskEventNodes(ReadsNodeItems, RecordsObservedFaults, Protocol):
    """The node a rank ran on."""

    def get_instance(self, container_inst_id: str) -> Instance | None: ...


class TaskEventData(HasJobs[TaskEventJobs], HasInstances[TaskEventNodes], Protocol):
    """A rank's stop or start recorded, the fault it opens (or joins), the job's end."""

    faults: FaultRepository
    latches: LatchRepository
    rank_events: RankEventRepository  # the rank running or stopped, the fault or restart it opens


class RestartJobs(WaitData, EndsJobs, Protocol):
    """A restart's job and ranks (where they restart), its end."""

    def get_rank(self, job_id: str, rank: int) -> Rank | None: ...


class RestartData(HasJobs[RestartJobs], HasInstances[ReadsInstances], Protocol):
    """What a restart reads (its job and ranks, the fault's tally and suspects, the nodes its
    ranks ran on) and its job's end; its own transitions are ``repo.restarts``'."""

    faults: FaultRepository
    latches: LatchRepository
    cordons: CordonRepository
    deadlines: DeadlineIndex
