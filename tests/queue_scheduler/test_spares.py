"""Hot spares (issue 19, ``spare_nodes``): the tick keeps that many healthy, wholly free
GPU nodes out of queue work; relocation finds them free."""

from __future__ import annotations

import pytest

from gpu_recovery import constants as C
from gpu_recovery.adapters import aws
from gpu_recovery.constants import InstanceState, JobState
from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.relocation import SpareNode, SparePool, keep_spares
from gpu_recovery.settings import SchedulerConfig, SettingsError


def test_a_full_looking_cluster_keeps_its_spares_free(qc):
    """Given 4 nodes, spare_nodes=1 and 4 one-node jobs queued, When a tick runs, Then 3
    start and one node stays free (the snapshot says why); the 4th job waits."""
    jobs = [qc.submit(nnodes=1, gpus=8) for _ in range(4)]
    scheduler = qc.scheduler(spares=SparePool(1))
    result = scheduler.tick()
    assert result.admitted == jobs[:3]
    assert qc.state(jobs[3]) is JobState.QUEUED
    used = {t.node for t in qc.live_tasks()}
    [spare] = sorted(set(qc.sim.nodes) - used)
    assert scheduler.snapshot()[qc.sim.node(spare).container_instance_id].node.spare
    assert qc.scheduler(spares=SparePool(1)).tick().admitted == []


def test_a_relocated_queue_job_takes_the_spare(qc):
    """Given 4 nodes, spare_nodes=1, 3 nodes busy and a queued job waiting, When a job
    relocated off a bad node (back at the head of its priority) is queued, Then it starts
    on the spare; the other queued job still waits."""
    first = [qc.submit(nnodes=1, gpus=8) for _ in range(4)]
    assert qc.scheduler(spares=SparePool(1)).tick().admitted == first[:3]
    at = qc.sim.now()
    moved = qc.submit("moved", nnodes=1, gpus=8, submitted_at=at,
                      **{C.QUEUE_SK: C.relocated_queue_order(0, at, "moved")})
    assert qc.scheduler(spares=SparePool(1)).tick().admitted == [moved]
    assert qc.state(first[3]) is JobState.QUEUED
    assert {t.node for t in qc.live_tasks()} == set(qc.sim.nodes)


def test_a_percentage_counts_on_the_gpu_nodes_and_rounds_up(qc):
    """25 % of 4 nodes keeps 1; 0 (the default) keeps none: today's behaviour."""
    jobs = [qc.submit(nnodes=1, gpus=8) for _ in range(4)]
    assert qc.scheduler(spares=SparePool.parse("25%")).tick().admitted == jobs[:3]
    assert qc.scheduler().tick().admitted == [jobs[3]]


def test_an_unhealthy_node_is_no_spare_and_a_healed_one_returns_to_the_pool(qc):
    """Given node-3 QUARANTINED and spare_nodes=1, When 3 one-node jobs are queued, Then
    two start (one healthy node is kept as the spare); When node-3 is healthy again, Then
    it counts in the pool again and the third job takes the other free node."""
    node = qc.sim.node("node-3")
    qc.repo.instances.put_instance_if_absent(Instance(node.container_instance_id, InstanceState.QUARANTINED,
                                                      node.container_instance_arn, node.instance_id))
    jobs = [qc.submit(nnodes=1, gpus=8) for _ in range(3)]
    assert qc.scheduler(spares=SparePool(1)).tick().admitted == jobs[:2]
    aws.resource("dynamodb").Table(qc.local.instance_table).update_item(  # healed (remediation's write)
        Key={C.INSTANCE_PK: node.container_instance_id}, UpdateExpression="SET instance_state = :s",
        ExpressionAttributeValues={":s": InstanceState.AVAILABLE.value})
    assert qc.scheduler(spares=SparePool(1)).tick().admitted == [jobs[2]]
    assert len(set(qc.sim.nodes) - {t.node for t in qc.live_tasks()}) == 1  # the spare


def test_keep_spares_takes_wholly_free_nodes_largest_first() -> None:
    nodes = [SpareNode("a", "arn-a", "", 8, 8), SpareNode("b", "arn-b", "", 4, 8),
             SpareNode("c", "arn-c", "", 4, 4), SpareNode("d", "arn-d", "", 8, 8)]
    assert keep_spares(0, nodes) == set()
    assert keep_spares(1, nodes) == {"a"}
    assert keep_spares(3, nodes) == {"a", "d", "c"}  # b is partly in use: no spare
    assert keep_spares(9, nodes) == {"a", "c", "d"}


@pytest.mark.parametrize(("raw", "pool", "size_of_128"), [
    ("0", SparePool(), 0), ("2", SparePool(2), 2), (3, SparePool(3), 3),
    ("5%", SparePool(0, 5.0), 7), ("2%", SparePool(0, 2.0), 3), ("2.5 %", SparePool(0, 2.5), 4),
])
def test_spare_nodes_parses_a_count_or_a_percentage(raw, pool, size_of_128) -> None:
    assert SparePool.parse(raw) == pool
    assert pool.size(128) == size_of_128


@pytest.mark.parametrize("raw", ["-1", "1.5", "five", "60%", "%", True, ""])
def test_spare_nodes_refuses_anything_else(raw) -> None:
    with pytest.raises(ValueError, match="spare_nodes"):
        SparePool.parse(raw)


def test_the_scheduler_reads_spare_nodes_from_its_environment() -> None:
    assert SchedulerConfig.from_env({}).spares == SparePool()
    assert SchedulerConfig.from_env({"SPARE_NODES": "5%"}).spares == SparePool(0, 5.0)
    with pytest.raises(SettingsError, match="SPARE_NODES"):
        SchedulerConfig.from_env({"SPARE_NODES": "lots"})


def test_a_low_job_borrows_the_marked_spare_only_with_lending_on_and_the_lend_written_first(qc, monkeypatch):
    """Given 3 nodes busy and the 4th the marked spare (spare_nodes=1), When a LOW job is
    queued, Then it waits without lend_spares; with it, a tick whose lend cannot be written
    (the holds changed meanwhile) launches nothing, and the next one writes the lend on the
    spare's hold, then starts the job there."""
    from gpu_recovery.domain import placement

    busy = [qc.submit(nnodes=1, gpus=8, priority=10) for _ in range(3)]
    assert qc.scheduler(spares=SparePool(1)).tick().admitted == busy
    [spare] = sorted(set(qc.sim.nodes) - {t.node for t in qc.live_tasks()})
    node = qc.sim.node(spare)
    read = qc.repo.cordons.worklist()
    assert qc.repo.cordons.set_holds(read, {node.container_instance_id: {
        "why": placement.SPARE, "job": "", "arn": node.container_instance_arn}}, qc.sim.now())
    low = qc.submit(nnodes=1, gpus=8, priority=0)
    assert qc.scheduler(spares=SparePool(1)).tick().admitted == []
    lending = qc.scheduler(spares=SparePool(1), lend_spares=True)
    with monkeypatch.context() as patch:
        patch.setattr(qc.repo.cordons, "set_holds", lambda *args, **kwargs: False)
        assert lending.tick().admitted == []
    assert qc.state(low) is JobState.QUEUED and spare not in {t.node for t in qc.live_tasks()}
    assert qc.scheduler(spares=SparePool(1), lend_spares=True).tick().admitted == [low]
    assert placement.lent_of(qc.repo.cordons.worklist().holds) == {node.container_instance_id: low}
    assert {t.node for t in qc.live_tasks()} == set(qc.sim.nodes)  # the spare runs it
