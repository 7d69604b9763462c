"""One AWS call broken once: the crash campaigns' fault (``LocalAws.call_faults``).

:class:`CallFaults` counts every API call the handlers make once a flow is armed (a call, not
an HTTP attempt: botocore's retries belong to the call) and breaks exactly one of them, or
(``arm_random``) each with a chance: ``throttle`` refuses it without executing it,
``lost_response`` executes it and loses its answer; ``arm(n, shape)`` answers it in its
operation's documented failure shape instead (``local_mode.sim.answers``: a transaction
cancelled for throttling, a BatchGetItem's unprocessed keys, an empty GetLogEvents page, an
ECS ``failures`` entry). The fork points of
:func:`local_mode.campaigns.forked_runs.broken_runs` hook in here (:func:`set_fork_point`).
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any, Protocol

from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders

from gpu_recovery import clock as gr_clock

from .answers import SHAPE_KEY, SHAPE_MODES, shape_for
from .api_errors import ATTEMPTS, THROTTLING

THROTTLE = "throttle"  # the call is refused (all its attempts throttled): nothing happens
LOST_RESPONSE = "lost_response"  # the call executes, then its caller never hears back
#: what breaks any call
FAULT_MODES = (THROTTLE, LOST_RESPONSE)
#: every mode a call can be broken in: the two above, and the documented failure shapes
#: (``answers.SHAPE_MODES``) for the calls whose operation takes one
ALL_MODES = (*FAULT_MODES, *SHAPE_MODES)


def modes_of(service: str, operation: str) -> tuple[str, ...]:
    """The modes a call of ``service.operation`` can be broken in: throttle, lost response and
    its operation's failure shape, if it has one."""
    shape = shape_for(service, operation)
    return (*FAULT_MODES, shape) if shape else FAULT_MODES
_CALL_INDEX = "local_mode_call_index"


class ForkPoint(Protocol):
    """Where an unbroken run forks the runs that break its calls (``forked_runs``)."""

    def fork_at(self, index: int) -> str | None:
        """Before call ``index``: the mode to break it in (in a forked child), or None."""


#: the fork point of this process's unbroken run, if it is one (``set_fork_point``)
_fork_point: ForkPoint | None = None


def set_fork_point(point: ForkPoint | None) -> None:
    """Runs armed without a second fault (``arm(None)``, ``arm(n, mode)``: no ``then``) fork at
    ``point`` from now on: a child of an unbroken run breaks the call it forks at as ``arm``
    would have (its ``target``); a child of a run that breaks a first call breaks it as ``then``
    would have (the second fault: ``runner.broken_after``)."""
    global _fork_point
    _fork_point = point



@dataclass
class ApiCall:
    """One API call a handler made (not an HTTP attempt: retries belong to the call)."""

    index: int
    service: str
    operation: str
    site: str = ""  # the recovery code that made it ("recovery/reboots.py:issue")
    at: float | None = None  # when (simulated time), for the calls arm_random broke


#: where a call is never its own site but its caller's: the ports' implementations, the one
#: way every node task starts (a check's StartTask is the check's site, a reset's the reset's),
#: the one way every task is started once (a gang restart's StartTask is the gang's site) and
#: the one way a call is tried again at once (its caller's site, named with the way it went:
#: ``reboots.py:issue.claimed_with_token``, apart from the write ``issue`` makes after the reboot)
_ONCE_MORE_FILE = "once_more.py"
_SHARED_MECHANISMS = ("/adapters/", "/repository/", "/recovery/node_tasks.py", "/recovery/task_starts.py",
                      f"/gpu_recovery/{_ONCE_MORE_FILE}")


#: a code file's path -> its part after ``/gpu_recovery/`` when a call made there is that
#: file's own site, else None (outside the recovery code, or a shared mechanism). A pure
#: function of the path (nothing invalidates it): a frame then costs one dict lookup, not a
#: replace and five substring searches (they were ~0.6 % of a crash campaign's armed CPU).
_SITE_FILE: dict[str, str | None] = {}


def _site_file(filename: str) -> str | None:
    path = filename.replace("\\", "/")
    if "/gpu_recovery/" in path and not any(shared in path for shared in _SHARED_MECHANISMS):
        return path.rsplit("/gpu_recovery/", 1)[-1]
    return None


def _function_name(code: CodeType) -> str:
    """A function's name; a ``lambda``'s is its enclosing function's and ``.<lambda>``
    (``_assess.<lambda>``): its own site, apart from the calls its function makes itself."""
    if code.co_name != "<lambda>":
        return code.co_name
    return code.co_qualname.split(".<locals>.")[0].rsplit(".", 1)[-1] + ".<lambda>"


def _call_site() -> str:
    # Frames walked directly, innermost first (traceback.extract_stack also read each
    # frame's source line: a twentieth of a campaign's CPU).
    frame: FrameType | None = sys._getframe(1)
    site_file = _SITE_FILE
    via = ""
    for _ in range(48):
        if frame is None:
            break
        code = frame.f_code
        try:
            where = site_file[code.co_filename]
        except KeyError:
            where = site_file[code.co_filename] = _site_file(code.co_filename)
        if where is not None:
            return f"{where}:{_function_name(code)}{via}"
        if code.co_name != "<lambda>" and code.co_filename.endswith(_ONCE_MORE_FILE):
            via = f".{code.co_name}"  # the outermost: the way its caller chose
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
    #: where the unbroken run forks the runs that break its calls (see ``forked_runs``)
    forks: ForkPoint | None = None
    #: ``arm_random``: every call broken with this chance (None: only the ``target``)
    rate: float | None = None
    #: the calls ``arm_random`` broke, with how
    broken: list[tuple[ApiCall, str]] = field(default_factory=list)
    #: ``arm(..., then=(m, mode))``: the call broken after the ``target`` (None: none), and
    #: what it broke once it fired
    then: tuple[int, str] | None = None
    then_fired: ApiCall | None = None
    _rng: random.Random | None = field(default=None, repr=False)
    _lost: set[int] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def arm(self, index: int | None, mode: str = THROTTLE, *, record_sites: bool = False,
            then: tuple[int, str] | None = None) -> None:
        """Count calls from now on; break the ``index``-th (None: only count) in ``mode`` (a
        failure shape: answered in it, if its operation takes it); ``then``: a later call
        broken too, (its index, its mode), as the recovery from the first makes it."""
        if mode not in ALL_MODES or (then is not None and then[1] not in ALL_MODES):
            raise ValueError(f"mode is one of {ALL_MODES}")
        if then is not None and (index is None or then[0] <= index):
            raise ValueError("the second broken call comes after the first")
        with self._lock:
            self.calls.clear()
            self._lost.clear()
            self.target, self.mode, self.fired = index, mode, None
            self.then, self.then_fired = then, None
            self.record_sites = record_sites
            self.armed = True
            self.forks = _fork_point if then is None else None

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
    def recording(self) -> Iterator[list[ApiCall]]:
        """Every call made meanwhile, with its site, none broken (what a test says a step calls):
        the list is filled when the block ends."""
        seen: list[ApiCall] = []
        self.arm(None, record_sites=True)
        try:
            yield seen
        finally:
            seen.extend(self.calls)
            self.disarm()

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
            self.then = None
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
                with self._lock:
                    self.forks = None
                    if self.target is None:  # from here on exactly as arm(call.index, broken) would be
                        self.target, self.mode, self.record_sites = call.index, broken, False
                    else:  # a first fault armed (fired before): as arm(target, mode, then=...) would be
                        self.then = (call.index, broken)
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
                if self.then is not None and self.then[0] == call.index and self.then_fired is None:
                    hit, mode, self.then_fired = True, self.then[1], call
                if hit and mode == LOST_RESPONSE:
                    self._lost.add(call.index)
        if context is not None:
            context[_CALL_INDEX] = call.index
            if hit and mode in SHAPE_MODES:
                context[SHAPE_KEY] = mode  # answered in it by LocalAws.answers
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
            lost = context.get(_CALL_INDEX) in self._lost
            self._lost.discard(context.get(_CALL_INDEX))
        if lost:
            from botocore.exceptions import ReadTimeoutError

            raise ReadTimeoutError(endpoint_url=f"https://{model.service_model.endpoint_prefix}"
                                                ".us-east-1.amazonaws.com/ (injected: response lost)")
