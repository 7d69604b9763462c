"""Every repair and hold the simulated cluster carried out, judged against the truth the
simulation alone knows: was the node's hardware healthy at that moment? (issue 49)

The stack never sees this truth; it sees evidence (exit codes, XIDs, DCGM verdicts,
preflight tables). A repair of a node whose simulated hardware was healthy is a **false
repair**: the figure no vendor publishes, which every campaign holds at zero.

What counts, recorded where the simulated AWS carries it out (whoever asked):

* ``reboot`` — a reboot starts (EC2 RebootInstances, the SSM reboot; asked again while the
  node reboots is the same reboot);
* ``gpu_reset`` — the GPU reset task is placed on the node;
* ``quarantine`` — the container instance is set DRAINING (the stack drains to quarantine or
  replace a node, and the nodes of a Capacity Block AWS announced it ends: those drains are on
  AWS's word that the capacity goes, not on evidence about the hardware, and are not counted);
* ``replace`` — the instance is terminated in its Auto Scaling group;
* ``cordon`` — ``gpu-recovery.unavailable=cordoned`` (known bad) held longer than a check
  (:data:`CORDON_MARGIN_SECONDS` past the DCGM check's own time) on a node healthy when it
  was cordoned. Reservations and spares (the attribute's other values) keep nodes for a
  job, they condemn none: not counted.

A node is **healthy** (:func:`hardware_healthy`) when it has power (``Node.powered``), its
GPUs are healthy (``Node.health``, no fault left latent by a repair that did not hold), its
driver warns of nothing (no
recovery action, pending remap or rising counter: ``Node.gpu_state``) and no fabric fault
(a slow node or network, a degraded link, a hang) touches it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpu_recovery.domain import placement

from .ecs_model import Node
from .fabric import Fabric

REPAIRS = ("reboot", "gpu_reset", "quarantine", "replace", "cordon")
#: a cordon of a healthy node longer than the DCGM check plus this is a hold, not a suspicion
CORDON_MARGIN_SECONDS = 600.0
_CORDON = f"{placement.UNAVAILABLE_ATTRIBUTE}={placement.CORDONED}"


def hardware_healthy(node: Node, fabric: Fabric) -> bool:
    """The simulation's truth: nothing is wrong with the node's hardware now."""
    if node.health != "healthy" or node.latent is not None or not node.powered:
        return False
    if any(state for state in node.gpu_state.values()):
        return False
    return not any(node.name in fault.nodes for fault in fabric.faults)


@dataclass(frozen=True)
class Repair:
    at: float
    node: str
    action: str  # one of REPAIRS
    healthy: bool  # the node's hardware, when it was done
    via: str = ""
    seconds: float = 0.0  # a cordon's length (to the end of the run when still on)

    def __str__(self) -> str:
        held = f" for {self.seconds:.0f} s" if self.action == "cordon" else ""
        return f"{self.action} of {'healthy ' if self.healthy else ''}{self.node}{held} ({self.via})"


@dataclass
class RepairLedger:
    """What was done to which node, and whether it was healthy then (``SimulatedEcs.repairs``)."""

    now: Callable[[], float]
    fabric: Callable[[], Fabric]
    check_seconds: float
    done: list[Repair] = field(default_factory=list)
    #: node -> (since, healthy then) of a cordon on now
    cordoned: dict[str, tuple[float, bool]] = field(default_factory=dict)
    #: repairs before this time are the scenario's set-up (``mark``), not counted
    since: float = 0.0

    def record(self, node: Node, action: str, via: str = "") -> None:
        if action not in REPAIRS:
            raise ValueError(f"action is one of {REPAIRS}")
        if action == "quarantine" and getattr(node, "taken_at", None) is not None:
            return  # AWS announced it takes the node: its drain condemns nothing
        self.done.append(Repair(self.now(), node.name, action, hardware_healthy(node, self.fabric()), via))

    def mark(self) -> None:
        """From now on (the flow starts): earlier repairs are the set-up's."""
        self.since = self.now()

    def attribute(self, node: Node, name: str, value: str | None) -> None:
        """The placement attribute put (``value``) or deleted (None) on ``node``."""
        if name != placement.UNAVAILABLE_ATTRIBUTE:
            return
        if value == placement.CORDONED:
            self.cordoned.setdefault(node.name, (self.now(), hardware_healthy(node, self.fabric())))
            return
        started = self.cordoned.pop(node.name, None)
        if started is not None:
            self._cordon(node.name, *started, until=self.now())

    def _cordon(self, node: str, since: float, healthy: bool, until: float) -> None:
        self.done.append(Repair(since, node, "cordon", healthy, _CORDON, seconds=until - since))

    def repairs(self) -> list[Repair]:
        """Every repair since :meth:`mark`, the cordons still on measured to now."""
        now = self.now()
        done = list(self.done)
        done += [Repair(since, node, "cordon", healthy, _CORDON, seconds=now - since)
                 for node, (since, healthy) in sorted(self.cordoned.items())]
        return [r for r in done if r.at >= self.since]

    def false_repairs(self) -> list[Repair]:
        """The repairs and holds of nodes whose hardware was healthy (a cordon: held longer
        than a check)."""
        limit = self.check_seconds + CORDON_MARGIN_SECONDS
        return [r for r in self.repairs() if r.healthy and (r.action != "cordon" or r.seconds > limit)]
