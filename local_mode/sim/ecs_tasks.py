"""The task lifecycle of the simulated data plane: PENDING, RUNNING, a planned or injected
exit, STOPPED (with the moto task kept in step), the DCGM verdict of a health check, and a
node's reboot killing what runs on it."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

from gpu_recovery import constants as C

from .. import events as ev
from ..health_verdicts import HEALTH_CHECK_LOG_GROUP, RESET_FIXES
from .ecs_core import EcsCore
from .ecs_model import Node, Plan, Task, describe_task, health_check_verdict


class TaskLifecycle(EcsCore):
    """Tasks from placement to STOPPED, and reboots (see ``local_mode.sim.ecs``)."""

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

    def plan_family(
        self, family: str, run_seconds: float | None, exit_code: int = 0
    ) -> None:
        """Tasks of ``family`` started from now on run ``run_seconds`` (None: until
        stopped) after RUNNING, then exit ``exit_code``."""
        with self._lock:
            self._family_plans[family] = Plan(run_seconds, exit_code)

    def plan_task(self, task_arn: str, run_seconds: float | None, exit_code: int = 0) -> None:
        """Re-plan one task: exit ``exit_code`` ``run_seconds`` from now (None: never)."""
        with self._lock:
            task = self.tasks.get(task_arn)
            if task is None:
                self._task_plans[task_arn] = Plan(run_seconds, exit_code)
                return
            task.plan_token += 1
            token = task.plan_token
        if run_seconds is not None:
            self.schedule(
                self.now() + run_seconds,
                lambda: self._planned_exit(task_arn, token, exit_code),
                f"planned exit {task_arn}",
            )

    # ================================================================ reboot
    def reboot(self, node: str) -> None:
        """Reboot a node as if the API had been called (no API call)."""
        self._reboot(self.node(node), "direct")

    def _reboot(self, node: Node, via: str) -> None:
        requested = self.now()
        with self._lock:
            self.counters["reboots"] += 1
            if via.startswith("EC2"):
                self.counters["reboots_ec2"] += 1
            elif via.startswith("SSM"):
                self.counters["reboots_ssm"] += 1
            if not node.request_reboot(requested):
                self._log("reboot", f"reboot requested again via {via} (already rebooting)",
                          node.name)
                return
        self._log("reboot", f"reboot requested via {via}", node.name)

        def kill() -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            for task in self.running_tasks(node.name):
                out += self._finish(
                    task,
                    exit_code=137,
                    stop_code="EssentialContainerExited",
                    reason=node.reboot_stop_reason,
                    why="host rebooted",
                )
            return out

        def down() -> list[dict[str, Any]]:
            node.agent_connected = False
            self._log("agent", "agent disconnected (rebooting)", node.name)
            return [self._ci_event(node)]

        def up() -> list[dict[str, Any]]:
            with self._lock:
                before = node.back_from_reboot(self.now())
            self._log("agent", f"back after reboot, agent connected (health {before} -> "
                      f"{node.health})", node.name)
            return [self._ci_event(node)]

        self.schedule(requested + 5, kill, "reboot kill")
        self.schedule(requested + self.disconnect_delay_seconds, down, "reboot down")
        self.schedule(requested + self.reboot_seconds, up, "reboot up")

    # ================================================================ task lifecycle
    def _task_description(self, task: Task) -> dict[str, Any]:
        return describe_task(task, self.nodes[task.node], self.local.cluster_arn, self.local.region)

    def _task_event(self, task: Task) -> dict[str, Any]:
        with self._lock:
            task.version += 1
            task.updated_at = self.now()
            desc = self._task_description(task)
        return ev.task_state_change(desc, time=self.now())

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

    def _to_pending(self, task: Task) -> list[dict[str, Any]]:
        if task.done or task.last_status != "PENDING":
            return []
        return [self._task_event(task)]

    def _to_running(self, task: Task) -> list[dict[str, Any]]:
        with self._lock:
            if task.done or task.desired_status != "RUNNING":
                return []
            task.mark_running(self.now())
            self._sync_moto(task)
            plan = self._task_plans.pop(task.arn, None) or self._family_plans.get(task.family)
            if task.gpu_reset:
                plan = plan or Plan(self.reset_seconds, -2)  # -2: the reset's result on this node
            elif task.health_check:
                plan = plan or Plan(self.dcgm_seconds, -1)  # -1: node verdict
            else:
                plan = plan or Plan(self.train_seconds, 0)
            token = task.plan_token
        self._log("task", f"{task.label} RUNNING", task.node)
        if plan.run_seconds is not None:
            self.schedule(
                self.now() + plan.run_seconds,
                lambda: self._planned_exit(task.arn, token, plan.exit_code),
                "planned exit",
            )
        return [self._task_event(task)]

    def _planned_exit(self, arn: str, token: int, exit_code: int) -> list[dict[str, Any]]:
        task = self.tasks.get(arn)
        if task is None or task.done or task.plan_token != token:
            return []
        if task.gpu_reset and exit_code == -2:
            return self._reset_result(task)
        if task.health_check and exit_code == -1:
            node = self.nodes[task.node]
            level = int(self.local.env.get(C.ENV_DCGM_LEVEL, "2"))
            verdict, stream, line = health_check_verdict(task, node, level)
            self._write_verdict_log(stream, line)
            return self._container_exit(task, verdict, f"DCGM verdict {node.health}")
        return self._container_exit(task, exit_code, "finished" if exit_code == 0 else "planned")

    def _reset_result(self, task: Task) -> list[dict[str, Any]]:
        """The reset task's exit: 0 when a reset clears the node's health (it is healthy
        after), 1 when not (the fault stays for the reboot)."""
        node = self.nodes[task.node]
        with self._lock:
            before = node.health
            if before in RESET_FIXES:
                node.health = "healthy"
        self._log("task", f"GPU reset: health {before} -> {node.health}", node.name)
        if before in RESET_FIXES:
            return self._container_exit(task, 0, "GPUs reset, diag passed")
        return self._container_exit(task, 1, f"GPU reset failed ({before})")

    def _container_exit(self, task: Task, exit_code: int, why: str) -> list[dict[str, Any]]:
        """The essential container exited: STOPPED (EssentialContainerExited)."""
        if task.done:
            return []
        return self._finish(
            task,
            exit_code=exit_code,
            stop_code="EssentialContainerExited",
            reason="Essential container in task exited",
            why=why,
        )

    def _finish(
        self,
        task: Task,
        *,
        exit_code: int | None,
        stop_code: str,
        reason: str,
        why: str,
    ) -> list[dict[str, Any]]:
        with self._lock:
            if task.done:
                return []
            task.mark_stopped(self.now(), exit_code, stop_code, reason)
            node = self.nodes[task.node]
            node.allocations.pop(task.arn, None)
            if task.arn not in self._moto_stopped:
                with contextlib.suppress(Exception):  # moto bookkeeping only
                    self._backend.stop_task(self.local.cluster_name, task.arn, task.stopped_reason)
                self._moto_stopped.add(task.arn)
            self._sync_moto(task)
        code = "" if task.exit_code is None else f" exited {task.exit_code}"
        self._log("task", f"{task.label}{code or ' stopped'} ({why})", task.node)
        out = [self._task_event(task)]
        if self.instance_events_on_placement:
            out.append(self._ci_event(node))
        return out

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
