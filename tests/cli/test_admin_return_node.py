"""``gpu-recovery-admin return-node`` against the emulator (its tables and its simulated ECS
data plane): a repaired QUARANTINED or SUSPECT node back to service, through the stack's own
check or (``--without-check``) on the operator's word; ECS ACTIVE after the intent; a rerun
writes nothing; clear errors for what cannot be returned."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from cli.admin import main
from gpu_recovery.constants import DEADLINE_BUCKET, DEADLINE_PK, DEADLINE_SK, InstanceState
from gpu_recovery.domain.cordon import parse_sync_entry
from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.placement import UNAVAILABLE_ATTRIBUTE
from gpu_recovery.repository import to_ddb
from gpu_recovery.repository.validations import ACTIVATION_PENDING


@dataclass
class Cluster:
    world: Any
    node: Any  # the simulated ECS node

    @property
    def session(self) -> Any:
        from gpu_recovery.adapters import aws

        return aws.session()

    @property
    def node_id(self) -> str:
        return str(self.node.container_instance_id)

    def ecs(self) -> Any:
        return self.world.aws.client("ecs")

    def status(self) -> str:
        [found] = self.ecs().describe_container_instances(
            cluster=self.world.aws.cluster_name, containerInstances=[self.node.container_instance_arn]
        )["containerInstances"]
        return str(found["status"])

    def attributes(self) -> dict[str, str]:
        """The node's custom attributes in ECS (name -> value, "" for none)."""
        found = self.ecs().list_attributes(cluster=self.world.aws.cluster_name,
                                           targetType="container-instance")
        return {a["name"]: a.get("value", "") for a in found["attributes"]
                if a["targetId"] == self.node.container_instance_arn}

    def drain(self) -> None:
        self.ecs().update_container_instances_state(cluster=self.world.aws.cluster_name, status="DRAINING",
                                                    containerInstances=[self.node.container_instance_arn])

    def seed(self, state: InstanceState, **fields: Any) -> None:
        """The node's item as the stack left it (``fields`` on it besides)."""
        repo = self.world.repo
        assert repo.instances.put_instance_if_absent(Instance(self.node_id, state=state,
                                                              container_instance_arn=self.node.container_instance_arn))
        if fields:
            names = {f"#f{i}": k for i, k in enumerate(fields)}
            self.world.aws.resource("dynamodb").Table(repo.tables.instance_table_name).update_item(
                Key={"container_inst_id": self.node_id},
                UpdateExpression="SET " + ", ".join(f"#f{i} = :v{i}" for i in range(len(fields))),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues={f":v{i}": to_ddb(v) for i, v in enumerate(fields.values())})

    def pending_cordon_syncs(self) -> list[float]:
        """The node's cordon intents on the attribute worklist, by their version."""
        members = self.world.repo.cordons.pending().get(self.node_id, [])
        return [parsed[1] for member in members if (parsed := parse_sync_entry(member)) is not None]

    def item(self) -> dict[str, Any]:
        return dict(self.world.repo.instances.get_instance_item(self.node_id) or {})

    def tasks(self) -> list[str]:
        return list(self.ecs().list_tasks(cluster=self.world.aws.cluster_name,
                                          containerInstance=self.node.container_instance_arn)["taskArns"])

    def run(self, *argv: str, node: str | None = None) -> int:
        return main(["return-node", "--node-id", node or self.node_id, *argv], session=self.session)


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    from local_mode.world import build_world

    with build_world(handlers=False, extra_env={"POWERTOOLS_LOG_LEVEL": "CRITICAL"}) as world:
        monkeypatch.setenv("CONTAINER_INSTANCE_TABLE_NAME", world.aws.instance_table)
        monkeypatch.setenv("TRAINING_JOB_TABLE_NAME", world.aws.job_table)
        node = world.ecs.add_node("node-a", gpus=8)
        world.ecs.run_for(5)
        yield Cluster(world, node)


QUARANTINE = {"quarantine_reason": "DCGM: replace (row remap failure)", "drain_pending": False,
              "cordon": {"cause": "builtin:row-remap", "reason": "quarantined", "at": 1.0, "ecs": "applied"}}


def test_a_quarantined_node_goes_back_through_the_stacks_check(cluster: Cluster,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Given a repaired QUARANTINED node, DRAINING in ECS, When the operator returns it, Then its
    check is opened (SUSPECT, the operator's return its origin, due now, a history line with the
    reason and who), ECS sets it ACTIVE, no task is started; run again, it writes nothing and
    says so."""
    cluster.seed(InstanceState.QUARANTINED, quarantine_reason="DCGM: replace (row remap failure)")
    cluster.drain()
    assert cluster.run("--reason", "GPU 3 reseated, field diag passed") == 0
    err = capsys.readouterr().err
    assert "DRAINING in ECS: set ACTIVE" in err and "the recovery sweep starts the check" in err
    item = cluster.item()
    assert item["instance_state"] == "SUSPECT" and item["suspect_origin"] == "operator_return"
    assert item["validation"]["repair"] == "operator"
    assert item["validation"]["cause"] == "builtin:operator-return"
    assert DEADLINE_SK in item and "quarantine_reason" not in item
    [line] = item["history"]
    assert line["from"] == "QUARANTINED" and line["to"] == "SUSPECT" and "GPU 3 reseated" in line["reason"]
    assert line["actor"].startswith("arn:aws:")  # the caller's identity
    assert cluster.status() == "ACTIVE" and cluster.tasks() == []
    # Off every scheduler's placement while its check runs: its ``validating`` cordon in the same
    # write (with the worklist's member, the sweep's to confirm), its attribute put before ACTIVE.
    assert item["cordon"]["validating"] is True and item["cordon"]["ecs"] == "pending"
    assert item["cordon_version"] == item["cordon"]["at"]
    assert any(item["cordon_version"] == version for version in cluster.pending_cordon_syncs())
    assert cluster.attributes()[UNAVAILABLE_ATTRIBUTE] == "validating"

    assert cluster.run() == 0
    again = capsys.readouterr().err
    assert "returned already (its check runs since" in again and "nothing written" in again
    assert cluster.item() == item


def test_without_check_the_operator_vouches_for_the_node(cluster: Cluster,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Given a quarantined, cordoned node, When the operator returns it --without-check, Then one
    write makes it AVAILABLE, its quarantine, cordon and deadline cleared, a history line says
    who and why; ECS sets it ACTIVE; run again, nothing is written."""
    cluster.seed(InstanceState.QUARANTINED, **QUARANTINE, **{DEADLINE_PK: DEADLINE_BUCKET, DEADLINE_SK: 5.0})
    cluster.drain()
    assert cluster.run("--without-check", "--reason", "board replaced") == 0
    assert "without the stack's check: AVAILABLE" in capsys.readouterr().err
    item = cluster.item()
    assert item["instance_state"] == "AVAILABLE"
    for gone in ("quarantine_reason", "drain_pending", "cordon", DEADLINE_SK, "suspect_origin", "validation"):
        assert gone not in item, gone
    assert item["history"][-1]["reason"].endswith("without the stack's check: board replaced")
    assert cluster.status() == "ACTIVE"

    assert cluster.run("--without-check") == 0
    assert "nothing written" in capsys.readouterr().err
    assert cluster.item() == item


def test_a_rerun_finishes_what_a_crashed_run_started(cluster: Cluster,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Given a run whose ECS call failed after its write (here: a wrong --cluster), Then it exits
    1 saying to run it again; the rerun writes nothing more and sets the node ACTIVE."""
    cluster.seed(InstanceState.QUARANTINED, **QUARANTINE)
    cluster.drain()
    assert cluster.run("--cluster", "no-such-cluster") == 1
    assert "run the same command again" in capsys.readouterr().err
    item = cluster.item()
    assert item["instance_state"] == "SUSPECT" and cluster.status() == "DRAINING"
    assert item[ACTIVATION_PENDING] is True  # the ECS step a rerun finishes
    assert cluster.run() == 0
    assert cluster.status() == "ACTIVE"
    assert cluster.item() == {k: v for k, v in item.items() if k != ACTIVATION_PENDING}


@pytest.mark.parametrize("without_check", [False, True], ids=["with_check", "without_check"])
def test_a_rerun_after_a_finished_return_leaves_a_later_drain_alone(
        cluster: Cluster, without_check: bool, capsys: pytest.CaptureFixture[str]) -> None:
    """Given a return that finished (its ECS step confirmed) and the node drained by hand since,
    When the command runs again, Then it writes nothing and leaves the node DRAINING: only a
    step the intent still marks pending is finished by a rerun."""
    cluster.seed(InstanceState.QUARANTINED, **QUARANTINE)
    cluster.drain()
    flags = ["--without-check"] if without_check else []
    assert cluster.run(*flags) == 0
    item = cluster.item()
    assert cluster.status() == "ACTIVE" and ACTIVATION_PENDING not in item
    cluster.drain()
    capsys.readouterr()
    assert cluster.run(*flags) == 0
    assert "nothing written" in capsys.readouterr().err
    assert cluster.status() == "DRAINING" and cluster.item() == item


@pytest.mark.parametrize(("state", "fields", "said"), [
    (InstanceState.AVAILABLE, {}, "is AVAILABLE, not SUSPECT or QUARANTINED: it is in service already"),
    (InstanceState.REBOOTING, {}, "is REBOOTING, not SUSPECT or QUARANTINED: the stack is repairing it"),
    (InstanceState.SUSPECT, {"suspect_origin": "lost_node",
                             "validation": {"repair": "reconnect", "since": 1.0}},
     "a check is already running on node"),
    (InstanceState.QUARANTINED, {"terminate_pending": True}, "is being replaced"),
    (InstanceState.SUSPECT, {"suspect_origin": "lost_node", "deregistered_at": 1.0},
     "container instance was deregistered from the cluster"),
])
def test_what_cannot_be_returned_is_said_with_what_to_do(cluster: Cluster, capsys: pytest.CaptureFixture[str],
                                                         state: InstanceState, fields: dict[str, Any],
                                                         said: str) -> None:
    cluster.seed(state, **fields)
    before = cluster.item()
    assert cluster.run() == 1
    assert said in capsys.readouterr().err
    assert cluster.item() == before


def test_an_unknown_node_is_an_error(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    assert cluster.run(node="0123456789abcdef") == 1
    err = capsys.readouterr().err
    assert "no node '0123456789abcdef' in the instance table" in err and "--instance-table" in err
