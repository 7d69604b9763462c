"""Whether an attempt of a job runs the gang preflight before its command.

A job chooses (``preflight`` in its JobSpec): ``restarts`` (before the command of every
attempt a recovery started: a gang restart, a relocation), ``always`` (its first start
too), ``off``, or ``auto`` (the default): the cluster's choice, ``restarts`` for jobs of at
least ``preflight_min_nodes`` nodes (0: never). Resuming a suspended job is not a recovery
(no node was at fault): it runs no preflight. Pure.
"""

from __future__ import annotations

from enum import Enum


class PreflightMode(str, Enum):
    AUTO = "auto"
    RESTARTS = "restarts"
    ALWAYS = "always"
    OFF = "off"



def effective(mode: PreflightMode, nodes: int, min_nodes: int) -> PreflightMode:
    """``auto`` resolved with the cluster's default."""
    if mode is not PreflightMode.AUTO:
        return mode
    return PreflightMode.RESTARTS if min_nodes > 0 and nodes >= min_nodes else PreflightMode.OFF


def required(mode: PreflightMode, *, nodes: int, min_nodes: int, first_start: bool,
             recovery_restart: bool) -> tuple[bool, str]:
    """(runs, why) for one attempt."""
    chosen = effective(mode, nodes, min_nodes)
    source = f"the cluster's default for jobs of {min_nodes}+ nodes" if mode is PreflightMode.AUTO \
        else f"the job's preflight={mode.value}"
    if chosen is PreflightMode.OFF:
        return False, f"preflight off ({source})"
    if recovery_restart:
        return True, f"a recovery restarted the job ({source})"
    if first_start and chosen is PreflightMode.ALWAYS:
        return True, f"the job's first start ({source})"
    return False, "neither a recovery restart nor a first start that asks for it"
