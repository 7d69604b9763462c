"""Is a node the stack rebooted back? What proves a reboot, strongest first. Pure.

"Back" is never "the ECS agent is connected": ECS emits container-instance events for many
reasons, ``status`` stays ACTIVE across a reboot, and "the Amazon ECS container agent
disconnects and reconnects several times per hour as a part of its normal operation" (ECS
developer guide, "Amazon ECS container instance state change events"). An agent update or a
network blip in the reboot window (after the request, before the host goes down) is a
disconnect and a reconnect without a reboot; taken for "back", the job would restart on a
node that reboots under it a moment later.

The evidence, in order:

1. **The host's boot time later than the reboot request.** The node agent sends
   ``/proc/stat``'s ``btime`` with every task report (``boot_time``, docs/heartbeats.md):
   the kernel sets it at boot and nothing else changes it, so it is the proof. No AWS API
   offers it: EC2's ``LaunchTime`` does not change on a reboot, ``RebootInstances`` only
   queues the request ("asynchronous... If an instance does not cleanly shut down within a
   few minutes, Amazon EC2 performs a hard reboot": its answer says nothing about when),
   the reboot-only SSM document answers Success before the host goes down (it reboots 5 s
   later, in the background), and ECS tells only ``agentConnected`` and the agent's version.
2. **The ECS agent's outage, as strict as ECS allows**, on a node without a node agent (it
   never reported a boot time) or whose node agent has been silent for
   :data:`BOOT_REPORT_GRACE_SECONDS` since the ECS agent reconnected: a disconnect seen after
   the request and the first reconnect after it (newer by ``detail.version``, else by time),
   with

   * the same agent version on both sides: ``versionInfo.agentVersion`` changes with an
     agent update ("if you upgrade the agent, this version information changes and an event
     is generated", the same guide); ``agentUpdateStatus`` is no sign, it keeps the status
     of the most recent update for ever (ContainerInstance, ECS API reference);
   * at least :data:`REBOOT_MIN_OUTAGE_SECONDS` between them: a reboot keeps the agent away
     for the OS shutdown, the firmware and the boot (minutes on GPU instances); an agent
     restart or a blip in the reboot window is usually seconds.

   A network partition longer than that, on a node without the node agent, is still taken
   for a reboot: ECS cannot tell them apart, the node agent's boot time can.

A node whose node agent reports boot times is back only on a boot time later than the
request (the reconnect alone waits for it), unless that agent stays silent past the grace.
A reconnect that proves nothing is recorded with the outage it ended; the next disconnect
starts a new outage, so the reboot's own is judged when it comes. With no proof by the
reboot's timeout, a node whose ECS agent answers (connected, ACTIVE) and whose node agent
says nothing against a reboot is asked instead of quarantined (issue 49): it is back as from
its reboot, and its validation after repair, when on, decides whether it takes work. A node
that does not answer times out and is quarantined, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gpu_recovery.domain import ecs_instance_status as ecs_status
from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.states import InstanceState

#: The shortest ECS agent outage taken for a reboot (see the module docstring).
REBOOT_MIN_OUTAGE_SECONDS = 30.0
#: How long after the ECS agent reconnected the node agent may stay silent before its
#: outage alone decides (4 report intervals of 30 s).
BOOT_REPORT_GRACE_SECONDS = 120.0


@dataclass(frozen=True)
class AgentEvent:
    """What a container-instance state change (or a DescribeContainerInstances answer) says
    about the ECS agent."""

    status: str
    agent_connected: bool
    at: float  # detail.updatedAt (or the event time)
    version: int = 0  # detail.version: increases with every change of the instance
    agent_version: str = ""  # detail.versionInfo.agentVersion


@dataclass(frozen=True)
class Return:
    """The judgement on a rebooting node: ``back``, and the evidence (or what it lacks)."""

    back: bool
    why: str


def _newer(event: AgentEvent, version: int, at: float) -> bool:
    """A redelivered or reordered event from before the recorded one is stale."""
    if event.version and version:
        return event.version > version
    return event.at > at


def _requested(instance: Instance) -> float | None:
    """When the reboot was requested (None: the node is not rebooting)."""
    return instance.reboot_requested_at if instance.state is InstanceState.REBOOTING else None


def booted_after_request(instance: Instance) -> bool:
    return (instance.boot_time is not None and instance.reboot_requested_at is not None
            and instance.boot_time > instance.reboot_requested_at)


def is_new_disconnect(instance: Instance, event: AgentEvent) -> bool:
    """A disconnect after the reboot request that starts an outage: the first one, or the
    first after a recorded reconnect (that outage was not the reboot's)."""
    requested = _requested(instance)
    if requested is None or event.agent_connected or event.at < requested:
        return False
    if instance.disconnected_at is None:
        return True
    return instance.reconnected_at is not None and _newer(event, instance.reconnected_version,
                                                          instance.reconnected_at)


def is_first_reconnect(instance: Instance, event: AgentEvent) -> bool:
    """The first "connected" event after the recorded disconnect."""
    return (_requested(instance) is not None and event.agent_connected and event.status == ecs_status.ACTIVE
            and instance.disconnected_at is not None and instance.reconnected_at is None
            and _newer(event, instance.disconnected_version, instance.disconnected_at))


def outage_doubt(down_at: float, up_at: float, down_agent: str, up_agent: str) -> str:
    """Why an agent outage was not a reboot's ("" when it may have been)."""
    if down_agent and up_agent and down_agent != up_agent:
        return f"agent updated ({down_agent} -> {up_agent}), not rebooted"
    if up_at - down_at < REBOOT_MIN_OUTAGE_SECONDS:
        return (f"agent away {up_at - down_at:.0f} s: shorter than a reboot "
                f"({REBOOT_MIN_OUTAGE_SECONDS:.0f} s), a blip or an agent restart")
    return ""


def judge_return(instance: Instance, event: AgentEvent, now: float) -> Return:
    """Is the rebooting ``instance`` back, given ``event`` (see the module docstring)?"""
    if _requested(instance) is None:
        return Return(False, "not rebooting")
    if event.status != ecs_status.ACTIVE or not event.agent_connected:
        return Return(False, "agent not connected")
    if booted_after_request(instance):
        return Return(True, "booted after the reboot request")
    down = instance.disconnected_at
    if down is not None and instance.reconnected_at is not None:
        up, agents = instance.reconnected_at, (instance.disconnected_agent, instance.reconnected_agent)
    elif down is not None and is_first_reconnect(instance, event):
        up, agents = event.at, (instance.disconnected_agent, event.agent_version)
    else:
        return Return(False, "no agent outage seen since the reboot request")
    doubt = outage_doubt(down, up, *agents)
    if doubt:
        return Return(False, doubt)
    outage = f"agent away {up - down:.0f} s"
    if instance.boot_time is None:
        return Return(True, f"{outage} (no node agent reports its boot time)")
    if (instance.last_report_at or 0.0) < up and now >= up + BOOT_REPORT_GRACE_SECONDS:
        return Return(True, f"{outage}; its node agent silent since the reconnect")
    return Return(False, f"{outage}; waiting for the node agent's boot time")


# ================================================================ issuing the reboot
class RebootProgress(str, Enum):
    """Where an instance's reboot stands, from what the record and ECS say."""

    NOT_ISSUED = "NOT_ISSUED"  # nobody is calling the API: issue it
    IN_FLIGHT = "IN_FLIGHT"  # a delivery claimed the call recently: leave it
    UNCONFIRMED = "UNCONFIRMED"  # claimed long ago, no answer recorded, no sign of a reboot
    HAPPENING = "HAPPENING"  # the node shows it rebooted or is rebooting
    CONFIRMED = "CONFIRMED"  # the API answered


def reboot_progress(instance: Instance, *, now: float, lease_seconds: float,
                    agent_connected: bool | None) -> RebootProgress:
    """Decide whether a reboot may be (re-)issued without rebooting a node twice.

    The claim (intent) is committed before the API call and the answer is recorded
    after it. A claim whose answer was never recorded (lost response, crash) is
    re-issued only when the node shows no sign of the reboot: no outage that may be the
    reboot's (an outage with a doubt, a blip or an agent update, is no sign), no later boot
    time, its agent still connected.
    """
    if instance.reboot_issued_at is not None:
        return RebootProgress.CONFIRMED
    if instance.reboot_claimed_at is None:
        return RebootProgress.NOT_ISSUED
    outage = instance.disconnected_at is not None and (
        instance.reconnected_at is None
        or not outage_doubt(instance.disconnected_at, instance.reconnected_at,
                            instance.disconnected_agent, instance.reconnected_agent))
    if outage or booted_after_request(instance) or agent_connected is False:
        return RebootProgress.HAPPENING
    if now < instance.reboot_claimed_at + lease_seconds:
        return RebootProgress.IN_FLIGHT
    return RebootProgress.UNCONFIRMED
