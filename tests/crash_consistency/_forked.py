"""A campaign's fault runs, computed a group of positions at a time from forks of the
unbroken run (``local_mode.campaigns.forked_runs.broken_runs``: each run pays only for the calls after
the one it breaks).

Every (position, mode) is still a test of its own, with its own id and assertions. The
positions of a flow are cut into consecutive groups; a group's tests carry
``pytest.mark.xdist_group`` so that, under ``--dist loadgroup`` (``make test``), one worker
runs all of them and computes the group's runs once (``broken``, cached per process). Without
loadgroup every test still gets its result, at the price of a group per worker that asks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from functools import cache
from typing import Any

import pytest

from local_mode.campaigns import recovery as campaign
from local_mode.campaigns.forked_runs import BrokenRunFailed, broken_runs
from local_mode.campaigns.runner import faults_at
from local_mode.sim.broken_calls import FAULT_MODES, ApiCall, modes_of

#: positions per group: a group's driver (one fork of the fork server: the world built, then
#: the unbroken run up to the group's last position) is paid once per group, about as much as
#: 2-3 of its runs; 48 positions (~100 runs, several seconds on one core) make it ~2-3 % of the
#: campaigns (24 made it ~5 %, 6 ~15 %) and still leave ~170 groups to balance between workers.
#: The fork server of each worker is warmed by one unbroken GPU-fault recovery (moto's
#: services and the AWS models loaded once).
GROUP_SIZE = 48


def groups(positions: Sequence[int], size: int = GROUP_SIZE) -> list[tuple[int, ...]]:
    ordered = sorted(set(positions))
    return [tuple(ordered[i:i + size]) for i in range(0, len(ordered), size)]


def group_name(name: str, group: tuple[int, ...]) -> str:
    return f"{name}-{group[0]}-{group[-1]}"


def group_faults(calls: Sequence[ApiCall], group: tuple[int, ...]) -> tuple[tuple[int, str], ...]:
    """A group's faults: each of its positions broken in every mode its call takes (throttle,
    lost response, and its operation's documented failure shape, ``modes_of``)."""
    return tuple(faults_at(calls, group))


def cases(name: str, positions: Sequence[int], *prefix: Any, calls: Sequence[ApiCall],
          size: int = GROUP_SIZE, slow: Collection[int] = ()) -> list[Any]:
    """``pytest.param(*prefix, faults, index, mode)`` for every position and every mode its
    call takes (``calls``: the unbroken run's), with the id ``[*prefix-]index-mode``, the
    group's faults (``group_faults``) and xdist_group (and the ``slow`` marker for the
    positions in ``slow``)."""
    def marks(group: tuple[int, ...], index: int) -> list[Any]:
        slow_tier = [pytest.mark.slow] if index in slow else []
        return [pytest.mark.xdist_group(group_name(name, group)), *slow_tier]

    out = []
    for group in groups(positions, size):
        faults = group_faults(calls, group)
        out += [pytest.param(*prefix, faults, index, mode, id="-".join(map(str, (*prefix, index, mode))),
                             marks=marks(group, index)) for index, mode in faults]
    return out


def group_of(name: str, positions: Sequence[int], index: int, size: int = GROUP_SIZE) -> str:
    """The xdist_group of the group that holds ``index`` (another test that reads its runs)."""
    return next(group_name(name, g) for g in groups(positions, size) if index in g)


@cache
def broken(run: Callable[[tuple[int, str] | None], Any],
           faults: tuple[tuple[int, str], ...]) -> dict[tuple[int, str], Any]:
    return broken_runs(run, faults, warm_up=campaign.run_recovery)


def first_of_each_shape(calls: Sequence[ApiCall]) -> list[tuple[int, str]]:
    """The first call of each operation that takes a failure shape, broken in it."""
    seen: set[tuple[str, str]] = set()
    faults = []
    for call in calls:
        shape = modes_of(call.service, call.operation)[len(FAULT_MODES):]
        if shape and (call.service, call.operation) not in seen:
            seen.add((call.service, call.operation))
            faults.append((call.index, shape[0]))
    return faults


def alternating_cases(name: str, positions: Sequence[int], size: int = GROUP_SIZE, *,
                      calls: Sequence[ApiCall] = ()) -> list[Any]:
    """``pytest.param(group, index, mode)`` breaking each position once, the fault modes in
    turn along the flow (``make test``'s quick tier: both models at half the positions
    each), and the first call of each operation that takes a failure shape in that shape
    (``calls``: the unbroken run's); ``group`` holds the group's faults, (index, mode) pairs,
    for ``result``. Every chunk is in one xdist group, ``quick_group(name)``: one worker, one
    fork server warmed once."""
    faults = [(index, FAULT_MODES[i % len(FAULT_MODES)]) for i, index in enumerate(sorted(set(positions)))]
    faults = sorted(faults + first_of_each_shape(calls))
    chunks = [tuple(faults[i:i + size]) for i in range(0, len(faults), size)]
    group = pytest.mark.xdist_group(quick_group(name))
    return [pytest.param(chunk, index, mode, id=f"{index}-{mode}", marks=group)
            for chunk in chunks for index, mode in chunk]


def quick_group(name: str) -> str:
    return f"{name}-quick"


def result(run: Callable[[tuple[int, str] | None], Any], group: tuple[Any, ...], index: int,
           mode: str) -> Any:
    """The run that broke call ``index`` in ``mode`` (its group's runs made once per process).
    ``group``: the group's (index, mode) faults (``cases``, ``alternating_cases``), or its
    positions, each broken in both fault models."""
    faults = group if group and isinstance(group[0], tuple) else tuple(
        (n, m) for n in group for m in FAULT_MODES)
    return outcome(broken(run, faults), index, mode)


def outcome(runs: dict[tuple[int, str], Any], index: int, mode: str) -> Any:
    """The run that broke call ``index`` in ``mode`` (a run that raised or died fails the test)."""
    outcome = runs[(index, mode)]
    if isinstance(outcome, BrokenRunFailed):
        pytest.fail(f"{mode} at call {index}: the run raised or died:\n{outcome}", pytrace=False)
    assert outcome.fault == (index, mode)
    return outcome
