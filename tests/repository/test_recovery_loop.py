"""The recovery loop's ``Repository`` (issue 53): a container of aggregates, with no read or
intent of its own; its ``jobs``, ``instances`` and ``tables`` share one state."""

from __future__ import annotations

from gpu_recovery.domain.models import Instance, Job
from gpu_recovery.domain.states import JobState
from gpu_recovery.repository import Repository
from gpu_recovery.repository.instances import Instances
from gpu_recovery.repository.jobs_and_ranks import JobsAndRanks
from gpu_recovery.repository.tables import RecoveryTables
from tests.fixtures.memory_repository import T0, memory_repository


def test_the_repository_has_no_member_of_its_own() -> None:
    """Nothing inherited, nothing defined but its constructor: every read and intent is called
    on the aggregate that owns it (``repo.jobs.get_job``, ``repo.instances.get_instance``)."""
    assert Repository.__bases__ == (object,)
    assert [name for name in vars(Repository) if not name.startswith("__")] == []
    repo = memory_repository()
    for shared in ("get_job", "get_instance", "finish_job", "put_instance_if_absent", "db", "job_transition"):
        assert not hasattr(repo, shared), shared
    # What it carries is aggregates only, each an object of the repository package.
    assert all(type(aggregate).__module__.startswith("gpu_recovery.repository.")
               for aggregate in vars(repo).values())
    assert isinstance(repo.jobs, JobsAndRanks) and isinstance(repo.instances, Instances)
    assert type(repo.tables) is RecoveryTables


def test_the_aggregates_share_one_state() -> None:
    """One gateway and one set of the tables' aggregates for all three: what one writes the
    other reads, and ``repo.faults`` is the one ``repo.jobs`` builds its intents with."""
    repo: Repository = memory_repository()
    assert repo.jobs.db is repo.instances.db is repo.tables.db
    assert repo.jobs.faults is repo.instances.faults is repo.faults
    assert repo.instances.cordons is repo.cordons and repo.jobs.deadlines is repo.deadlines
    assert repo.registrations.create_job_if_absent(Job("j", JobState.RUNNING, 1, created_at=T0,
                                                       updated_at=T0))
    assert repo.instances.put_instance_if_absent(Instance("node-a"))
    job = repo.jobs.get_job("j")
    assert job is not None and job.state is JobState.RUNNING
    assert repo.decisions.jobs is repo.jobs and repo.nodes_back.instances is repo.instances
    assert repo.instances.get_instance("node-a") is not None
