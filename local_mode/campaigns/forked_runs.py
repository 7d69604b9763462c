"""A campaign's broken runs forked from its unbroken run (:func:`broken_runs`): each run
breaking call n *is* the unbroken run up to call n, so it pays only for what follows."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import pickle
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..emulator import LocalAws
from ..moto_patches import shared_sns_signing_key
from ..sim.broken_calls import ALL_MODES, set_fork_point


class BrokenRunFailed(Exception):
    """A broken run gave no result: it raised (the message is its traceback) or its process died."""


def _threads() -> int:
    """This process's OS threads (threads not started by ``threading`` too: execnet's are not)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


@dataclass
class _Forks:
    """In the driver of :func:`broken_runs`: the calls to break and what their runs gave."""

    modes: dict[int, tuple[str, ...]]  # call index -> the modes to break it in
    done: Callable[[_Forks], None]  # after the last position: hands the results over, ends the driver
    results: dict[tuple[int, str], Any] = field(default_factory=dict)
    skipped: set[int] = field(default_factory=set)  # left to runs from the start (threads were running)
    child_pipe: int | None = None  # in a child: where its result goes
    child_fault: tuple[int, str] | None = None  # in a child: the call it breaks and how

    def fork_at(self, index: int) -> str | None:
        """Before call ``index`` of the unbroken run: one child per mode breaks it.

        Returns the mode to break in a child; None in the driver, once every child has
        ended. Forks only while this thread is the process's only thread (a child would
        have none of the others); otherwise the position is left to a run from the start."""
        if self.child_pipe is not None or index not in self.modes:
            return None
        if _threads() != 1:
            self.skipped.add(index)
        else:
            for mode in self.modes[index]:
                read_end, write_end = os.pipe()
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    os.close(read_end)
                    self.child_pipe, self.child_fault = write_end, (index, mode)
                    LocalAws.disposable_process = True  # it ends with os._exit after its run
                    return mode
                os.close(write_end)
                with os.fdopen(read_end, "rb") as pipe:
                    payload = pipe.read()
                _, status = os.waitpid(pid, 0)
                self.results[(index, mode)] = _received(payload, status, index, mode)
        if index == max(self.modes):
            self.done(self)  # nothing left to fork: the rest of the unbroken run is not needed
        return None

    def send(self, outcome: Any) -> None:
        """In a child: the run's result (or failure) to the driver."""
        assert self.child_pipe is not None
        try:
            payload = pickle.dumps((outcome,))
        except Exception as error:
            payload = pickle.dumps((BrokenRunFailed(f"result not picklable: {error!r}"),))
        _write_all(self.child_pipe, payload)


def _received(payload: bytes, status: int, index: int, mode: str) -> Any:
    try:
        (outcome,) = pickle.loads(payload)  # noqa: S301 (our own child's bytes)
    except Exception:
        outcome = None
    if outcome is None or (status != 0 and not isinstance(outcome, BrokenRunFailed)):
        code = os.waitstatus_to_exitcode(status)
        outcome = BrokenRunFailed(f"the run breaking call {index} ({mode}) ended (exit code {code}) "
                                  "without a result")
    return outcome


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view):]
    os.close(fd)


def _drive(run: Callable[[tuple[int, str] | None], Any], modes: dict[int, tuple[str, ...]], out: int) -> None:
    """The driver process: the unbroken run, forked at every position (see :func:`broken_runs`);
    ``(results, skipped positions, what ended the unbroken run early)`` pickled to ``out``."""
    def done(forks: _Forks, error: str | None = None) -> None:
        _write_all(out, pickle.dumps((forks.results, forks.skipped, error)))
        os._exit(0)

    forks = _Forks(modes, done)
    set_fork_point(forks)
    gc.collect()
    gc.freeze()  # the children's collector leaves the driver's objects (and their pages) alone
    # The driver and its children each run one flow and exit: the cyclic collector was a
    # third of their CPU, and a whole 17-rank run without it grows by ~15 MB.
    gc.disable()
    try:
        outcome: Any = run(None)
    except BaseException:
        outcome = BrokenRunFailed(traceback.format_exc())
    if forks.child_pipe is None:  # the unbroken run ended (or failed) before its last position
        done(forks, outcome.args[0] if isinstance(outcome, BrokenRunFailed) else "ended early")
    try:  # a child: its result to the driver, and the end (no atexit, no pytest teardown)
        # the unbroken run's result names no fault: the child's is the call it broke (a run
        # that broke a first call keeps it, as its run from the start does: then_fired is the second)
        if getattr(outcome, "fault", ()) is None:
            outcome.fault = forks.child_fault
        forks.send(outcome)
    finally:
        os._exit(0)


def _fork_driver(run: Callable[[tuple[int, str] | None], Any], modes: dict[int, tuple[str, ...]]) -> Any:
    """In the fork server: one driver, forked, waited for; what it handed over, or why not."""
    if _threads() != 1:
        return None, "the fork server is running other threads"
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            _drive(run, modes, write_end)
        finally:
            os._exit(1)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        payload = pipe.read()
    _, status = os.waitpid(pid, 0)
    try:
        return pickle.loads(payload), None  # noqa: S301 (our own child's bytes)
    except Exception:
        return None, f"the driver of the broken runs died (exit code {os.waitstatus_to_exitcode(status)})"


def _fork_server(conn: Any) -> None:
    """A fresh process of one thread (multiprocessing's spawn) that forks the drivers; each
    warm-up asked for runs here once (a driver then does not pay for loading moto's services
    and the AWS models)."""
    # The runs' prints (the functions' EMF metric lines) are theirs to keep: a caller hears of a
    # run by its result. Spawned, this process writes to the caller's own stdout, which a
    # campaign's caller (``python -m local_mode.campaigns``: one JSON line per flow) redirects.
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (the process's, for its whole life)
    warmed: set[Any] = set()
    shared_sns_signing_key()  # made once here, not in every forked run that sends an e-mail
    while True:
        try:
            run, modes, warm_up = conn.recv()
        except EOFError:
            return
        if warm_up is not None and warm_up not in warmed:
            warmed.add(warm_up)
            with contextlib.suppress(Exception):
                warm_up()
            gc.collect()
        conn.send(_fork_driver(run, modes))


_server: tuple[Any, Any] | None = None  # (process, connection) of this process's fork server


def _ask_fork_server(run: Callable[[tuple[int, str] | None], Any], modes: dict[int, tuple[str, ...]],
                     warm_up: Callable[[], Any] | None) -> Any:
    global _server
    if _server is None or not _server[0].is_alive():
        ctx = multiprocessing.get_context("spawn")
        here, there = ctx.Pipe()
        process = ctx.Process(target=_fork_server, args=(there,), name="broken-runs-fork-server", daemon=True)
        sys.stdout.flush()
        sys.stderr.flush()
        process.start()
        there.close()
        _server = (process, here)
    try:
        _server[1].send((run, modes, warm_up))
        return _server[1].recv()
    except (EOFError, OSError) as error:
        _server = None
        return None, f"the fork server of the broken runs died ({error!r})"


def broken_runs(run: Callable[[tuple[int, str] | None], Any], faults: Iterable[tuple[int, str]], *,
                warm_up: Callable[[], Any] | None = None) -> dict[tuple[int, str], Any]:
    """``{fault: run(fault)}`` for every fault ``(n, mode)``, without repeating the common
    prefix: a fault run *is* the unbroken run up to the call it breaks.

    ``run(fault)`` runs a campaign's flow (it arms ``LocalAws.call_faults`` with the fault,
    or with None for the unbroken run, and returns a picklable result); it must be picklable
    itself (a module function or a ``functools.partial`` of one). A driver process runs the
    flow unbroken. Just before each position's call it forks one child per mode; the child
    breaks that call exactly as ``arm(n, mode)`` would have from the start, runs the flow to
    its end and sends its result back over a pipe (or :class:`BrokenRunFailed` with the
    traceback; if it died, the driver makes one); the driver waits, then goes on. After the
    last position the driver hands every result over and ends. Each run pays for its suffix.
    A driver whose ``run(None)`` itself breaks a first call (``runner.broken_after``: ``arm(n,
    mode)`` with no ``then``) forks the same way; its children break theirs as ``then`` would
    have, and keep the first fault as their ``fault``.

    Every fork is made by a process of one thread (a child has the forking thread only): the
    driver checks at each position, and is itself forked by this process's fork server, a
    fresh process started once (pytest-xdist's workers run threads of their own) that runs
    each ``warm_up`` (picklable, hashable: e.g. a module function) once. Like any
    multiprocessing user, a script calling this needs the ``if __name__ == "__main__"`` guard.

    Runs not forked (another thread was running at that call, the unbroken run ended or
    failed before it, no ``os.fork``) are run from the start here, with a RuntimeWarning; a run
    that raises gives :class:`BrokenRunFailed`. A driver that dies fails every run it had.
    """
    chosen = sorted(set(faults))
    modes: dict[int, tuple[str, ...]] = {}
    for n, mode in chosen:
        if mode not in ALL_MODES:
            raise ValueError(f"mode is one of {ALL_MODES}")
        modes[n] = (*modes.get(n, ()), mode)
    results: dict[tuple[int, str], Any] = {}
    if chosen and hasattr(os, "fork"):
        handed, failure = _ask_fork_server(run, modes, warm_up)
        if handed is None:
            return {fault: BrokenRunFailed(f"{failure}: no result") for fault in chosen}
        results, skipped, error = handed
        if skipped or error:
            warnings.warn(f"broken_runs: runs made from the start: {len(skipped)} position(s) came while "
                          f"another thread ran; the unbroken run: {error or 'ok'}", RuntimeWarning,
                          stacklevel=2)
    for fault in chosen:
        if fault not in results:
            results[fault] = _from_start(run, fault)
    return results


def _from_start(run: Callable[[tuple[int, str] | None], Any], fault: tuple[int, str]) -> Any:
    try:
        return run(fault)
    except Exception:
        return BrokenRunFailed(traceback.format_exc())
