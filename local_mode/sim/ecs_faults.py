"""GPU faults in the moto world's data plane: a node going bad under its training tasks (with
an NCCL cascade to the other ranks), and XIDs the node agent reports to the heartbeat
service before the tasks crash. Which tasks die, and the cascade, are the data plane's
(``DataPlane._gpu_fault``, the scale world's ``fail_gpu`` too); this module times them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..emulator import LocalAws
from ..health_verdicts import HEALTH_VALUES
from .bus import EventBus
from .ecs_model import Node
from .ecs_tasks import TaskLifecycle


class GpuFaults(TaskLifecycle):
    """Injected GPU faults and XIDs (see ``local_mode.sim.ecs``)."""

    def __init__(self, local: LocalAws, bus: EventBus, **options: Any) -> None:
        super().__init__(local, bus, **options)
        #: how an XID reaches the stack: (node name, report body) -> None; raises on failure
        self.gpu_reporter: Callable[[str, dict[str, Any]], Any] = self._report_gpu_to_service

    # ================================================================ faults
    def repair_does_not_hold(self, node: str, repairs: int = 1, *,
                             fails_after_seconds: float = 180.0) -> None:
        """The node's next ``repairs`` repairs do not hold (issue 43): after each (a reboot, a
        GPU reset) it passes idle checks, but a GPU load (a validation's) finds the fault again,
        and so does a training task ``fails_after_seconds`` into its work."""
        if repairs < 0 or fails_after_seconds <= 0:
            raise ValueError("repairs >= 0 and fails_after_seconds > 0")
        n = self.node(node)
        with self._lock:
            n.unheld_repairs, n.latent_after_seconds = repairs, fails_after_seconds
        self._log("fault", f"its next {repairs} repair(s) will not hold (fails again under load)", n.name)

    def inject_gpu_fault(
        self,
        node: str,
        at: float | None = None,
        after: float | None = None,
        health: str = "reboot_fixable",
        exit_code: int = 1,
        nccl_cascade: bool = False,
        cascade_delay_seconds: float = 5,
    ) -> None:
        """At ``at`` (abs) / ``after`` (rel): node's health becomes ``health`` and every
        training task on it exits ``exit_code``; with ``nccl_cascade`` the other ranks
        of the same jobs exit 1 ``cascade_delay_seconds`` later (NCCL errors)."""
        if health not in HEALTH_VALUES:
            raise ValueError(f"health is one of {HEALTH_VALUES}")
        n = self.node(node)

        def fault() -> list[dict[str, Any]]:
            self._log("fault", f"GPU fault injected (health: {health})", n.name)
            return self._gpu_fault(n, health=health, exit_code=exit_code, why="GPU fault injected",
                                   nccl_cascade=nccl_cascade, cascade_delay=cascade_delay_seconds)[1]

        self.schedule(self._when(at, after), fault, f"gpu fault {node}")

    def inject_xid(
        self,
        node: str,
        xid: int,
        at: float | None = None,
        after: float | None = None,
        *,
        gpu: int = 0,
        health: str = "reboot_fixable",
        exit_code: int | None = 1,
        nccl_cascade: bool = False,
        report_delay_seconds: float = 1,
        crash_delay_seconds: float = 3,
    ) -> None:
        """The driver logs ``XID <xid>`` on GPU ``gpu`` of ``node``: the node agent reports
        it (``report_delay_seconds`` later, through ``gpu_reporter``: the heartbeat service's
        ``report_gpu``, retried as the agent retries), and ``crash_delay_seconds`` after the
        XID every training task on the node exits ``exit_code`` (None: the XID kills no task;
        the node's health still becomes ``health`` for a later health check)."""
        if health not in HEALTH_VALUES:
            raise ValueError(f"health is one of {HEALTH_VALUES}")
        n = self.node(node)
        t = self._when(at, after)

        def logged() -> list[dict[str, Any]]:
            with self._lock:
                n.health = health
            self._log("fault", f"XID {xid} on GPU {gpu} (driver log; health: {health})", n.name)
            return []

        self.schedule(t, logged, f"xid {xid} {node}")
        self.schedule(t + report_delay_seconds, lambda: self._report_xid(n, xid, gpu, attempt=1),
                      f"agent reports xid {xid}")
        if exit_code is not None:
            self.schedule(t + crash_delay_seconds, lambda: self._xid_crash(n, xid, exit_code, nccl_cascade),
                          f"xid {xid} crash")

    def _xid_crash(self, n: Node, xid: int, exit_code: int, nccl_cascade: bool) -> list[dict[str, Any]]:
        return self._gpu_fault(n, health=None, exit_code=exit_code, why=f"CUDA error after XID {xid}",
                               nccl_cascade=nccl_cascade)[1]

    def gpu_report_body(self, n: Node, xids: dict[int, list[int]] | None = None) -> dict[str, Any]:
        """The node agent's ``/v1/report_gpu`` body (agent/README.md) for this node now, with
        the driver's warnings injected on it (``warn_gpu``)."""
        xids = xids or {}
        now = self.now()
        gpus = [{"index": i, "uuid": uuid, "pci_bus_id": f"00000000:{16 + i:02X}:00.0",
                 "utilization_gpu": 0, "memory_used_mib": 0, "memory_total_mib": 81920,
                 "temperature_c": 40, "ecc_uncorrected_volatile": 0, "remapped_rows_failure": False,
                 **n.gpu_report_fields(i, now), "xids": list(xids.get(i, []))}
                for i, uuid in enumerate(n.gpu_ids)]
        return {"node_id": n.container_instance_id, "timestamp": now, "gpus": gpus}

    # ======================================================== driver warnings
    def warn_gpu(self, node: str, *, gpu: int = 0, recovery_action: str | None = None,
                 remap_pending: bool = False, counter: str | None = None, per_hour: float = 0.0,
                 health: str | None = None) -> None:
        """The driver warns about GPU ``gpu`` of ``node`` now, while it still runs: its recovery
        action, a pending row remap, or ``counter`` rising ``per_hour``. The node's health
        becomes what a diag or a repair of that warning finds (``health``; default: a reset
        clears a reset request or a pending remap, a reboot the rest). The node agent reports
        it with its GPU report (``report_gpu_state``, or ``SimulatedNodeAgents`` each round)."""
        n = self.node(node)
        now = self.now()
        with self._lock:
            state = n.gpu_state.setdefault(gpu, {})
            if recovery_action is not None:
                state["recovery_action"] = recovery_action
            if remap_pending:
                state["remap_pending"] = True
            if counter is not None:
                state.setdefault("counters", {})[counter] = [1, float(per_hour), now]
            resettable = (recovery_action in ("gpu_reset", "drain_and_reset") or remap_pending
                          or counter == "ecc_corrected_volatile")
            if health is not None:
                n.health = health
            elif n.health == "healthy":
                n.health = "reset_fixable" if resettable else "reboot_fixable"
        what = (f"recovery action {recovery_action}" if recovery_action
                else "row remap pending" if remap_pending else f"{counter} rising {per_hour:g}/h")
        self._log("fault", f"driver warning on GPU {gpu}: {what} (health: {n.health})", n.name)

    def report_gpu_state(self, node: str, attempt: int = 1) -> list[dict[str, Any]]:
        """The node agent's GPU report of ``node`` now (retried as the agent retries)."""
        n = self.node(node)
        try:
            self.gpu_reporter(n.name, self.gpu_report_body(n))
        except Exception as error:
            if attempt >= 5:
                self._log("agent", f"report_gpu failed {attempt} times: {error}", n.name)
                return []
            self.schedule(self.now() + 2, lambda: self.report_gpu_state(node, attempt + 1), "report retry")
            return []
        self._log("agent", "node agent reported its GPUs (POST /v1/report_gpu)", n.name)
        return []

    def _report_xid(self, n: Node, xid: int, gpu: int, attempt: int) -> list[dict[str, Any]]:
        body = self.gpu_report_body(n, {gpu: [xid]})
        try:
            self.gpu_reporter(n.name, body)
        except Exception as error:  # the agent retries a failed report (and keeps the XID)
            if attempt >= 5:
                self._log("agent", f"report_gpu failed {attempt} times, XID {xid} lost: {error}", n.name)
                return []
            self.schedule(self.now() + 2, lambda: self._report_xid(n, xid, gpu, attempt + 1), "report retry")
            return []
        with self._lock:
            self.gpu_reports.append((self.now(), n.name, xid))
        self._log("agent", f"node agent reported XID {xid} on GPU {gpu} (POST /v1/report_gpu)", n.name)
        return []

    def _report_gpu_to_service(self, node: str, body: dict[str, Any]) -> Any:
        """What the node API does with a GPU report from the node's agent (its token's node):
        the route's checks (parser model, node, clock skew), then the heartbeat service."""
        from handlers import node_api

        return node_api.accept_gpu_report(body, self.node(node).container_instance_id, node_api.service())
