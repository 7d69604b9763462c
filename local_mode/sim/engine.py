"""``Simulation``: the timed engine of the scale simulator, a discrete-event simulation of
processes, for recoveries of thousands of ranks in seconds of wall time.

The recovery code runs for real (``RecoveryService``, its stages, the real ``Repository``
on :class:`~local_mode.sim.dynamo.MemoryDynamo`, the real adapters on the stand-in clients
of :mod:`~local_mode.sim.aws_calls`, :mod:`~local_mode.sim.ecs_cluster` and
:mod:`~local_mode.sim.aws_stand_ins`); this module decides *when* each piece runs.

Timed actions and *processes*, in simulated time: the clock and the action queue are
:mod:`~local_mode.sim.clock`'s ``SimClock`` and ``TimedActions``, the moto world's data
plane's too (one clock, ties broken alike). Every Lambda invocation is a process: a greenlet
(a coroutine with a stack of its own, in the same OS thread) that runs only while the
simulation hands it control, one process at a time, so runs are deterministic for a seed (a
switch there and back costs under a microsecond; a handoff between threads, as processes were
before, cost 20-50, and a 1,024-task recovery hands control over about 50,000 times). A
process gives control back at every AWS call (the call takes effect at once; the caller then
waits the call's modelled latency) and at every ``gpu_recovery.clock.sleep`` (retry back-off,
pacing); meanwhile other invocations and the data plane run. Invocations therefore interleave at AWS-call
boundaries, as concurrent Lambdas do; the Python code between two calls takes no simulated
time (CPU time is not modelled). Each greenlet has a ``contextvars`` context of its own, as
each thread had (an invocation's deadline in ``gpu_recovery.clock`` is one).
``gpu_recovery.clock.now()`` is the simulation's time (:meth:`Simulation.install_clock`).

A process past its deadline (the Lambda function timeout) ends at its next wait with
:class:`LambdaTimeout`, which ``except Exception`` cannot catch, as Lambda's kill cannot be
caught.
"""

from __future__ import annotations

import itertools
import random
import time as _time
from collections.abc import Callable
from typing import Any

import greenlet

from gpu_recovery import clock as gr_clock

from .clock import DEFAULT_START, SimClock, TimedActions


class LambdaTimeout(BaseException):
    """The invocation reached its function timeout: Lambda ends it. A BaseException, so
    the code under test cannot catch it (``except Exception``), as it cannot catch the kill."""


class _Closed(BaseException):
    """The simulation ended while this process waited: unwind quietly."""


class Process:
    """One simulated thread of control (a Lambda invocation, a setup step)."""

    def __init__(self, sim: Simulation, body: Callable[[], Any], *, name: str, label: str,
                 deadline: float | None) -> None:
        self.sim = sim
        self.body = body
        self.name = name
        self.label = label  # metering label (the function's name)
        self.deadline = deadline
        self.started_at = sim.now
        self.finished_at: float | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.timed_out = False
        self.finished = False
        self.on_done: list[Callable[[Process], None]] = []
        self.context: Any = None  # a Lambda invocation's context (``LambdaService`` sets it)
        self._abort = False
        self._greenlet: greenlet.greenlet | None = None  # made at its first turn
        self._driver: greenlet.greenlet | None = None  # who gave it its turn: given it back on a wait

    def _main(self) -> None:
        try:
            if self._abort:
                raise _Closed
            self.result = self.body()
        except (_Closed, greenlet.GreenletExit):
            self.error = None
        except LambdaTimeout as error:
            self.timed_out = True
            self.error = error
        except BaseException as error:
            self.error = error
        self.finished = True
        self.finished_at = self.sim.now

    @property
    def duration(self) -> float:
        return (self.finished_at if self.finished_at is not None else self.sim.now) - self.started_at

    def wait(self, seconds: float) -> None:
        """Give control back for ``seconds`` of simulated time (from this process only)."""
        sim = self.sim
        wake = sim.now + max(0.0, seconds)
        kill = self.deadline is not None and wake > self.deadline
        if kill:
            wake = max(sim.now, self.deadline or sim.now)
        if sim._nothing_due_before(wake):
            # Nobody else would run before we wake: skip the thread switch.
            sim.now = wake
        else:
            sim._push(wake, lambda: sim._resume(self), f"resume {self.name}")
            assert self._driver is not None
            self._driver.switch()
            if self._abort:
                raise _Closed
        if kill:
            raise LambdaTimeout(f"{self.name}: timed out after {self.deadline - self.started_at:.1f} s"
                                if self.deadline is not None else self.name)


class Simulation:
    """Simulated time: timed actions and processes, one running at a time (see the
    module docstring). ``run`` drives it; ``install_clock`` points gpu_recovery's clock
    at it."""

    def __init__(self, *, start: float = DEFAULT_START, seed: int = 0) -> None:
        self.start = start
        self.clock = SimClock(start)
        self.rng = random.Random(seed)
        self._actions = TimedActions(self.clock)
        self.current: Process | None = None
        self._live: set[Process] = set()
        self._ids = itertools.count(1)
        self._closing = False

    @property
    def now(self) -> float:
        """The simulated time (its :class:`~local_mode.sim.clock.SimClock`'s)."""
        return self.clock.now()

    @now.setter
    def now(self, t: float) -> None:
        self.clock.set(t)

    # --- scheduling --------------------------------------------------------------------
    def _push(self, when: float, action: Callable[[], None], label: str) -> None:
        self._actions.push(when, action, label)

    def at(self, when: float, action: Callable[[], None], label: str = "") -> None:
        """Run ``action`` (no simulated time passes inside it) at ``when``."""
        self._push(when, action, label)

    def after(self, delay: float, action: Callable[[], None], label: str = "") -> None:
        self._push(self.now + max(0.0, delay), action, label)

    def _nothing_due_before(self, when: float) -> bool:
        return not self._actions.due_by(when)

    def next_time(self) -> float | None:
        return self._actions.next_time()

    def pending(self) -> int:
        return len(self._actions)

    def token(self, nbytes: int = 16) -> str:
        """Seeded hex (ARNs, ids): runs are reproducible."""
        return f"{self.rng.getrandbits(nbytes * 8):0{nbytes * 2}x}"

    # --- processes ---------------------------------------------------------------------
    def spawn(self, body: Callable[[], Any], *, name: str = "", label: str = "",
              timeout: float | None = None, on_done: Callable[[Process], None] | None = None) -> Process:
        """Start ``body`` as a process now (it runs when the schedule reaches it)."""
        if self._closing:
            raise RuntimeError("the simulation is closed")
        number = next(self._ids)
        process = Process(self, body, name=name or f"process-{number}", label=label or name,
                          deadline=self.now + timeout if timeout is not None else None)
        if on_done is not None:
            process.on_done.append(on_done)
        self._live.add(process)
        self._push(self.now, lambda: self._resume(process), f"start {process.name}")
        return process

    def _resume(self, process: Process) -> None:
        previous = self.current
        self.current = process
        here = greenlet.getcurrent()
        if process._greenlet is None:  # its first turn: it returns here when its body ends
            process._greenlet = greenlet.greenlet(process._main, parent=here)
        process._driver = here
        process._greenlet.switch()
        self.current = previous
        if process.finished:
            self._live.discard(process)
            if not self._closing:
                for callback in process.on_done:
                    callback(process)

    def sleep(self, seconds: float) -> None:
        """``gpu_recovery.clock.sleep``: the running process waits in simulated time."""
        if self.current is None:
            raise RuntimeError("clock.sleep outside a simulated process: run the code with "
                               "Simulation.spawn / run_process")
        self.current.wait(seconds)

    def pause(self, seconds: float) -> None:
        """An AWS call's latency: the running process waits; outside a process (setup code
        called directly) no time passes."""
        if self.current is not None and seconds > 0:
            self.current.wait(seconds)

    def install_clock(self) -> None:
        gr_clock.set_clock(self.clock.now, self.sleep)

    # --- driving -----------------------------------------------------------------------
    def step(self) -> bool:
        if not self._actions:
            return False
        when, action = self._actions.pop()
        self.now = when
        action()
        return True

    def run(self, until: float | None = None, *, stop: Callable[[], bool] | None = None,
            wall_seconds: float | None = None, check_every: int = 1, check_seconds: float = 1.0) -> str:
        """Run until simulated time ``until``, ``stop()`` holds (checked every
        ``check_every`` actions, and whenever ``check_seconds`` of simulated time passed since
        the last check), the schedule is empty, or ``wall_seconds`` of real time passed.
        Returns why it stopped: "until", "stop", "idle" or "wall"."""
        started = _time.monotonic()
        count = 0
        checked_at = self.now
        while True:
            if stop is not None and (count % check_every == 0 or self.now - checked_at >= check_seconds):
                checked_at = self.now
                if stop():
                    return "stop"
            nxt = self.next_time()
            if nxt is None:
                if until is not None:
                    self.now = max(self.now, until)
                return "idle"
            if until is not None and nxt > until:
                self.now = max(self.now, until)
                return "until"
            if wall_seconds is not None and _time.monotonic() - started > wall_seconds:
                return "wall"
            self.step()
            count += 1

    def run_process(self, body: Callable[[], Any], *, name: str = "setup", label: str = "setup") -> Any:
        """Run ``body`` as a process to its end (everything scheduled before it ends runs
        too); its result, or its exception raised here."""
        process = self.spawn(body, name=name, label=label)
        while not process.finished and self.step():
            pass
        if process.error is not None:
            raise process.error
        return process.result

    def close(self) -> None:
        """End every waiting process (each unwinds from its wait; nothing it would start
        afterwards runs) and drop the schedule."""
        self._closing = True
        for process in list(self._live):
            process._abort = True
            self._resume(process)
        self._live.clear()
        self._actions.clear()

