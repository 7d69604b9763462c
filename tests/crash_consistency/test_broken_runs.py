"""``local_mode.campaigns.forked_runs.broken_runs``: the fault runs of a campaign forked from its unbroken run
at the call they break end exactly as the same runs made from the start, and a run that
raises or dies is a failure, never a result.

The flow here is a stand-in (no emulator: a dozen calls through ``CallFaults``' own hooks,
a throttled call made again, a lost response remembered), so every position can be
compared with its run from the start in well under a second.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ReadTimeoutError

from local_mode.campaigns.forked_runs import BrokenRunFailed, broken_runs
from local_mode.sim.broken_calls import FAULT_MODES, LOST_RESPONSE, THROTTLE, ApiCall, CallFaults

CALLS = 12


@dataclass
class Outcome:
    fault: tuple[int, str] | None
    fired: ApiCall | None
    calls: list[str]
    log: list[str]
    total: int
    pid: int


def _model(name: str) -> Any:
    service = SimpleNamespace(service_id=SimpleNamespace(hyphenize=lambda: "svc"), endpoint_prefix="svc")
    return SimpleNamespace(name=name, service_model=service)


def flow(fault: tuple[int, str] | None, *, raise_at: int = 0, die_at: int = 0, thread_at: int = 0) -> Outcome:
    """Twelve calls; a throttled call is made again, a lost response is noted (and the call's
    effect kept, as AWS kept it). ``raise_at``/``die_at``: the broken run raises or its
    process dies after that call; ``thread_at``: a thread runs from that call to the end."""
    faults = CallFaults()
    faults.arm(None, record_sites=True) if fault is None else faults.arm(*fault)
    log: list[str] = []
    total = 0
    helper: threading.Thread | None = None
    stop = threading.Event()
    step = 1
    while step <= CALLS:
        if step == thread_at and helper is None:
            helper = threading.Thread(target=stop.wait)
            helper.start()
        model, context = _model(f"Op{step}"), {}
        if faults.before_call(model, context=context) is not None:
            log.append(f"{step} throttled, made again")
            continue
        total += step
        try:
            faults.after_call(model=model, context=context)
        except ReadTimeoutError:
            log.append(f"{step} lost")
        fired = faults.fired.index if faults.fired is not None else 0
        if fired and fired == raise_at:
            raise RuntimeError(f"boom after call {fired}")
        if fired and fired == die_at:
            os._exit(3)
        step += 1
    stop.set()
    if helper is not None:
        helper.join()
    return Outcome(fault, faults.fired, [c.operation for c in faults.calls], log, total, os.getpid())


def _every_fault() -> list[tuple[int, str]]:
    return [(n, mode) for n in range(1, CALLS + 1) for mode in FAULT_MODES]


def _same(forked: Outcome, scratch: Outcome) -> None:
    assert (forked.fault, forked.calls, forked.log, forked.total) == \
        (scratch.fault, scratch.calls, scratch.log, scratch.total)
    assert forked.fired is not None and scratch.fired is not None
    assert (forked.fired.index, forked.fired.operation) == (scratch.fired.index, scratch.fired.operation)


def test_every_forked_run_ends_as_its_run_from_the_start() -> None:
    runs = broken_runs(flow, _every_fault())
    assert set(runs) == set(_every_fault())
    for fault, outcome in runs.items():
        assert not isinstance(outcome, BrokenRunFailed), outcome
        _same(outcome, flow(fault))
        assert outcome.pid != os.getpid()  # forked, not made here
    assert runs[(3, THROTTLE)].log == ["3 throttled, made again"]
    assert runs[(3, LOST_RESPONSE)].log == ["3 lost"]


def test_a_broken_run_that_raises_or_dies_is_a_failure() -> None:
    raising = broken_runs(partial(flow, raise_at=5), [(4, THROTTLE), (5, THROTTLE), (5, LOST_RESPONSE)])
    assert not isinstance(raising[(4, THROTTLE)], BrokenRunFailed)
    for mode in FAULT_MODES:
        assert isinstance(raising[(5, mode)], BrokenRunFailed)
        assert "RuntimeError: boom after call 5" in str(raising[(5, mode)])
    dying = broken_runs(partial(flow, die_at=6), [(6, LOST_RESPONSE), (7, THROTTLE)])
    assert isinstance(dying[(6, LOST_RESPONSE)], BrokenRunFailed)
    assert "exit code 3" in str(dying[(6, LOST_RESPONSE)])
    assert dying[(7, THROTTLE)].fired.index == 7


def test_calls_made_while_another_thread_runs_are_broken_in_runs_from_the_start() -> None:
    run = partial(flow, thread_at=8)
    with pytest.warns(RuntimeWarning, match="5 position"):
        runs = broken_runs(run, _every_fault())
    for (n, mode), outcome in runs.items():
        _same(outcome, run((n, mode)))
        assert (outcome.pid == os.getpid()) == (n >= 8), (n, mode)  # not forked once the thread ran


def test_a_call_the_unbroken_run_never_makes_is_tried_from_the_start() -> None:
    with pytest.warns(RuntimeWarning, match="ended early"):
        runs = broken_runs(flow, [(2, THROTTLE), (CALLS + 5, THROTTLE)])
    assert runs[(2, THROTTLE)].fired.index == 2
    assert runs[(CALLS + 5, THROTTLE)].fired is None  # the campaign's test says "the fault never fired"
