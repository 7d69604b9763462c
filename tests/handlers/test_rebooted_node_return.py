"""A rebooted node's return, end to end (issue 40): the container-instance rule invokes the
instance monitor for rebooting nodes only (defect 10), and an ECS agent that disconnects
and reconnects without a reboot (a blip, an agent update) in the reboot window is not
taken for "back" (``domain.reboot_evidence``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpu_recovery import runtime
from gpu_recovery.constants import REBOOTING_ATTRIBUTE, InstanceState, JobState
from tests.handlers.cluster import Cluster, cluster_with

MIN = 60
MONITOR = "ecs_instance_monitor"


def _start(cluster: Cluster, job_id: str, nodes: list[str]) -> None:
    for node in nodes:
        cluster.sim.add_node(node, gpus=8)
    cluster.sim.start_job(job_id, cluster.train_td, nodes)
    cluster.sim.run_for(MIN)


def _until_rebooting(cluster: Cluster, node: str) -> None:
    """Run until the host has been asked to reboot (the simulated node is rebooting)."""
    assert cluster.sim.run_until_true(lambda: cluster.sim.node(node).rebooting, max_seconds=15 * MIN)


def _blip(cluster: Cluster, node: str) -> None:
    cluster.sim.disconnect_agent(node, after=5, for_seconds=5)


def _agent_update(cluster: Cluster, node: str) -> None:
    cluster.sim.update_agent(node, after=5, outage_seconds=40)


def _monitor_runs(cluster: Cluster) -> int:
    return len(cluster.bus.delivered_to(MONITOR))


@pytest.mark.parametrize("no_reboot", [_blip, _agent_update], ids=["network-blip", "agent-update"])
def test_an_agent_reconnect_without_a_reboot_is_not_back(no_reboot: Callable[[Cluster, str], None]) -> None:
    """Given a node whose reboot was requested and whose host goes down only 90 s later,
    When its ECS agent disconnects and reconnects before that (a 5 s network blip, or a
    40 s agent update that changes its version), Then the node stays REBOOTING and its job
    waits; once the host really rebooted, the node is back and the job restarts."""
    with cluster_with(disconnect_delay_seconds=90, reboot_seconds=300) as cluster:
        _start(cluster, "blip", ["node-a", "node-b"])
        cluster.sim.inject_gpu_fault("node-b", after=MIN, health="reboot_fixable")
        _until_rebooting(cluster, "node-b")
        no_reboot(cluster, "node-b")
        cluster.sim.run_for(80)  # the agent is back, the host has not gone down yet
        assert cluster.sim.node("node-b").agent_connected and cluster.sim.node("node-b").rebooting
        assert cluster.instance("node-b").state is InstanceState.REBOOTING
        assert cluster.state("blip") is JobState.PENDING_RESTART
        cluster.sim.run_for(10 * MIN)
        assert cluster.instance("node-b").state is InstanceState.AVAILABLE
        assert cluster.job("blip").attempt == 2
        assert cluster.state("blip") is JobState.RUNNING
        assert not cluster.bus.dead_letters


def test_a_node_agent_reporting_the_old_boot_time_keeps_a_long_blip_from_being_a_reboot() -> None:
    """Given a node whose node agent reports its boot time, When its ECS agent is away for
    two minutes in the reboot window (long enough to look like a reboot to ECS) and its node
    agent then reports the same boot time as before, Then the node is not back; it is back
    on the first report of a later boot time."""
    with cluster_with(disconnect_delay_seconds=300, reboot_seconds=500) as cluster:
        _start(cluster, "long-blip", ["node-a", "node-b"])
        node = cluster.sim.node("node-b")
        heartbeats = runtime.heartbeat_service()

        def report() -> None:
            heartbeats.report_tasks(node.container_instance_id, cluster.sim.now(), [],
                                    boot_time=node.boot_time)

        report()
        cluster.sim.inject_gpu_fault("node-b", after=MIN, health="reboot_fixable")
        _until_rebooting(cluster, "node-b")
        cluster.sim.disconnect_agent("node-b", after=5, for_seconds=120)
        cluster.sim.run_for(130)
        report()
        cluster.sim.run_for(2 * MIN)
        assert cluster.instance("node-b").state is InstanceState.REBOOTING
        assert cluster.state("long-blip") is JobState.PENDING_RESTART
        cluster.sim.run_until_true(lambda: not node.rebooting, max_seconds=10 * MIN)  # the host is up
        cluster.sim.run_for(MIN)
        assert cluster.instance("node-b").state is InstanceState.REBOOTING  # no new boot time yet
        report()
        assert cluster.instance("node-b").state is InstanceState.AVAILABLE
        cluster.sim.run_for(MIN)
        assert cluster.job("long-blip").attempt == 2


def _gang_restart_monitor_runs(nodes: int) -> tuple[int, int]:
    """(instance monitor invocations, ECS container-instance events) from a GPU fault on
    the last node of a ``nodes``-rank job to its gang restart running."""
    names = [f"node-{i}" for i in range(nodes)]
    with cluster_with() as cluster:
        _start(cluster, "gang", names)
        runs, events = _monitor_runs(cluster), cluster.counter("events_emitted")
        cluster.sim.inject_gpu_fault(names[-1], after=MIN, health="reboot_fixable", nccl_cascade=True)
        assert cluster.sim.run_until_true(lambda: cluster.job("gang").attempt == 2
                                          and cluster.state("gang") is JobState.RUNNING, max_seconds=30 * MIN)
        cluster.sim.run_for(MIN)
        marked = [n for n in names if REBOOTING_ATTRIBUTE in _attributes(cluster, n)]
        assert not marked, f"the rebooting mark was left on {marked}"
        return _monitor_runs(cluster) - runs, cluster.counter("events_emitted") - events


def _attributes(cluster: Cluster, node: str) -> set[str]:
    ecs = cluster.local.client("ecs")
    described = ecs.describe_container_instances(cluster=cluster.local.cluster_name,
                                                 containerInstances=[cluster.sim.node(node).container_instance_arn])
    return {a["name"] for a in described["containerInstances"][0].get("attributes", [])}


def test_a_gang_restart_invokes_the_instance_monitor_for_the_rebooted_node_only() -> None:
    """Given jobs of 2 and 6 ranks, one per node, When one node faults, is rebooted and the
    gang restarts, Then the instance monitor runs for the rebooted node's own events only
    (its disconnect and its return, each delivered twice): as often for 6 ranks as for 2,
    although every task stop and start changes a node's resources and emits an event."""
    small_runs, small_events = _gang_restart_monitor_runs(2)
    large_runs, large_events = _gang_restart_monitor_runs(6)
    assert large_events > small_events + 10  # the larger gang's placements emit more events
    assert small_runs == large_runs <= 4  # 2 events of the rebooted node, 2 copies each


def test_the_instance_monitor_puts_a_returning_nodes_reservation_its_role_grants() -> None:
    """Defect 4 (issue 40): the instance monitor puts placement attributes, which its role
    did not grant (only DeleteAttributes, to uncordon): on AWS, AccessDenied swallowed. Given
    a node rebooted while its job holds its nodes for the restart (issue 41: reserved), When
    the node is back, Then the instance monitor takes off the cordon and leaves the job's
    reservation (``gpu-recovery.unavailable=reserved``: PutAttributes), a call the grants
    guard found allowed by the monitor's own role."""
    with cluster_with(disconnect_delay_seconds=5, reboot_seconds=120) as cluster:
        _start(cluster, "held", ["node-a", "node-b"])
        cluster.sim.inject_gpu_fault("node-b", after=MIN, health="reboot_fixable")
        _until_rebooting(cluster, "node-b")
        assert cluster.sim.run_until_true(
            lambda: cluster.instance("node-b").state is InstanceState.AVAILABLE, max_seconds=10 * MIN)
        grants = cluster.local.grants
        assert grants is not None and not grants.denials
        assert (MONITOR, "ecs:PutAttributes") in {
            (function, operation) for function, operation, *_ in grants.usage.operations}
