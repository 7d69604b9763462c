"""Every crash campaign's flow by name: ``RUNS[flow](fault)`` runs it (picklable: the fork
server's processes run it)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from . import (
    aws_notices,
    heartbeats,
    placement,
    preempt_node_lost,
    preflight,
    preflight_evidence,
    recovery,
    time_sharing,
    warnings,
)

RUNS: dict[str, Callable[[tuple[int, str] | None], Any]] = {
    **{flow: partial(recovery.run, flow) for flow in recovery.FLOWS},
    **{flow: partial(placement.run, flow) for flow in placement.FLOWS},
    "node_lost": heartbeats.run,
    "node_wedged": partial(heartbeats.run, wedged=True),
    "time_sharing": time_sharing.run,
    "preempt_node_lost": preempt_node_lost.run,
    "preflight_pin": preflight.run,
    **{flow: partial(preflight_evidence.run, flow) for flow in preflight_evidence.FLOWS},
    "driver_warning": warnings.run,
    **{flow: partial(aws_notices.run, flow) for flow in aws_notices.FLOWS},
}
