"""Steps the breaker's stage tests share (over the recovery fakes' World)."""

from __future__ import annotations

from gpu_recovery import constants as C
from gpu_recovery.constants import NotificationKind
from tests.recovery.fakes import World
from tests.recovery.remediation_steps import fault_with_reboot_verdict

PEER = "node-a"


def reboot_fault(w: World, arns: list[str]) -> None:
    """Rank 1 exits 1, its DCGM diag says reboot, then rank 0 (stopped by us) ends."""
    fault_with_reboot_verdict(w, arns)
    w.service.on_task_state_change(w.task_stopped(
        arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))


def sent(w: World, kind: NotificationKind) -> list[str]:
    """The bodies of the e-mails of ``kind`` sent so far."""
    return [n.body for n in w.notifier.sent if n.kind is kind]


def sweep_minutes(w: World, minutes: int) -> None:
    """``minutes`` sweeps, a minute (and a second) apart."""
    for _ in range(minutes):
        w.advance(61)
        w.service.sweep()


def running_on(w: World) -> list[str]:
    """The nodes the training tasks run on now, sorted."""
    return sorted(t.node for t in w.ecs.tasks.values()
                  if t.last_status == "RUNNING" and t.group != C.HEALTH_CHECK_GROUP)
