"""AWS API error injection for local mode and tests.

:class:`ApiFaults` answers selected API calls with an AWS-shaped error response
*inside botocore's retry loop* (a ``before-send`` hook that runs before moto's own
stub), so the clients' standard retry mode behaves exactly as against AWS:

* a **transient** fault (``count`` < :data:`ATTEMPTS`) is retried by botocore and
  the call finally succeeds;
* a **persistent** fault (``count=None``, or ``count`` >= :data:`ATTEMPTS`) surfaces
  as ``botocore.exceptions.ClientError`` to the caller.

``MAX_RETRIES`` is the clients' ``max_attempts: 5``; botocore reads that key as *retries*, so a
call makes up to 6 HTTP attempts (:data:`ATTEMPTS`).

Retry back-off is not slept in local mode (see ``LocalAws``), so injected errors
cost no wall time. Usage::

    faults = local.faults
    faults.transient("ecs", "StopTask", failures=2)              # retried, succeeds
    faults.persistent("ec2", "RebootInstances", error=INTERNAL)  # every call fails
    faults.clear()
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing
import os
import pickle
import random
import sys
import threading
import traceback
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from io import BytesIO
from typing import Any

import botocore.session
from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders

from gpu_recovery import clock as gr_clock
from gpu_recovery.adapters.aws import MAX_RETRIES

#: (error code, HTTP status) pairs. Standard retry mode retries all three.
THROTTLING = ("ThrottlingException", 400)
INTERNAL = ("InternalError", 500)
UNAVAILABLE = ("ServiceUnavailable", 503)
#: HTTP attempts per API call with the handlers' retry config (1 + max_attempts).
ATTEMPTS = MAX_RETRIES + 1
#: Not retried by botocore: always surfaces on the first failure.
ACCESS_DENIED = ("AccessDeniedException", 400)

_model_session = botocore.session.get_session()
_protocol_cache: dict[str, tuple[str, str]] = {}
_cache_lock = threading.Lock()


def _service_info(service: str) -> tuple[str, str]:
    """(hyphenized service id as used in event names, wire protocol) of a client name."""
    with _cache_lock:
        if service not in _protocol_cache:
            model = _model_session.get_service_model(service)
            _protocol_cache[service] = (model.service_id.hyphenize(), model.protocol)
        return _protocol_cache[service]


class _RawBody(BytesIO):
    def stream(self, **_: Any) -> Any:
        contents = self.read()
        while contents:
            yield contents
            contents = self.read()


def error_response(url: str, protocol: str, code: str, status: int, message: str) -> AWSResponse:
    """An HTTP error response as the service's wire protocol encodes it."""
    request_id = str(uuid.uuid4())
    headers = HTTPHeaders()
    headers["x-amzn-RequestId"] = request_id
    if protocol in ("json", "rest-json"):
        headers["Content-Type"] = "application/x-amz-json-1.1"
        headers["x-amzn-ErrorType"] = code
        body = json.dumps({"__type": code, "message": message})
    elif protocol == "ec2":
        headers["Content-Type"] = "text/xml"
        body = (
            f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message>"
            f"</Error></Errors><RequestID>{request_id}</RequestID></Response>"
        )
    elif protocol == "query":
        headers["Content-Type"] = "text/xml"
        kind = "Receiver" if status >= 500 else "Sender"
        body = (
            f"<ErrorResponse><Error><Type>{kind}</Type><Code>{code}</Code>"
            f"<Message>{message}</Message></Error><RequestId>{request_id}</RequestId>"
            "</ErrorResponse>"
        )
    else:  # rest-xml
        headers["Content-Type"] = "application/xml"
        body = (
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<RequestId>{request_id}</RequestId></Error>"
        )
    return AWSResponse(url, status, headers, _RawBody(body.encode()))  # type: ignore[arg-type]


@dataclass
class Injection:
    """One armed fault. ``remaining`` None means persistent."""

    service: str
    operation: str
    code: str
    status: int
    remaining: int | None
    message: str
    fired: int = 0


@dataclass
class InjectedError:
    service: str
    operation: str
    code: str
    status: int


@dataclass
class ApiFaults:
    """Registry of armed faults; ``before_send`` is the botocore hook (thread-safe)."""

    injections: list[Injection] = field(default_factory=list)
    #: every error actually returned, in order (thread-safe appends)
    log: list[InjectedError] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def inject(
        self,
        service: str,
        operation: str,
        count: int | None = 1,
        error: tuple[str, int] = THROTTLING,
        message: str = "Injected by local_mode.faults",
    ) -> Injection:
        """Make the next ``count`` HTTP attempts of ``service.operation`` fail.

        ``count=None`` fails every attempt until :meth:`clear`. Attempts, not API
        calls, are counted: botocore retries count too.
        """
        service_id, _ = _service_info(service)
        inj = Injection(service_id, operation, error[0], error[1], count, message)
        with self._lock:
            self.injections.append(inj)
        return inj

    def transient(
        self, service: str, operation: str, failures: int = 2, error: tuple[str, int] = THROTTLING
    ) -> Injection:
        """Fail ``failures`` (< ATTEMPTS) attempts: botocore's standard retries hide them."""
        if failures >= ATTEMPTS:
            raise ValueError(f"a call makes {ATTEMPTS} attempts; use persistent()")
        return self.inject(service, operation, failures, error)

    def persistent(
        self, service: str, operation: str, error: tuple[str, int] = INTERNAL
    ) -> Injection:
        """Fail every attempt until cleared: the caller sees a ClientError."""
        return self.inject(service, operation, None, error)

    def clear(self, service: str | None = None, operation: str | None = None) -> None:
        with self._lock:
            sid = _service_info(service)[0] if service else None
            self.injections = [
                i
                for i in self.injections
                if not ((sid is None or i.service == sid) and (operation in (None, i.operation)))
            ]

    def count(self, service: str | None = None, operation: str | None = None) -> int:
        """How many errors were injected (optionally for one operation)."""
        sid = _service_info(service)[0] if service else None
        with self._lock:
            return sum(
                1
                for e in self.log
                if (sid is None or e.service == sid) and operation in (None, e.operation)
            )

    # botocore hook: before-send.<service-id>.<Operation>
    def before_send(self, request: Any, event_name: str = "", **_: Any) -> AWSResponse | None:
        parts = event_name.split(".")
        if len(parts) < 3:
            return None
        service_id, operation = parts[1], parts[2]
        with self._lock:
            hit = None
            for inj in self.injections:
                if (
                    inj.service == service_id
                    and inj.operation == operation
                    and (inj.remaining is None or inj.remaining > 0)
                ):
                    hit = inj
                    break
            if hit is None:
                return None
            if hit.remaining is not None:
                hit.remaining -= 1
            hit.fired += 1
            self.log.append(InjectedError(service_id, operation, hit.code, hit.status))
            self.injections = [i for i in self.injections if i.remaining != 0]
        protocol = next(
            (p for sid, p in _protocol_cache.values() if sid == service_id), "json"
        )
        url = request.url
        # botocore emits before-send to *every* handler (moto's stubber runs after this
        # one even though we answered). Divert the request so moto does not execute it:
        # a throttled or 5xx call must not change state.
        request.url = "https://fault-injected.invalid/"
        return error_response(url, protocol, hit.code, hit.status, hit.message)


# ============================================================ one fault at one call
THROTTLE = "throttle"  # the call is refused (all its attempts throttled): nothing happens
LOST_RESPONSE = "lost_response"  # the call executes, then its caller never hears back
FAULT_MODES = (THROTTLE, LOST_RESPONSE)
_CALL_INDEX = "local_mode_call_index"


@dataclass
class ApiCall:
    """One API call a handler made (not an HTTP attempt: retries belong to the call)."""

    index: int
    service: str
    operation: str
    site: str = ""  # the recovery code that made it ("recovery/reboots.py:issue")
    at: float | None = None  # when (simulated time), for the calls arm_random broke


def _call_site() -> str:
    # Frames walked directly, innermost first (traceback.extract_stack also read each
    # frame's source line: a twentieth of a campaign's CPU).
    frame = sys._getframe(1)
    for _ in range(48):
        if frame is None:
            break
        path = frame.f_code.co_filename.replace("\\", "/")
        if "/gpu_recovery/" in path and "/adapters/" not in path and "/repository/" not in path:
            return f"{path.rsplit('/gpu_recovery/', 1)[-1]}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


@dataclass
class CallFaults:
    """Counts every API call the handlers make and breaks exactly one of them.

    ``arm(n, mode)`` makes the n-th call (1-based, counted from when it was armed)
    fail once: ``throttle`` answers it with ThrottlingException without executing it
    (as AWS does once botocore's retries are spent); ``lost_response`` lets it execute
    and then raises ``ReadTimeoutError`` to the caller, as when the answer is lost or
    the Lambda dies right after the call. ``calls`` lists every call seen while armed:
    ``disarm()`` ends the flow (calls after it are not the flow's and could not be broken).
    """

    calls: list[ApiCall] = field(default_factory=list)
    target: int | None = None
    mode: str | None = None
    fired: ApiCall | None = None
    record_sites: bool = False
    armed: bool = False
    #: where the unbroken run forks the runs that break its calls (see :func:`broken_runs`)
    forks: _Forks | None = None
    #: ``arm_random``: every call broken with this chance (None: only the ``target``)
    rate: float | None = None
    #: the calls ``arm_random`` broke, with how
    broken: list[tuple[ApiCall, str]] = field(default_factory=list)
    _rng: random.Random | None = field(default=None, repr=False)
    _lost: set[int] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def arm(self, index: int | None, mode: str = THROTTLE, *, record_sites: bool = False) -> None:
        """Count calls from now on; break the ``index``-th (None: only count)."""
        if mode not in FAULT_MODES:
            raise ValueError(f"mode is one of {FAULT_MODES}")
        with self._lock:
            self.calls.clear()
            self.target, self.mode, self.fired = index, mode, None
            self.record_sites = record_sites
            self.armed = True
            self.forks = _active_forks if index is None else None

    def arm_random(self, rate: float, seed: int, *, record_sites: bool = False) -> None:
        """Break every call with chance ``rate`` (seeded: the same run breaks the same calls),
        a throttle or a lost response with equal chance, as AWS does under load."""
        if not 0 <= rate <= 1:
            raise ValueError("rate is a chance, 0..1")
        with self._lock:
            self.calls.clear()
            self.broken.clear()
            self._lost.clear()
            self.target, self.mode, self.fired = None, None, None
            self.rate, self._rng = rate, random.Random(seed)
            self.record_sites = record_sites
            self.armed = True
            self.forks = None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Calls made meanwhile are neither counted nor broken (a client that is not the
        stack's, e.g. a user's scheduler, sharing the handlers' session)."""
        with self._lock:
            was, self.armed = self.armed, False
        try:
            yield
        finally:
            with self._lock:
                self.armed = was

    def disarm(self) -> None:
        with self._lock:
            self.target = self.mode = None
            self.armed = False
            self.forks = None
            self.rate, self._rng = None, None

    # botocore hook: before-call (registered first, so it wins over the simulator's hooks)
    def before_call(self, model: Any, params: Any = None, context: Any = None, **_: Any) -> Any:
        if not self.armed:
            return None
        site = _call_site() if self.record_sites else ""
        with self._lock:
            call = ApiCall(len(self.calls) + 1, model.service_model.service_id.hyphenize(), model.name, site)
            self.calls.append(call)
            forks = self.forks
        if forks is not None:  # outside the lock: a child must not inherit it held
            broken = forks.fork_at(call.index)
            if broken is not None:  # this process is the child that breaks this call
                with self._lock:  # from here on exactly as arm(call.index, broken) would be
                    self.forks = None
                    self.target, self.mode, self.record_sites = call.index, broken, False
        with self._lock:
            if self._rng is not None and self.rate is not None:
                hit = self._rng.random() < self.rate
                mode = self._rng.choice(FAULT_MODES) if hit else None
                if hit and mode is not None:
                    call.at = gr_clock.now()
                    self.broken.append((call, mode))
                    if mode == LOST_RESPONSE:
                        self._lost.add(call.index)
            else:
                hit = self.target == call.index and self.fired is None
                if hit:
                    self.fired = call
                mode = self.mode
        if context is not None:
            context[_CALL_INDEX] = call.index
        if not hit or mode != THROTTLE:
            return None
        code, status = THROTTLING
        http = AWSResponse("https://fault-injected.invalid/", status, HTTPHeaders(), None)  # type: ignore[arg-type]
        return http, {"Error": {"Code": code, "Message": "Rate exceeded (injected)"},
                      "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {},
                                           "RetryAttempts": ATTEMPTS - 1}}

    # botocore hook: after-call (registered last: the simulator has seen the call)
    def after_call(self, http_response: Any = None, parsed: Any = None, model: Any = None,
                   context: Any = None, **_: Any) -> None:
        if context is None:
            return
        with self._lock:
            if self._rng is not None:
                lost = context.get(_CALL_INDEX) in self._lost
                self._lost.discard(context.get(_CALL_INDEX))
            else:
                lost = (self.mode == LOST_RESPONSE and self.fired is not None
                        and self.fired.index == context.get(_CALL_INDEX))
        if lost:
            from botocore.exceptions import ReadTimeoutError

            raise ReadTimeoutError(endpoint_url=f"https://{model.service_model.endpoint_prefix}"
                                                ".us-east-1.amazonaws.com/ (injected: response lost)")


# ============================================== fault runs that share the unbroken prefix
_active_forks: _Forks | None = None


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
    global _active_forks

    def done(forks: _Forks, error: str | None = None) -> None:
        _write_all(out, pickle.dumps((forks.results, forks.skipped, error)))
        os._exit(0)

    forks = _Forks(modes, done)
    _active_forks = forks
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
        if hasattr(outcome, "fault"):
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
    warmed: set[Any] = set()
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
        if mode not in FAULT_MODES:
            raise ValueError(f"mode is one of {FAULT_MODES}")
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
