"""The moto world's side of the task lifecycle (:class:`~local_mode.sim.ecs_data_plane.DataPlane`
runs it): moto's task kept in step with the data plane's, the events as moto's control plane
describes tasks, the verdict line in moto's CloudWatch Logs, reboots counted by the API that
asked for them, and a task exit injected by a scenario."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

from gpu_recovery import constants as C

from .. import events as ev
from ..health_verdicts import HEALTH_CHECK_LOG_GROUP
from .ecs_core import EcsCore
from .ecs_model import Node, Task, describe_task


class TaskLifecycle(EcsCore):
    """The moto world's hooks of the task lifecycle (see ``local_mode.sim.ecs``)."""

    def inject_task_exit(
        self,
        task_arn: str,
        exit_code: int,
        at: float | None = None,
        after: float | None = None,
        why: str = "injected",
    ) -> None:
        """The task's essential container exits with ``exit_code`` at that time."""

        def go() -> list[dict[str, Any]]:
            task = self.tasks.get(task_arn)
            return self._container_exit(task, exit_code, why) if task else []

        self.schedule(self._when(at, after), go, f"exit {task_arn}")

    def reboot(self, node: str) -> None:
        """Reboot a node as if the API had been called (no API call)."""
        self._reboot(self.node(node), "direct")

    # ================================================================ hooks
    def _count_reboot(self, node: Node, via: str) -> None:
        self.counters["reboots"] += 1
        if via.startswith("EC2"):
            self.counters["reboots_ec2"] += 1
        elif via.startswith("SSM"):
            self.counters["reboots_ssm"] += 1

    def _task_description(self, task: Task) -> dict[str, Any]:
        return describe_task(task, self.nodes[task.node], self.local.cluster_arn, self.local.region)

    def _task_state_change(self, task: Task) -> dict[str, Any]:
        return ev.task_state_change(self._task_description(task), time=self.now())

    def _control_plane_running(self, task: Task) -> None:
        self._sync_moto(task)
        for started in list(self.container_start_listeners):
            started(task)

    def _control_plane_stopped(self, task: Task) -> None:
        if task.arn not in self._moto_stopped:
            with contextlib.suppress(Exception):  # moto bookkeeping only
                self._backend.stop_task(self.local.cluster_name, task.arn, task.stopped_reason)
            self._moto_stopped.add(task.arn)
        self._sync_moto(task)

    def _sync_moto(self, task: Task) -> None:
        moto_task = self._backend.tasks.get(self.local.cluster_name, {}).get(task.arn)
        if moto_task is None:
            return
        moto_task.last_status = task.last_status
        moto_task.desired_status = task.desired_status
        moto_task.stopped_reason = task.stopped_reason or ""
        moto_task.stop_code = task.stop_code
        for attr, value in (
            ("started_at", task.started_at),
            ("stopping_at", task.stopping_at),
            ("stopped_at", task.stopped_at),
            ("created_at", task.created_at),
        ):
            setattr(moto_task, attr, datetime.fromtimestamp(value, tz=UTC) if value else None)
        for mc, sc in zip(moto_task.containers, task.containers, strict=False):
            mc.last_status = sc["lastStatus"]
            mc.exitCode = sc.get("exitCode")

    def _dcgm_level(self) -> int:
        return int(self.local.env.get(C.ENV_DCGM_LEVEL, "2"))

    def _write_verdict_log(self, stream: str, line: str) -> None:
        try:
            logs = self.local.client("logs")
            logs.create_log_stream(logGroupName=HEALTH_CHECK_LOG_GROUP, logStreamName=stream)
            logs.put_log_events(
                logGroupName=HEALTH_CHECK_LOG_GROUP,
                logStreamName=stream,
                logEvents=[{"timestamp": int(self.now() * 1000), "message": line}],
            )
        except Exception:  # noqa: S110 - optional nicety
            pass
