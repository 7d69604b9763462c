"""The fault storm of issue 19 under the emulator: a 16-node cluster kept full by the queue,
4 nodes faulting (XID 79) within 10 minutes, the breaker tripping on the 4th. No job may
be placed on a node known to be bad (rebooting, or held by the breaker), and the held node
carries the ECS cordon attribute that placement constraints use. The queue jobs move; the
one job that cannot move (tag-registered, not relocatable) on the held node waits HELD,
not failed; no job fails for a node already known to be bad."""

from __future__ import annotations

from contextlib import contextmanager

from gpu_recovery import constants as C
from gpu_recovery.adapters import aws
from gpu_recovery.constants import InstanceState, JobState
from gpu_recovery.domain.cordon import CORDON_ATTRIBUTE
from tests.fixtures.queue_cluster import make_queue_cluster

MIN = 60.0


def _cordoned_in_ecs(qc) -> set[str]:
    listed = aws.client("ecs").list_attributes(cluster=qc.local.cluster_name, targetType="container-instance",
                                               attributeName=CORDON_ATTRIBUTE)
    ids = {a["targetId"].rsplit("/", 1)[-1] for a in listed.get("attributes", [])}
    return {name for name, node in qc.sim.nodes.items() if node.container_instance_id in ids}


def test_a_fault_storm_places_nothing_on_a_held_or_rebooting_node() -> None:
    with contextmanager(make_queue_cluster)(nodes=[8] * 16, sweep=True) as qc:
        qc.sim.start_job("pinned", qc.train_td, ["node-7"])  # tag-registered, not relocatable
        jobs = [qc.submit(nnodes=1, gpus=8) for _ in range(24)]
        assert len(qc.scheduler().tick().admitted) == 15  # the cluster is full, 9 wait
        faulty = ["node-1", "node-3", "node-5", "node-7"]
        for k, name in enumerate(faulty):
            qc.sim.inject_xid(name, 79, after=(1 + 2 * k) * MIN)
        seen = {t.arn for t in qc.live_tasks()}
        bad_placements: list[str] = []
        for _ in range(14):
            # What the loop knows before the tick: nodes not AVAILABLE, or cordoned.
            instances = qc.repo.instances.get_instances([qc.sim.node(n).container_instance_id
                                                          for n in qc.sim.nodes])
            bad = {name for name in qc.sim.nodes
                   if (inst := instances.get(qc.sim.node(name).container_instance_id)) is not None
                   and (inst.state is not InstanceState.AVAILABLE or inst.cordoned)}
            qc.scheduler().tick()
            for task in qc.live_tasks():
                if task.arn not in seen:
                    seen.add(task.arn)
                    if task.node in bad:
                        bad_placements.append(f"{task.tags.get(C.TAG_JOB_ID)} on {task.node}")
            qc.sim.run_for(MIN)
        breaker = qc.repo.breaker.read() or {}
        held = qc.repo.instances.get_instance(qc.sim.node("node-7").container_instance_id)
        assert breaker.get("state") == "tripped"
        assert held.state is InstanceState.SUSPECT and held.cordoned
        assert _cordoned_in_ecs(qc) == {"node-7"}  # the rebooted ones are back: uncordoned
        assert bad_placements == []
        assert not [t for t in qc.live_tasks() if t.node == "node-7"]
        failed = [j for j in jobs if qc.state(j) is JobState.FAILED]
        assert failed == [], [qc.item(j).get("last_error") for j in failed]
        pinned = qc.repo.jobs.get_job("pinned")
        assert (pinned.state, pinned.recoveries_used) == (JobState.HELD, 0), pinned.last_error
        assert pinned.breaker_hold is not None and pinned.breaker_hold.nodes == (held.container_inst_id,)
