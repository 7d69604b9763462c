"""Rank 0's address (MASTER_ADDR) cannot be read: EC2 DescribeInstances for an ``i-`` node,
SSM DescribeInstanceInformation for an ECS Anywhere ``mi-`` node, failing after botocore's
retries (docs/aws-contract.md). The job is skipped for this tick with nothing started and
nothing written of a launch, and starts on a later tick once the call answers."""

from __future__ import annotations

from collections.abc import Iterator

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState
from local_mode.sim.api_errors import THROTTLING
from local_mode.sim.broken_calls import THROTTLE
from local_mode.sim.managed_instances import ManagedInstances
from tests.fixtures.queue_cluster import QueueCluster, make_queue_cluster


def _skipped_then_started(qc: QueueCluster, service: str, operation: str) -> None:
    job = qc.submit(nnodes=2, gpus=8)
    qc.local.faults.persistent(service, operation, error=THROTTLING)
    result = qc.scheduler().tick()
    assert result.admitted == []
    assert qc.live_tasks(job) == [] and qc.state(job) in (JobState.QUEUED, JobState.PENDING_RESOURCES)
    assert qc.item(job)["attempt"] == 0 and qc.local.faults.count(service, operation) > 0
    qc.local.faults.clear()
    assert qc.scheduler().tick().admitted == [job]
    assert len(qc.live_tasks(job)) == 2


def test_a_describe_instances_error_skips_the_job_for_this_tick(qc: QueueCluster) -> None:
    _skipped_then_started(qc, "ec2", "DescribeInstances")


def _anywhere_cluster() -> Iterator[QueueCluster]:
    """Two ECS Anywhere nodes (``mi-``) with 8 GPUs each and no host-address attribute."""
    for qc in make_queue_cluster(nodes=[]):
        for name in ("edge-0", "edge-1"):
            qc.sim.add_node(name, gpus=8, kind="anywhere")
        qc.sim.run_for(1)
        yield qc


def test_an_anywhere_rank_0s_address_comes_from_ssm_and_an_ssm_error_skips_the_tick() -> None:
    """SSM answers for the simulated ``mi-`` hosts (local_mode.sim.managed_instances): a
    queue job on ECS Anywhere nodes gets rank 0's address as MASTER_ADDR. Its lookup is an
    answer of the simulation, not of moto, so it is broken by position: the same tick in a
    second, identical cluster, throttled at that call, starts nothing."""
    lookup = 0
    for qc in _anywhere_cluster():
        job = qc.submit(nnodes=2, gpus=8)
        qc.local.call_faults.arm(None)
        assert qc.scheduler().tick().admitted == [job]
        calls = qc.local.call_faults.calls
        lookup = next(c.index for c in calls if c.operation == "DescribeInstanceInformation")
        qc.local.call_faults.disarm()
        rank0 = next(t for t in qc.live_tasks(job) if t.tags[C.TAG_RANK] == "0")
        hosts = qc.sim.managed_instances.hosts()
        addresses = {h.name: ManagedInstances.address(i) for i, h in enumerate(hosts)}
        env = {e["name"]: e["value"] for e in rank0.overrides["containerOverrides"][0]["environment"]}
        assert env["MASTER_ADDR"] == addresses[rank0.node]
    for qc in _anywhere_cluster():
        job = qc.submit(nnodes=2, gpus=8)
        qc.local.call_faults.arm(lookup, THROTTLE)
        assert qc.scheduler().tick().admitted == []
        assert qc.local.call_faults.fired is not None
        assert qc.live_tasks(job) == [] and qc.item(job)["attempt"] == 0
        qc.local.call_faults.disarm()
        assert qc.scheduler().tick().admitted == [job]
