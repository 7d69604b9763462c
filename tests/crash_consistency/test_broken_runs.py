"""``local_mode.campaigns.forked_runs.broken_runs``: the fault runs of a campaign forked from its unbroken run
at the call they break end exactly as the same runs made from the start, and a run that
raises or dies is a failure, never a result. The second faults of ``runner.broken_after``,
forked from the run that breaks only the first, end as their runs from the start too.

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
from local_mode.campaigns.runner import after_first, arm_fault, broken_after, second_faults
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
    then_fired: ApiCall | None = None
    sites: tuple[str, ...] = ()  # each call's site ("?" here: recorded; "": not)

    def problems(self) -> list[str]:  # what runner.broken_after reads
        return []


def _model(name: str) -> Any:
    service = SimpleNamespace(service_id=SimpleNamespace(hyphenize=lambda: "svc"), endpoint_prefix="svc")
    return SimpleNamespace(name=name, service_model=service)


def flow(fault: tuple[int, str] | None, *, raise_at: int = 0, die_at: int = 0, thread_at: int = 0) -> Outcome:
    """Twelve calls; a throttled call is made again, a lost response is noted (and the call's
    effect kept, as AWS kept it). ``raise_at``/``die_at``: the broken run raises or its
    process dies after that call; ``thread_at``: a thread runs from that call to the end."""
    faults = CallFaults()
    arm_fault(faults, fault)  # as run_flow arms (within runner.then_breaking: a second fault too)
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
    return Outcome(fault, faults.fired, [c.operation for c in faults.calls], log, total, os.getpid(),
                   faults.then_fired, tuple(c.site for c in faults.calls))


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


def printing_flow(fault: tuple[int, str] | None) -> Outcome:
    print("a broken run's own line (a function's EMF metrics)")
    return flow(fault)


def test_the_broken_runs_print_nothing_on_the_callers_stdout(
        capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The campaigns' command prints one JSON line per flow: the runs' own prints (their
    functions' metrics) stay out of it, from a fork server started under the caller's stdout."""
    from local_mode.campaigns import forked_runs

    monkeypatch.setattr(forked_runs, "_server", None)  # one started here, on this test's stdout
    runs = broken_runs(printing_flow, [(2, THROTTLE), (5, LOST_RESPONSE)])
    assert not any(isinstance(r, BrokenRunFailed) for r in runs.values())
    assert "a broken run's own line" not in capfd.readouterr().out


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


def _same_second(forked: Outcome, scratch: Outcome) -> None:
    _same(forked, scratch)
    assert forked.sites == scratch.sites and set(scratch.sites) == {"?"}
    assert forked.then_fired is not None and scratch.then_fired is not None
    assert (forked.then_fired.index, forked.then_fired.operation) == \
        (scratch.then_fired.index, scratch.then_fired.operation)


@pytest.mark.parametrize("first", [(3, THROTTLE), (4, LOST_RESPONSE)])
def test_every_forked_second_fault_ends_as_its_run_from_the_start(first: tuple[int, str]) -> None:
    """The run that breaks ``first`` forked at each later call, the child breaking it as
    ``then``: the same calls (a throttled first made again: one call more), log, total, first
    fault and second, and every call's site recorded, as the run from the start."""
    thens = [(m, mode) for m in (first[0] + 1, first[0] + 2, 8, 9, CALLS) for mode in FAULT_MODES]
    runs = second_faults(flow, first, thens)
    assert set(runs) == set(thens)
    for then, outcome in runs.items():
        assert not isinstance(outcome, BrokenRunFailed), outcome
        scratch = after_first(flow, first, then)
        assert scratch.fault == first
        assert scratch.then_fired is not None and scratch.then_fired.index == then[0]
        _same_second(outcome, scratch)
        assert outcome.pid != os.getpid()  # forked, not made here
    # each pair broken as asked: the second's call not the first's, nor the call after it
    assert runs[(8, THROTTLE)].log != runs[(9, THROTTLE)].log != runs[(8, LOST_RESPONSE)].log
    assert after_first(flow, first, (8, THROTTLE)).log != after_first(flow, first, (9, THROTTLE)).log


def test_a_second_fault_comes_after_the_first_and_broken_after_reads_every_run() -> None:
    first = (3, THROTTLE)
    with pytest.raises(ValueError, match="after the first"):
        second_faults(flow, first, [(3, LOST_RESPONSE)])
    calls = [ApiCall(n, "svc", f"Op{n}") for n in (5, 9)]
    assert broken_after(flow, first, calls) == []
    with pytest.warns(RuntimeWarning, match="boom after call 3"):  # the driver too: each from the start
        failing = broken_after(partial(flow, raise_at=3), first, calls)
    assert len(failing) == 2 * len(FAULT_MODES) and all("raised or died" in f for f in failing), failing
    # a second call the run never makes: each run from the start, its second fault never fired
    with pytest.warns(RuntimeWarning, match="ended early"):
        never = broken_after(flow, first, [ApiCall(CALLS + 5, "svc", "OpPast")])
    assert len(never) == len(FAULT_MODES) and all("a fault never fired" in f for f in never), never
