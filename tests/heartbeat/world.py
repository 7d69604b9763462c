"""The heartbeat tests' world: a settable clock, stubs of the ports, the service over moto
(through local mode's LocalAws); the fixtures in conftest.py build it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import runtime
from gpu_recovery.adapters import aws
from gpu_recovery.constants import (
    DEFAULT_NODE_TOKEN_TABLE_NAME,
    JOB_PK,
    InstanceState,
    JobState,
    NotificationKind,
    RankState,
    job_item_key,
)
from gpu_recovery.domain.fault_catalog import FaultCatalog
from gpu_recovery.domain.heartbeat_policy import HeartbeatSettings, ReportedTask
from gpu_recovery.domain.models import Instance, Job, Rank
from gpu_recovery.events.ecs import EcsTaskDetail
from gpu_recovery.heartbeat.service import HeartbeatService
from gpu_recovery.heartbeat.tokens import TokenStore
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.repository import Update
from gpu_recovery.repository.heartbeat import HeartbeatRepository
from gpu_recovery.repository.time_sharing import HoldingRepository, QuotaCharge, QuotaRepository
from local_mode.emulator import LocalAws
from tests.fixtures.clock import ManualClock

NODE = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
NODE_B = "1a2b3c4d5e6f70819293a4b5c6d7e8f9"
T0 = 1_734_220_000.0
CLUSTER_ARN = "arn:aws:ecs:us-east-1:123456789012:cluster/gpu-cluster"


def node_arn(node: str) -> str:
    return f"arn:aws:ecs:us-east-1:123456789012:container-instance/gpu-cluster/{node}"


NODE_ARN = node_arn(NODE)


def task_arn(job: str, rank: int, attempt: int = 1) -> str:
    return f"arn:aws:ecs:us-east-1:123456789012:task/gpu-cluster/{job}r{rank}a{attempt}"


class StubEcs:
    """ECS port for the escalation paths (agentConnected decides)."""

    def __init__(self, connected: bool = True) -> None:
        self.connected = connected
        self.drained: list[str] = []
        self.stopped: list[str] = []
        self.described: list[str] = []

    def describe_container_instance(self, ci: str) -> dict[str, Any] | None:
        self.described.append(ci)
        return {"containerInstanceArn": f"arn:aws:ecs:us-east-1:123456789012:container-instance/"
                                        f"gpu-cluster/{ci.rsplit('/', 1)[-1]}",
                "ec2InstanceId": "i-0123456789abcdef0", "agentConnected": self.connected}

    def drain(self, arn: str) -> str:
        self.drained.append(arn)
        return "draining"

    def put_attributes(self, arn: str, attributes: Mapping[str, str]) -> bool:
        self.cordoned = [*getattr(self, "cordoned", []), arn]
        return True

    def delete_attributes(self, arn: str, names: Sequence[str]) -> bool:
        self.uncordoned = [*getattr(self, "uncordoned", []), arn]
        return True

    def put_attributes_many(self, entries: Sequence[tuple[str, str, str]]) -> set[str]:
        for target, name, value in entries:
            self.put_attributes(target, {name: value})
        return set()

    def delete_attributes_many(self, entries: Sequence[tuple[str, str]]) -> set[str]:
        for target, name in entries:
            self.delete_attributes(target, [name])
        return set()

    def stop_task(self, arn: str, reason: str) -> None:
        self.stopped.append(arn)


@dataclass
class StubRecovery:
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    from_states: list[Any] = field(default_factory=list)
    boots: list[tuple[str, float]] = field(default_factory=list)
    unreachable: list[tuple[str, str, bool]] = field(default_factory=list)  # node decisions asked

    def report_suspected_fault(self, job_id: str, attempt: int, inst_id: str, reason: str,
                               failing_rank: int | None = None, from_states: Any = None) -> Any:
        self.calls.append((job_id, attempt, inst_id, reason))
        self.from_states.append(list(from_states or []))
        return None

    def on_boot_reported(self, inst_id: str, boot_time: float) -> Any:
        self.boots.append((inst_id, boot_time))
        return None

    def live_after_lost_stops(self, ranks: list[Any]) -> list[Any]:
        return list(ranks)  # no task found ended: every lost rank still live

    def node_unreachable(self, job_id: str, attempt: int, inst_id: str, lost: Any, lost_since: float,
                         why: str, host_reporting: bool = False) -> str:
        self.unreachable.append((job_id, inst_id, host_reporting))
        return "raced"  # decided nothing: the job stays NODE_LOST


@dataclass
class StubNotifier:
    sent: list[Any] = field(default_factory=list)

    def publish(self, notification: Any) -> str:
        self.sent.append(notification)
        return f"m-{len(self.sent)}"


class World:
    """Tables in moto plus helpers to seed jobs and drive the service."""

    def __init__(self, local: LocalAws, clk: ManualClock) -> None:
        self.local = local
        self.clock = clk
        self.repo = runtime.repository()
        self.ddb = local.client("dynamodb")
        self.ecs = StubEcs()
        self.recovery = StubRecovery()
        self.notifier = StubNotifier()
        self.tokens = TokenStore(aws.resource("dynamodb").Table(DEFAULT_NODE_TOKEN_TABLE_NAME))

    def service(self, catalog: FaultCatalog | None = None, **settings: Any) -> HeartbeatService:
        notices = Notices(self.repo.notices, self.repo.faults, self.notifier)
        return HeartbeatService(HeartbeatRepository(self.repo), HeartbeatSettings(**settings), self.ecs,
                                notices, lambda: self.recovery, catalog=catalog)

    def seed_job(self, job_id: str, world_size: int = 2, nodes: tuple[str, ...] = (NODE,),
                 state: JobState = JobState.RUNNING, rank_state: RankState = RankState.RUNNING,
                 attempt: int = 1) -> list[Rank]:
        now = self.clock()
        self.repo.registrations.create_job_if_absent(Job(job_id, state, world_size, attempt=attempt,
                                           created_at=now, updated_at=now))
        ranks = []
        for r in range(world_size):
            node = nodes[r % len(nodes)]
            self.repo.instances.put_instance_if_absent(Instance(
                node, container_instance_arn=f"arn:aws:ecs:us-east-1:123456789012:container-instance/"
                                             f"gpu-cluster/{node}", ec2_instance_id=f"i-{node[:17]}"))
            rank = Rank(job_id, r, rank_state, attempt, task_arn(job_id, r, attempt),
                        "arn:aws:ecs:us-east-1:123456789012:task-definition/train:1", node,
                        registered_at=now)
            assert self.repo.registrations.put_rank_registration(rank)
            ranks.append(rank)
        return ranks

    def item(self, key: str) -> dict[str, Any]:
        from gpu_recovery.repository import from_ddb

        table = aws.resource("dynamodb").Table(self.repo.tables.job_table_name)
        return from_ddb(table.get_item(Key={"job_id_rank": key}, ConsistentRead=True).get("Item", {}))

    def node_item(self, node: str) -> dict[str, Any]:
        from gpu_recovery.repository import from_ddb

        table = aws.resource("dynamodb").Table(self.repo.tables.instance_table_name)
        return from_ddb(table.get_item(Key={"container_inst_id": node}, ConsistentRead=True).get("Item", {}))

    def job_state(self, job_id: str) -> JobState:
        job = self.repo.jobs.get_job(job_id)
        assert job is not None
        return job.state

    def rank_state(self, job_id: str, rank: int) -> RankState:
        found = self.repo.jobs.get_rank(job_id, rank)
        assert found is not None
        return found.state

    def instance_state(self, node: str) -> InstanceState:
        inst = self.repo.instances.get_instance(node)
        assert inst is not None
        return inst.state

    def report(self, svc: HeartbeatService, node: str, *tasks: ReportedTask | str,
               at: float | None = None) -> Any:
        items = [t if isinstance(t, ReportedTask) else ReportedTask(task_arn=t) for t in tasks]
        return svc.report_tasks(node, self.clock() if at is None else at, items)


class RecoveryLoop:
    """The real recovery loop on a heartbeat world's tables (its ECS, reboot API and verdicts
    faked: the node's ECS agent disconnected until a test reconnects it, ``cluster_nodes`` spare
    nodes), the heartbeat service handing over to it: the node-lost paths that end in a node
    decision. ``repo``: the loop's repository, whose calls a test may break (``Flaky``)."""

    def __init__(self, world: Any, remediation: Any = None, *, cluster_nodes: int = 0) -> None:
        from gpu_recovery.domain.remediation_settings import RemediationSettings
        from gpu_recovery.recovery import RecoveryService
        from gpu_recovery.settings import Settings
        from tests.recovery.fakes import FakeEcs, FakeRebooter, FakeVerdicts, Flaky

        self.world = world
        self.ecs = FakeEcs()
        self.ecs.agent_connected[NODE] = False
        self.ecs.spare_nodes = [f"spare-{i}" for i in range(cluster_nodes)]
        self.repo = Flaky(world.repo)
        tables = world.repo.tables
        settings = Settings(tables.job_table_name, tables.instance_table_name, "gpu-cluster",
                            "gpu-health-check", "topic", remediation=remediation or RemediationSettings())
        self.service = RecoveryService(self.repo, self.ecs, FakeRebooter(), world.notifier,  # type: ignore[arg-type]
                                       FakeVerdicts(), settings)
        world.ecs.connected = False
        self.heartbeat = HeartbeatService(HeartbeatRepository(world.repo),
                                          HeartbeatSettings(node_lost_fail_seconds=600), world.ecs,
                                          Notices(world.repo.notices, world.repo.faults, world.notifier),
                                          lambda: self.service)

    def fail_the_check(self, check: Any, origin: str) -> dict[str, Any]:
        """The stack's check of NODE (no repair before it: a lost node's, an operator's return)
        finds a DCGM fault (exit 2): no failed repair (no node decision, history, reboot, drain or
        breaker entry), the node kept SUSPECT for a person (``origin``) with the check's evidence
        and, last, one e-mail. Its item."""
        assert self.service.on_health_check_stopped(self.stopped(check, 2)).action == "validation_failed"
        assert self.world.instance_state(NODE) is InstanceState.SUSPECT
        node: dict[str, Any] = self.world.node_item(NODE)
        assert node["suspect_origin"] == origin
        assert node["last_validation"]["result"] == "failed" and node["last_verdict"]["exit_code"] == 2
        assert "fault_history" not in node and "validation" not in node and "reboot_requested_at" not in node
        assert self.ecs.drained == [] and self.service.repo.breaker.read() is None
        assert [n.kind for n in self.world.notifier.sent][-1] is NotificationKind.VALIDATION_FAILED
        return node

    def checks(self, node: str = NODE) -> list[Any]:
        """The stack's checks (validation tasks) started on ``node``."""
        from gpu_recovery.constants import GPU_VALIDATION_GROUP

        return [t for t in self.ecs.tasks.values() if t.node == node and t.group == GPU_VALIDATION_GROUP]

    @staticmethod
    def stopped(task: Any, exit_code: int) -> Any:
        """``task`` (a check on NODE) stopped with ``exit_code``: its STOPPED event's detail."""
        from tests.recovery.fakes import EVENTS

        task.last_status, task.exit_code = "STOPPED", exit_code
        detail = json.loads((EVENTS / "health_check_task_stopped.json").read_text())["detail"]
        detail.update(taskArn=task.arn, clusterArn=CLUSTER_ARN, containerInstanceArn=NODE_ARN,
                      startedBy=task.started_by, group=task.group, taskDefinitionArn=task.task_definition_arn)
        detail["containers"][0]["exitCode"] = exit_code
        return EcsTaskDetail.model_validate(detail)


def rank_stopped(job: str, rank: int, node: str, *, reason: str = "gpu-recovery: node lost") -> EcsTaskDetail:
    """ECS's STOPPED event of a rank's task the stack stopped (its container killed: exit 143)."""
    from tests.recovery.fakes import EVENTS

    detail = json.loads((EVENTS / "training_task_stopped_exit1.json").read_text())["detail"]
    detail.update(taskArn=task_arn(job, rank), clusterArn=CLUSTER_ARN, containerInstanceArn=node_arn(node),
                  stopCode="UserInitiated", stoppedReason=reason)
    detail["containers"][0]["exitCode"] = 143
    return EcsTaskDetail.model_validate(detail)


def charge_quota(world: Any, job_id: str, nodes: int = 1) -> HoldingRepository:
    """The queue job holds ``nodes`` nodes of alice's quota (as the scheduler's launch claim wrote)."""
    quotas = QuotaRepository(aws.resource("dynamodb"), world.local.quota_table)
    holding = HoldingRepository(world.repo.jobs, quotas)
    charge = QuotaCharge("alice", 0, nodes)
    assert world.repo.tables.db.transact([
        Update(table=world.repo.tables.job_table_name, key={JOB_PK: job_item_key(job_id)},
               set_fields={"source": "queue", **holding.charge_fields(charge, world.clock())}),
        holding.quotas.charge_update(charge, limit_read=None, default_limit=None)])
    return holding


def charge_released(world: Any, holding: HoldingRepository, job_id: str) -> None:
    """The scheduler's tick releases the quota charge of the job (it holds no nodes any more)."""
    from gpu_recovery.queue.time_sharing import TimeSharing
    from gpu_recovery.settings import TimeSharingSettings

    sharing = TimeSharing(world.repo.latches, holding, None, TimeSharingSettings())  # type: ignore[arg-type]
    assert sharing.housekeeping(world.clock())["released"] == [job_id]
    assert int(holding.quotas.get("alice", 0)["used_nodes"]) == 0
