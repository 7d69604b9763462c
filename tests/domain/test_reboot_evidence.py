"""Is a rebooted node back? ``domain.reboot_evidence``, without any emulator."""

from __future__ import annotations

import pytest

from gpu_recovery.constants import InstanceState
from gpu_recovery.domain import reboot_evidence as evidence
from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.reboot_evidence import (
    BOOT_REPORT_GRACE_SECONDS,
    REBOOT_MIN_OUTAGE_SECONDS,
    AgentEvent,
    RebootProgress,
)

NOW = 5000.0


def rebooting(**kw: object) -> Instance:
    return Instance("ci-1", state=InstanceState.REBOOTING, reboot_requested_at=1000.0, **kw)  # type: ignore[arg-type]


def event(connected: bool, at: float, version: int = 0, status: str = "ACTIVE",
          agent: str = "") -> AgentEvent:
    return AgentEvent(status=status, agent_connected=connected, at=at, version=version, agent_version=agent)


def back(inst: Instance, ev: AgentEvent, now: float = NOW) -> bool:
    return evidence.judge_return(inst, ev, now).back


def test_active_event_before_the_disconnect_is_not_back() -> None:
    """Given a reboot requested, When an ACTIVE+connected event arrives before any
    disconnect, Then the instance is not back (ECS emits such events all the time)."""
    assert not back(rebooting(), event(True, 1001.0, 5))


def test_back_after_a_disconnect_seen_after_the_request() -> None:
    inst = rebooting()
    assert evidence.is_new_disconnect(inst, event(False, 1001.0, 6))
    inst.disconnected_at, inst.disconnected_version = 1001.0, 6
    assert back(inst, event(True, 1100.0, 7))
    assert not back(inst, event(True, 1100.0, 7, status="DRAINING"))


def test_a_stale_connected_event_redelivered_after_the_disconnect_is_not_back() -> None:
    """Given the disconnect (version 6) was recorded, When the "connected" event of
    version 5 (sent before the disconnect) is redelivered, Then the node is not back."""
    inst = rebooting(disconnected_at=1001.0, disconnected_version=6)
    assert not back(inst, event(True, 1000.5, 5))
    assert not back(inst, event(True, 1200.0, 6))  # same version: not newer
    # Without versions, time decides.
    unversioned = rebooting(disconnected_at=1001.0)
    assert not back(unversioned, event(True, 1000.5))
    assert back(unversioned, event(True, 1001.0 + REBOOT_MIN_OUTAGE_SECONDS + 1))


def test_a_disconnect_from_before_the_request_does_not_count() -> None:
    """Given a delayed disconnect event older than the reboot request, Then it is ignored."""
    assert not evidence.is_new_disconnect(rebooting(), event(False, 999.0))


def test_back_when_boot_time_is_later_than_the_request() -> None:
    assert back(rebooting(boot_time=1100.0), event(True, 1200.0))
    assert not back(rebooting(boot_time=900.0), event(True, 1200.0))


# ----------------------------------------------------------------- issue 40: no reboot
def test_a_network_blip_in_the_reboot_window_is_not_a_reboot() -> None:
    """Given the agent away 5 s after the request (a blip: the host has not gone down yet),
    When it reconnects, Then the node is not back; the reconnect is recorded and the reboot's
    own disconnect, later, starts a new outage that does bring it back."""
    inst = rebooting(disconnected_at=1002.0, disconnected_version=6)
    blip_end = event(True, 1007.0, 7)
    assert not back(inst, blip_end)
    assert evidence.is_first_reconnect(inst, blip_end)
    inst.reconnected_at, inst.reconnected_version = 1007.0, 7
    assert not back(inst, event(True, 1010.0, 8))  # later ACTIVE events change nothing
    reboot_down = event(False, 1060.0, 9)
    assert evidence.is_new_disconnect(inst, reboot_down)
    assert not evidence.is_new_disconnect(inst, event(False, 1005.0, 6))  # the blip's, again
    inst.disconnected_at, inst.disconnected_version = 1060.0, 9
    inst.reconnected_at, inst.reconnected_version = None, 0
    assert back(inst, event(True, 1240.0, 10))


def test_an_agent_update_is_not_a_reboot() -> None:
    """Given the agent disconnected at version 1.89.3 and reconnected 60 s later at 1.89.4
    (an agent update: ECS changes versionInfo), Then the node is not back, whatever the
    outage; the same version after the same outage is."""
    inst = rebooting(disconnected_at=1010.0, disconnected_version=6, disconnected_agent="1.89.3")
    judged = evidence.judge_return(inst, event(True, 1070.0, 7, agent="1.89.4"), NOW)
    assert not judged.back and "agent updated" in judged.why
    assert back(inst, event(True, 1070.0, 7, agent="1.89.3"))


def test_a_node_agent_that_reports_boot_times_decides() -> None:
    """Given a node whose node agent reports its boot time (the proof), When its ECS agent
    comes back after a long outage, Then it is back only on a boot time later than the
    request, or once its node agent stayed silent for the grace since the reconnect."""
    up = 1200.0
    inst = rebooting(disconnected_at=1010.0, disconnected_version=6, boot_time=500.0, last_report_at=990.0)
    judged = evidence.judge_return(inst, event(True, up, 7), up + 1)
    assert not judged.back and "boot time" in judged.why
    inst.reconnected_at, inst.reconnected_version = up, 7
    inst.last_report_at = up + 20  # reported since, an old boot time: the host did not reboot
    assert not back(inst, event(True, up + 300, 8), up + 300)
    inst.boot_time = up - 30  # the new boot time
    assert back(inst, event(True, up + 300, 8), up + 300)
    silent = rebooting(disconnected_at=1010.0, disconnected_version=6, reconnected_at=up,
                       reconnected_version=7, boot_time=500.0, last_report_at=990.0)
    assert not back(silent, event(True, up + 60, 8), up + 60)
    assert back(silent, event(True, up + BOOT_REPORT_GRACE_SECONDS, 8), up + BOOT_REPORT_GRACE_SECONDS)


@pytest.mark.parametrize(
    ("fields", "connected", "now", "expected"),
    [
        ({}, True, 1010.0, RebootProgress.NOT_ISSUED),
        ({"reboot_issued_at": 1002.0}, True, 1010.0, RebootProgress.CONFIRMED),
        ({"reboot_claimed_at": 1001.0}, True, 1010.0, RebootProgress.IN_FLIGHT),
        ({"reboot_claimed_at": 1001.0}, True, 1400.0, RebootProgress.UNCONFIRMED),
        # Signs that it happened: never issue it twice.
        ({"reboot_claimed_at": 1001.0}, False, 1400.0, RebootProgress.HAPPENING),
        ({"reboot_claimed_at": 1001.0, "disconnected_at": 1020.0}, True, 1400.0, RebootProgress.HAPPENING),
        ({"reboot_claimed_at": 1001.0, "boot_time": 1100.0}, True, 1400.0, RebootProgress.HAPPENING),
        ({"reboot_claimed_at": 1001.0, "disconnected_at": 1020.0, "reconnected_at": 1200.0}, True, 1400.0,
         RebootProgress.HAPPENING),
        # A blip is no sign of it.
        ({"reboot_claimed_at": 1001.0, "disconnected_at": 1020.0, "reconnected_at": 1025.0}, True, 1400.0,
         RebootProgress.UNCONFIRMED),
    ],
)
def test_reboot_progress_never_reboots_twice(fields: dict[str, float], connected: bool, now: float,
                                             expected: RebootProgress) -> None:
    inst = rebooting(**fields)
    assert evidence.reboot_progress(inst, now=now, lease_seconds=300, agent_connected=connected) is expected
