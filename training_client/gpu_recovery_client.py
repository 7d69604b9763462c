"""gpu_recovery_client: the suspend contract of time sharing, for training code.

Two calls, with the seed's names and meanings::

    import gpu_recovery_client as client

    if client.receive_suspend_command():   # call it every step; True on rank 0 only
        save_checkpoint()                  # the job is started again from its command
        client.go_suspend()                # any rank; does not return: the task is stopped

``receive_suspend_command() -> bool`` is True once the scheduler (or the job's owner)
decided to suspend the job, on rank 0 only. It asks the job-control API at most every
``poll_seconds`` (2 s unless the API says otherwise) and answers from a cache between
polls; the processes of one container share one poll per interval through a small JSON
file in ``$TMPDIR``. Once True it stays True for the container. Network errors are logged
once and answer False: training never fails because the API is down.

``checkpoint_saved(step)`` (rank 0, after each checkpoint it saved) tells the stack which
step the job can restart from and when it was saved: the job's goodput ledger measures a
fault's lost work from it (without it the lost work is "unknown"). One small request, sent
from a background thread (at most one every ``CHECKPOINT_MIN_INTERVAL_SECONDS``, the latest
step wins), with a short timeout; it never blocks, never raises, and logs a failure once.

``go_suspend()`` tells the API the job may be interrupted now: every rank is stopped (ECS
StopTask: SIGTERM, then SIGKILL). It does not return; ``go_suspend(block=False)`` returns
the API's answer instead (tests, simulations).

The **gang preflight** is a wrapper before the training command::

    python gpu_recovery_client.py preflight -- torchrun ... train.py

It asks the API whether this attempt runs a preflight (after a recovery restart, or at the
first start when the job asks); if so every rank runs its node's loopback all-reduce and the
gang all-reduce (nccl-tests' ``all_reduce_perf`` table, printed by the tool itself or by
this file's own ``allreduce`` benchmark under ``torchrun``), reports it, takes part in the
rounds that pin a failure to its node(s), and then execs the command, or waits to be
stopped when its job restarts without the pinned nodes (docs/preflight.md).

The queue's launcher gives every rank ``GPU_RECOVERY_CONTROL_URL``,
``GPU_RECOVERY_CONTROL_TOKEN`` (its own), ``RANK`` and ``ATTEMPT``. See README.md.

Python standard library only, Python 3.8+ (keep the syntax 3.8-compatible: no ``match``,
no ``X | Y`` / ``list[str]`` annotations, no dict union).
"""

import contextlib
import errno
import hashlib
import json
import logging
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

try:  # POSIX; elsewhere each process polls on its own (at worst a few more requests)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__version__ = "1.0.0"
__all__ = ["ControlError", "PreflightClient", "SuspendClient", "checkpoint_saved", "go_suspend",
           "receive_suspend_command", "run_preflight", "send_report"]

LOG = logging.getLogger("gpu_recovery_client")

URL_ENV = "GPU_RECOVERY_CONTROL_URL"
TOKEN_ENV = "GPU_RECOVERY_CONTROL_TOKEN"
RANK_ENV = "RANK"
ATTEMPT_ENV = "ATTEMPT"

USER_AGENT = "gpu-recovery-client/" + __version__
DEFAULT_POLL_SECONDS = 2.0  # the seed's bound is 5 s from decision to rank 0
MIN_POLL_SECONDS = 1.0  # bounds on what the API may ask for
MAX_POLL_SECONDS = 60.0
HTTP_TIMEOUT_SECONDS = 3.0  # short: a training step waits on a poll
GO_SUSPEND_ATTEMPTS = 4  # first try + 3 retries of a transient failure
BACKOFF_BASE_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 4.0
MAX_MESSAGE_CHARS = 500
CHECKPOINT_MIN_INTERVAL_SECONDS = 5.0  # one checkpoint report per this (the latest step wins)
CHECKPOINT_TIMEOUT_SECONDS = 2.0
MAX_RESPONSE_BYTES = 65536
# The token the launcher makes: <job_id>.<rank>.<mac> (see gpu_recovery.domain.control_token).
_TOKEN_RE = re.compile(r"^([a-z0-9][a-z0-9-]{0,80})\.(\d{1,4})\.[0-9a-f]{40}$")


class ControlError(RuntimeError):
    """The control API refused a call (a 4xx), or could not be reached after retries
    (``status`` None or 5xx/429)."""

    def __init__(self, message: str, status: Optional[int] = None, code: str = "") -> None:
        RuntimeError.__init__(self, message)
        self.status = status
        self.code = code
        self.message = message


# --------------------------------------------------------------------------- helpers


def join_url(base: str, path: str) -> str:
    """Append an absolute API path to a base URL that may carry a path prefix (a stage)."""
    parts = urllib.parse.urlsplit(base.strip())
    prefix = parts.path.rstrip("/")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, prefix + "/" + path.lstrip("/"), "", ""))


def _check_http_url(url: str) -> str:
    """The URL, if it is http(s); urllib would also open file:// and other schemes."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ValueError("%s is not an http(s) URL: %r" % (URL_ENV, url))
    return url


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def _default_opener(url: str) -> Any:
    """Never send local traffic (a local API) through an HTTP proxy."""
    if _is_loopback(url):
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener()


def rank_of_token(token: str) -> Optional[int]:
    """The rank a control token names (the rank the launcher gave this container)."""
    match = _TOKEN_RE.match(token or "")
    return int(match.group(2)) if match else None


def _clamp_poll(value: Any, default: float) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return default
    if seconds != seconds:  # NaN
        return default
    return min(MAX_POLL_SECONDS, max(MIN_POLL_SECONDS, seconds))


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _error_text(error: "urllib.error.HTTPError") -> Tuple[str, str]:
    """(code, message) of an API error body ``{"error", "message"}``."""
    try:
        raw = error.read(MAX_RESPONSE_BYTES).decode("utf-8", "replace")
    except Exception:  # the body may be unreadable; the status is what matters
        raw = ""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict):
        code = str(body.get("error") or "")
        message = str(body.get("message") or raw)
    else:
        code, message = "", raw.strip()
    return code, (message or str(error.reason))[:MAX_MESSAGE_CHARS]


def _retry_after(headers: Any) -> float:
    try:
        return min(MAX_BACKOFF_SECONDS * 2, max(0.0, float(headers.get("Retry-After") or 0)))
    except (TypeError, ValueError, AttributeError):
        return 0.0


class _PollLock(object):
    """Non-blocking exclusive lock on ``path`` (flock): the one process of the container
    that gets it asks the API; the others answer from the shared file meanwhile. The
    kernel releases it if its holder dies, so a crashed process never blocks the rest."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: Optional[int] = None

    def __enter__(self) -> bool:
        if fcntl is None:
            return True
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return True  # cannot lock (read-only dir...): poll anyway, correctness first
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                os.close(self._fd)
                self._fd = None
                return False  # another process is asking right now
            return True  # locks unsupported here (some network file systems)
        return True

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None


# --------------------------------------------------------------------------- client


class SuspendClient(object):
    """The job-control channel of one rank.

    ``url``: the API base URL (may carry a stage path: ``https://.../prod``); ``token``:
    the rank's control token; ``rank``: the rank of this container (default: the rank the
    token names); ``attempt``: the job attempt this process belongs to (an older attempt
    is never told to suspend); ``poll_seconds``: at most one poll per this many seconds
    until the API answers its own ``poll_seconds`` (kept within 1..60 s); ``clock``: wall
    clock in seconds (the shared file compares times between processes); ``state_dir``:
    where the shared poll result lives (default ``$TMPDIR``); ``opener``: an object with
    ``open(request, timeout=)`` like ``urllib.request.OpenerDirector``.
    """

    def __init__(
        self,
        url: str,
        token: str,
        rank: Optional[int] = None,
        attempt: Optional[int] = None,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        clock: Optional[Callable[[], float]] = None,
        state_dir: Optional[str] = None,
        opener: Any = None,
        timeout: float = HTTP_TIMEOUT_SECONDS,
        sleep: Optional[Callable[[float], Any]] = None,
        attempts: int = GO_SUSPEND_ATTEMPTS,
        report_in_background: bool = True,
    ) -> None:
        self.url = _check_http_url((url or "").strip().rstrip("/"))
        self.token = (token or "").strip()
        if not self.token:
            raise ValueError("%s is empty" % TOKEN_ENV)
        named = rank_of_token(self.token)
        if rank is None:
            rank = named
        if rank is None:
            raise ValueError("no rank: pass rank= (the token does not name one)")
        self.rank = int(rank)
        self.attempt = int(attempt) if attempt is not None else None
        self.poll_seconds = _clamp_poll(poll_seconds, DEFAULT_POLL_SECONDS)
        self.timeout = float(timeout)
        self.attempts = max(1, int(attempts))
        self._clock = clock or time.time
        self._sleep = sleep or time.sleep
        self._opener = opener if opener is not None else _default_opener(self.url)
        self.state_dir = state_dir or tempfile.gettempdir()
        # One file per (API, token, attempt): the processes of a container share it; two
        # jobs (or a rank of another attempt) sharing a TMPDIR never see each other's.
        key = "%s\n%s\n%s" % (self.url, self.token, self.attempt)
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]
        self.state_path = os.path.join(self.state_dir, "gpu-recovery-control-%s.json" % digest)
        self._lock = threading.Lock()
        self._told = False
        self._quiet_until = float("-inf")  # no need to look at the shared file before this
        self._failing = False
        self._warned: Set[str] = set()
        # checkpoint_saved(): one pending report (the latest step), sent by one daemon thread.
        self.report_in_background = bool(report_in_background)
        self._checkpoint_cv = threading.Condition()
        self._checkpoint_pending: Optional[int] = None
        self._checkpoint_sent_at = float("-inf")
        self._checkpoint_busy = False
        self._checkpoint_thread: Optional[threading.Thread] = None
        self.checkpoints_reported = 0

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, **kwargs: Any) -> "SuspendClient":
        """The client of this rank, from the launcher's environment; RuntimeError naming
        the missing variable when the job was not started by the queue."""
        env = os.environ if environ is None else environ
        for name in (URL_ENV, TOKEN_ENV):
            if not (env.get(name) or "").strip():
                raise RuntimeError(
                    "%s is not set: this process was not started by the GPU job queue "
                    "(or the deployment has no job-control API), so it has no suspend channel" % name)
        token = env[TOKEN_ENV].strip()
        rank = rank_of_token(token)
        if rank is None:
            # Not a launcher token (the API will refuse it); RANK is the best we know.
            raw_rank = (env.get(RANK_ENV) or "").strip()
            if not raw_rank.isdigit():
                raise RuntimeError("%s is not set (and %s names no rank)" % (RANK_ENV, TOKEN_ENV))
            rank = int(raw_rank)
        raw_attempt = (env.get(ATTEMPT_ENV) or "").strip()
        attempt = int(raw_attempt) if raw_attempt.isdigit() and int(raw_attempt) > 0 else None
        return cls(env[URL_ENV], token, rank=rank, attempt=attempt, **kwargs)

    # ------------------------------------------------------------------ suspend command
    def receive_suspend_command(self) -> bool:
        """True (rank 0 only) once the job is to be suspended: checkpoint, then go_suspend().

        Cheap enough to call every training step; never raises."""
        if self.rank != 0:
            return False  # only rank 0 is ever told: no request at all
        if self._told:
            return True
        # Another thread of this process is asking: answer from what is known, never wait.
        if not self._lock.acquire(blocking=False):
            return self._told
        try:
            return self._receive()
        except Exception as error:  # never break a training step
            self._warn_once("unexpected", "receive_suspend_command() failed (answering False): %r", error)
            return False
        finally:
            self._lock.release()

    def _receive(self) -> bool:
        now = self._clock()
        if self._told:
            return True
        if now < self._quiet_until:
            return False
        state = self.read_state()
        if self._answered(state, now):
            return self._told
        with _PollLock(self.state_path + ".lock") as mine:
            if not mine:
                return False  # another process of this container is asking right now
            state = self.read_state()  # it may have answered between our read and our lock
            if self._answered(state, now):
                return self._told
            return self._poll(now, state)

    def _answered(self, state: Dict[str, Any], now: float) -> bool:
        """Does the shared file already answer for ``now``? (sets _told, _quiet_until)"""
        if state.get("suspend") is True:
            self._told = True
            return True
        checked = _number(state.get("checked_at"))
        interval = _clamp_poll(state.get("poll_seconds"), self.poll_seconds)
        # A time in the future (the clock went back) is not trusted: ask again.
        if checked is not None and checked <= now < checked + interval:
            self._quiet_until = checked + interval
            return True
        return False

    def _poll(self, now: float, state: Dict[str, Any]) -> bool:
        interval = _clamp_poll(state.get("poll_seconds"), self.poll_seconds)
        try:
            _, body = self._call("GET", "/v1/control")
            if not isinstance(body, dict):
                raise ValueError("not a JSON object: %r" % (body,))
        except urllib.error.HTTPError as error:
            code, message = _error_text(error)
            self._poll_failed(now, interval, "HTTP %d %s: %s" % (error.code, code, message))
            return False
        except Exception as error:  # URLError, timeouts, resets, protocol errors, bad JSON
            reason = getattr(error, "reason", error)
            self._poll_failed(now, interval, "%s: %s" % (type(error).__name__, reason))
            return False
        if self._failing:
            LOG.info("job-control API answers again")
            self._failing = False
        suspend = body.get("suspend") is True
        interval = _clamp_poll(body.get("poll_seconds"), interval)
        self._write_state({
            "checked_at": now, "suspend": suspend, "poll_seconds": interval,
            "state": body.get("state"), "attempt": body.get("attempt"),
            "deadline_at": body.get("deadline_at"), "grace_seconds": body.get("grace_seconds"),
            "reason": body.get("reason") or "",
        })
        self._quiet_until = now + interval
        if suspend:
            self._told = True
            LOG.warning("suspend command received (%s): save a checkpoint, then call go_suspend() "
                        "within %s s", body.get("reason") or "suspend", body.get("grace_seconds"))
        return suspend

    def _poll_failed(self, now: float, interval: float, error: str) -> None:
        if not self._failing:
            LOG.warning("job-control API poll failed (%s): answering False until it answers "
                        "again (logged once)", error)
            self._failing = True
        else:
            LOG.debug("job-control API poll failed again: %s", error)
        # Recorded, so the other processes wait for the next interval too.
        self._write_state({"checked_at": now, "suspend": False, "poll_seconds": interval, "error": error})
        self._quiet_until = now + interval

    # ---------------------------------------------------------------------- go_suspend
    def go_suspend(self, block: bool = True) -> Dict[str, Any]:
        """Suspend the job now (any rank). Does not return unless ``block`` is False: the
        task is stopped (SIGTERM, then SIGKILL). Retries transient failures; raises
        ControlError on a refusal (4xx, with the API's message) or when the API stays
        unreachable."""
        ack: Optional[Dict[str, Any]] = None
        attempt = 0
        while ack is None:
            attempt += 1
            wait = 0.0
            try:
                _, body = self._call("POST", "/v1/control/suspend")
                ack = body if isinstance(body, dict) else {}
                LOG.warning("go_suspend(): job %s is %s; ranks %s are being stopped", ack.get("job_id"),
                            ack.get("state"), ack.get("stopping_ranks"))
                break
            except urllib.error.HTTPError as error:
                code, message = _error_text(error)
                failure = ControlError("go_suspend() refused: HTTP %d %s: %s" % (error.code, code, message),
                                       error.code, code)
                if error.code != 429 and error.code < 500:
                    raise failure from None
                wait = _retry_after(error.headers)
            except Exception as error:  # URLError, timeouts, resets, protocol errors
                failure = ControlError("go_suspend() failed: %s: %s" % (type(error).__name__,
                                                                        getattr(error, "reason", error)))
            if attempt >= self.attempts:
                raise failure
            cap = min(MAX_BACKOFF_SECONDS, BACKOFF_BASE_SECONDS * (2 ** (attempt - 1)))
            delay = max(random.uniform(0, cap), wait)  # full jitter
            LOG.info("go_suspend() attempt %d failed (%s); again in %.1f s", attempt, failure, delay)
            self._sleep(delay)
        if not block:
            return ack
        self._wait_to_be_stopped()
        return ack  # pragma: no cover - unreachable: the wait ends with the process

    def _wait_to_be_stopped(self) -> None:
        _wait_to_be_stopped(self._sleep)

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_saved(self, step: int) -> bool:
        """Rank 0 saved a checkpoint at ``step``: report it (never blocks training in the
        background mode, never raises). False on other ranks (nothing sent) or for a bad
        step; True when the report is sent or queued."""
        if self.rank != 0 or isinstance(step, bool) or not isinstance(step, int) or step < 0:
            return False
        with self._checkpoint_cv:
            if self._checkpoint_pending is None or step >= self._checkpoint_pending:
                self._checkpoint_pending = step
            if self.report_in_background:
                self._start_checkpoint_thread()
                self._checkpoint_cv.notify()
                return True
        self._send_due_checkpoint()
        return True

    def flush_checkpoints(self, timeout: float = CHECKPOINT_TIMEOUT_SECONDS * 2) -> bool:
        """Wait (at most ``timeout``) until no checkpoint report is pending or in flight
        (before a process exits, in tests); True when none is left."""
        deadline = time.monotonic() + timeout
        with self._checkpoint_cv:
            while self._checkpoint_pending is not None or self._checkpoint_busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._checkpoint_cv.wait(min(left, 0.05))
        return True

    def _start_checkpoint_thread(self) -> None:
        if self._checkpoint_thread is None or not self._checkpoint_thread.is_alive():
            self._checkpoint_thread = threading.Thread(
                target=self._checkpoint_loop, name="gpu-recovery-checkpoints", daemon=True)
            self._checkpoint_thread.start()

    def _checkpoint_loop(self) -> None:
        while True:
            with self._checkpoint_cv:
                while self._checkpoint_pending is None:
                    self._checkpoint_cv.wait()
                wait = self._checkpoint_sent_at + CHECKPOINT_MIN_INTERVAL_SECONDS - self._clock()
            if wait > 0:
                time.sleep(min(wait, CHECKPOINT_MIN_INTERVAL_SECONDS))
            self._send_due_checkpoint()

    def _send_due_checkpoint(self) -> None:
        """Send the pending step if the rate limit allows (else it waits for a later call)."""
        with self._checkpoint_cv:
            step = self._checkpoint_pending
            if step is None or self._clock() < self._checkpoint_sent_at + CHECKPOINT_MIN_INTERVAL_SECONDS:
                return
            self._checkpoint_pending, self._checkpoint_busy = None, True
            self._checkpoint_sent_at = self._clock()
        try:
            self._call("POST", "/v1/control/checkpoint", {"step": step}, timeout=CHECKPOINT_TIMEOUT_SECONDS)
            self.checkpoints_reported += 1
        except Exception as error:  # URLError, timeouts, resets, 4xx: training goes on regardless
            self._warn_once("checkpoint", "checkpoint_saved(%s) not reported (%s): the job's lost "
                            "work after a fault may be shown as unknown", step, error)
        finally:
            with self._checkpoint_cv:
                self._checkpoint_busy = False
                self._checkpoint_cv.notify_all()

    # --------------------------------------------------------------------------- HTTP
    def _call(self, method: str, path: str, query: Optional[Dict[str, Any]] = None,
              timeout: Optional[float] = None) -> Tuple[int, Any]:
        url = join_url(self.url, path)
        params = dict({"attempt": self.attempt} if self.attempt is not None else {}, **(query or {}))
        if params:
            url += "?" + urllib.parse.urlencode(params)
        headers = {"Authorization": "Bearer " + self.token, "Accept": "application/json",
                   "User-Agent": USER_AGENT}
        request = urllib.request.Request(  # noqa: S310 (scheme checked)
            url, data=b"" if method == "POST" else None, headers=headers, method=method)
        with self._opener.open(request, timeout=self.timeout if timeout is None else timeout) as response:
            raw = response.read(MAX_RESPONSE_BYTES)
            status = getattr(response, "status", 200)
        return status, json.loads(raw.decode("utf-8") or "null")

    # ---------------------------------------------------------------------- shared file
    def read_state(self) -> Dict[str, Any]:
        """The last poll result shared by this container's processes ({} if none)."""
        try:
            with open(self.state_path, "r", encoding="utf-8") as handle:
                state = json.load(handle)
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def _write_state(self, state: Dict[str, Any]) -> None:
        """Atomic (temp file + os.replace): a reader sees the old or the new file, whole."""
        if self.read_state().get("suspend") is True:
            state = dict(state, suspend=True)  # once told, the container stays told
        try:
            fd, tmp = tempfile.mkstemp(prefix=os.path.basename(self.state_path) + ".", dir=self.state_dir)
        except OSError as error:
            self._warn_once("state", "cannot share the poll result in %s (%s): each process asks "
                            "on its own", self.state_dir, error)
            return
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(state, handle)
            os.replace(tmp, self.state_path)
        except OSError as error:
            self._warn_once("state", "cannot share the poll result in %s (%s)", self.state_dir, error)
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            LOG.warning(message, *args)


def _exit_on_sigterm(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


# --------------------------------------------------------------------------- module API

_default_lock = threading.Lock()
_default: Optional[Tuple[Tuple[str, ...], Optional[SuspendClient], str]] = None
_warned_missing: Set[str] = set()


def _env_client() -> Tuple[Optional[SuspendClient], str]:
    """(client, "") from the environment, or (None, why); rebuilt if the environment changed."""
    global _default
    key = tuple(os.environ.get(name, "") for name in (URL_ENV, TOKEN_ENV, RANK_ENV, ATTEMPT_ENV))
    with _default_lock:
        if _default is None or _default[0] != key:
            try:
                _default = (key, SuspendClient.from_env(), "")
            except (RuntimeError, ValueError) as error:
                _default = (key, None, str(error))
        return _default[1], _default[2]


def receive_suspend_command() -> bool:
    """True on rank 0 once the job is to be suspended (save a checkpoint, then call
    go_suspend()); False on every other rank, without any request. Call it every step:
    it asks the API at most every poll interval, and never raises."""
    client, why = _env_client()
    if client is None:
        if why not in _warned_missing:
            _warned_missing.add(why)
            LOG.warning("receive_suspend_command() always answers False: %s", why)
        return False
    return client.receive_suspend_command()


def go_suspend(block: bool = True) -> Dict[str, Any]:
    """Suspend the job now (any rank): every rank is stopped. Does not return: the task is
    stopped by ECS (``block=False``: returns the API's answer). RuntimeError when the
    job has no suspend channel (it names the missing variable), ControlError when the API
    refuses or stays unreachable."""
    client, why = _env_client()
    if client is None:
        raise RuntimeError("go_suspend(): " + why)
    return client.go_suspend(block=block)


def checkpoint_saved(step: int) -> bool:
    """Rank 0 saved a checkpoint at ``step``: tell the stack (in the background, rate-limited,
    never raises; lost work after a fault is measured from it). False on other ranks, or
    when the job has no control channel (logged once)."""
    client, why = _env_client()
    if client is None:
        if why not in _warned_missing:
            _warned_missing.add(why)
            LOG.warning("checkpoint_saved() reports nothing: %s", why)
        return False
    return client.checkpoint_saved(step)


# --------------------------------------------------------------------------- gang preflight
#
# The wrapper asks GET /v1/control/preflight?attempt=N what to do: "skip" (no preflight for
# this attempt) or "train" (it passed, or said nothing conclusive): exec the command; "run":
# run the listed all-reduces (this node's loopback, a group's), POST each one this rank
# reports; "wait": poll again; "stop": the job restarts without the pinned nodes, every rank
# waits to be stopped (never exit 0: the job would look complete).

PREFLIGHT_PATH = "/v1/control/preflight"
PREFLIGHT_COMMAND_ENV = "GPU_RECOVERY_PREFLIGHT_COMMAND"  # a custom all-reduce (template)
PREFLIGHT_GPUS_ENV = "GPU_RECOVERY_PREFLIGHT_GPUS"  # GPUs of this node to use (default: all visible)
PREFLIGHT_ADDR_ENV = "GPU_RECOVERY_PREFLIGHT_ADDR"  # this node's address for its group's peers
ALL_REDUCE_PERF_ENV = "GPU_RECOVERY_ALL_REDUCE_PERF"  # path of nccl-tests' all_reduce_perf
PREFLIGHT_GIVE_UP_SECONDS = 900.0  # the API unreachable this long: go on with the command
MAX_REPORT_CHARS = 11000  # the API takes 12,000 characters of output: the table, not NCCL's chatter
MAX_REPORT_LINES = 64
DEFAULT_MASTER_PORT = 29500
_TABLE_ROW = re.compile(r"^\s*\d+\s+\d+\s+\S+\s+\S+\s+-?\d+\s")
_FAILURE_WORDS = ("Test NCCL failure", "Test CUDA failure", "Test failure", "NCCL error")


class PreflightClient(object):
    """The gang preflight's channel of one rank (its control token, its attempt)."""

    def __init__(self, url: str, token: str, attempt: int, rank: Optional[int] = None, opener: Any = None,
                 timeout: float = HTTP_TIMEOUT_SECONDS, sleep: Optional[Callable[[float], Any]] = None,
                 attempts: int = GO_SUSPEND_ATTEMPTS) -> None:
        self.url = _check_http_url((url or "").strip().rstrip("/"))
        self.token = (token or "").strip()
        if not self.token:
            raise ValueError("%s is empty" % TOKEN_ENV)
        self.attempt = int(attempt)
        named = rank_of_token(self.token)
        self.rank = int(rank if rank is not None else (named if named is not None else -1))
        self.timeout = float(timeout)
        self.attempts = max(1, int(attempts))
        self._sleep = sleep or time.sleep
        self._opener = opener if opener is not None else _default_opener(self.url)

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, **kwargs: Any) -> "PreflightClient":
        env = os.environ if environ is None else environ
        for name in (URL_ENV, TOKEN_ENV, ATTEMPT_ENV):
            if not (env.get(name) or "").strip():
                raise RuntimeError("%s is not set: this process was not started by the GPU job queue, "
                                   "so it runs no preflight" % name)
        raw = env[ATTEMPT_ENV].strip()
        if not raw.isdigit() or int(raw) < 1:
            raise RuntimeError("%s is not a positive integer: %r" % (ATTEMPT_ENV, raw))
        return cls(env[URL_ENV], env[TOKEN_ENV], int(raw), **kwargs)

    def step(self) -> Dict[str, Any]:
        """What this rank does now (retries what is transient; ControlError otherwise)."""
        return self._call("GET", None)

    def report(self, round_: int, test_id: str, exit_code: Optional[int], output: str,
               seconds: Optional[float] = None, address: str = "") -> Dict[str, Any]:
        """An all-reduce this rank ran and reports (its loopback; its group's, as its leader)."""
        body = {"round": int(round_), "test_id": test_id, "exit_code": exit_code,
                "output": report_text(output), "address": address}
        if seconds is not None:
            body["seconds"] = round(max(0.0, float(seconds)), 3)
        return self._call("POST", body)

    def _call(self, method: str, body: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        url = join_url(self.url, PREFLIGHT_PATH) + "?" + urllib.parse.urlencode({"attempt": self.attempt})
        data = json.dumps(body).encode("utf-8") if body is not None else None
        headers = {"Authorization": "Bearer " + self.token, "Accept": "application/json",
                   "User-Agent": USER_AGENT}
        if data is not None:
            headers["Content-Type"] = "application/json"
        failure: Optional[ControlError] = None
        for attempt in range(1, self.attempts + 1):
            wait = 0.0
            request = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310
            try:
                with self._opener.open(request, timeout=self.timeout) as response:
                    answer = json.loads(response.read(MAX_RESPONSE_BYTES).decode("utf-8") or "null")
                if not isinstance(answer, dict):
                    raise ValueError("not a JSON object: %r" % (answer,))
                return answer
            except urllib.error.HTTPError as error:
                code, message = _error_text(error)
                failure = ControlError("preflight %s refused: HTTP %d %s: %s" % (method, error.code, code,
                                                                                 message), error.code, code)
                if error.code != 429 and error.code < 500:
                    raise failure from None
                wait = _retry_after(error.headers)
            except Exception as error:  # URLError, timeouts, resets, bad JSON
                failure = ControlError("preflight %s failed: %s: %s" % (method, type(error).__name__,
                                                                        getattr(error, "reason", error)))
            if attempt < self.attempts:
                cap = min(MAX_BACKOFF_SECONDS, BACKOFF_BASE_SECONDS * (2 ** (attempt - 1)))
                self._sleep(max(random.uniform(0, cap), wait))
        assert failure is not None
        raise failure


def report_text(output: str) -> str:
    """What is sent of an all-reduce's output: its header lines (a few device lines), its
    table and closing lines, and any failure line; not NCCL's INFO chatter (a 1,024-node run
    lists 8,192 devices), at most MAX_REPORT_LINES lines and MAX_REPORT_CHARS characters."""
    kept: List[str] = []
    devices = 0
    for raw in (output or "").splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#  Rank") or stripped.startswith("# Rank"):
            devices += 1
            if devices > 4:
                continue
        if stripped.startswith("#") or _TABLE_ROW.match(stripped) or \
                any(word.lower() in stripped.lower() for word in _FAILURE_WORDS):
            kept.append(line[:300])
    if len(kept) > MAX_REPORT_LINES:
        kept = kept[:4] + kept[-(MAX_REPORT_LINES - 4):]
    text = "\n".join(kept)
    return text[-MAX_REPORT_CHARS:]


def gpu_count(environ: Optional[Mapping[str, str]] = None) -> int:
    """GPUs this container runs on: GPU_RECOVERY_PREFLIGHT_GPUS, else the GPUs ECS assigned
    (NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES), else nvidia-smi -L, else 1."""
    env = os.environ if environ is None else environ
    raw = (env.get(PREFLIGHT_GPUS_ENV) or "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    for name in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        value = (env.get(name) or "").strip()
        if value and value not in ("all", "none", "void"):
            return len([v for v in value.split(",") if v.strip()])
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
        count = sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
        return count or 1
    except (OSError, subprocess.SubprocessError):
        return 1


def node_address(environ: Optional[Mapping[str, str]] = None) -> str:
    """The address this node's group peers reach it at: GPU_RECOVERY_PREFLIGHT_ADDR, else the
    local address of the route to MASTER_ADDR (no packet is sent), else the hostname's."""
    env = os.environ if environ is None else environ
    explicit = (env.get(PREFLIGHT_ADDR_ENV) or "").strip()
    if explicit:
        return explicit
    master = (env.get("MASTER_ADDR") or "").strip()
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master, int(env.get("MASTER_PORT") or DEFAULT_MASTER_PORT)))
                return str(probe.getsockname()[0])
        except (OSError, ValueError):
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return ""


class CommandRunner(object):
    """Runs one preflight test on this node: ``(exit code or None, output, seconds)``.

    A loopback runs nccl-tests' ``all_reduce_perf -g <gpus>`` when the image has it (PATH, or
    GPU_RECOVERY_ALL_REDUCE_PERF), else this file's ``allreduce`` benchmark under ``torchrun
    --standalone``; a group runs the benchmark under ``torchrun`` with the group's rendezvous
    (its leader's address, MASTER_PORT + the test's offset), one process per GPU.
    GPU_RECOVERY_PREFLIGHT_COMMAND replaces both with a command of your own, formatted with
    {nnodes} {nproc} {node_rank} {master_addr} {master_port} {min_bytes} {max_bytes} and
    printing all_reduce_perf's table (e.g. an mpirun of nccl-tests over the group's hosts)."""

    def __init__(self, environ: Optional[Mapping[str, str]] = None, python: Optional[str] = None,
                 script: Optional[str] = None) -> None:
        self.env = dict(os.environ if environ is None else environ)
        self.python = python or sys.executable
        self.script = script or os.path.abspath(__file__)
        self.gpus = gpu_count(self.env)

    def command(self, test: Mapping[str, Any]) -> List[str]:
        nodes = int(test.get("group_size") or 1)
        master = str(test.get("master_addr") or "") or (self.env.get("MASTER_ADDR") or "127.0.0.1")
        port = int(self.env.get("MASTER_PORT") or DEFAULT_MASTER_PORT) + int(test.get("port_offset") or 0)
        values = {"nnodes": nodes, "nproc": self.gpus, "node_rank": int(test.get("group_rank") or 0),
                  "master_addr": master, "master_port": port, "min_bytes": int(test["min_bytes"]),
                  "max_bytes": int(test["max_bytes"])}
        template = (self.env.get(PREFLIGHT_COMMAND_ENV) or "").strip()
        if template:
            return [part.format(**values) for part in shlex.split(template)]
        sizes = ["--min-bytes", str(values["min_bytes"]), "--max-bytes", str(values["max_bytes"])]
        if test.get("kind") == "loopback":
            tool = (self.env.get(ALL_REDUCE_PERF_ENV) or "").strip() or shutil.which("all_reduce_perf")
            if tool:
                return [tool, "-b", str(values["min_bytes"]), "-e", str(values["max_bytes"]), "-f", "2",
                        "-g", str(self.gpus)]
            return [self.python, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                    "--nproc-per-node", str(self.gpus), self.script, "allreduce", *sizes]
        return [self.python, "-m", "torch.distributed.run", "--nnodes", str(nodes),
                "--nproc-per-node", str(self.gpus), "--node-rank", str(values["node_rank"]),
                "--master-addr", master, "--master-port", str(port), self.script, "allreduce", *sizes]

    def __call__(self, test: Mapping[str, Any]) -> Tuple[Optional[int], str, float]:
        started = time.monotonic()
        limit = max(5.0, float(test.get("timeout_seconds") or 120))
        try:
            done = subprocess.run(self.command(test), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=limit, check=False)
            return done.returncode, done.stdout or "", time.monotonic() - started
        except subprocess.TimeoutExpired as expired:
            out = expired.stdout if isinstance(expired.stdout, str) else \
                (expired.stdout or b"").decode("utf-8", "replace")
            took = time.monotonic() - started
            return None, out + "\nTest failure: timed out after %.0f s\n" % limit, took
        except OSError as error:
            return 127, "Test failure: cannot run the all-reduce: %s\n" % error, time.monotonic() - started


TestRunner = Callable[[Mapping[str, Any]], Tuple[Optional[int], str, float]]


def run_preflight(client: PreflightClient, runner: TestRunner, address: str = "",
                  sleep: Optional[Callable[[float], Any]] = None, clock: Optional[Callable[[], float]] = None,
                  give_up_seconds: float = PREFLIGHT_GIVE_UP_SECONDS,
                  log: Optional[Callable[[str], Any]] = None) -> str:
    """The preflight of this rank, to its end: "train" (exec the command: passed, skipped,
    nothing conclusive, or the API unreachable for ``give_up_seconds``) or "stop" (wait to be
    stopped: the job restarts without the node(s) the preflight pinned)."""
    sleep = sleep or time.sleep
    clock = clock or time.monotonic
    say = log or LOG.warning
    done: Set[Tuple[int, str]] = set()
    # Results whose report failed for good (the API's retries spent): sent again at each poll
    # while their round runs, so the stack's own failure never reads as a hung test.
    unsent: Dict[Tuple[int, str], Tuple[Optional[int], str, float]] = {}
    failing_since: Optional[float] = None
    while True:
        try:
            step = client.step()
            failing_since = None
        except ControlError as error:
            if error.status is not None and error.status < 500 and error.status != 429:
                say("preflight refused (%s): going on with the command" % error)
                return "train"
            now = clock()
            failing_since = now if failing_since is None else failing_since
            if now - failing_since > give_up_seconds:
                say("preflight: the control API has been unreachable for %.0f s (%s): going on with the "
                    "command" % (now - failing_since, error))
                return "train"
            sleep(POLL_BACKOFF_SECONDS)
            continue
        action = str(step.get("action") or "")
        if action in ("skip", "train"):
            say("preflight %s: %s" % ("skipped" if action == "skip" else str(step.get("status")),
                                      step.get("reason") or ""))
            return "train"
        if action == "stop":
            say("preflight: %s; this rank waits to be stopped" % (step.get("reason") or "stop"))
            return "stop"
        ran = False
        if action == "run":
            round_ = int(step.get("round") or 0)
            for key in sorted(unsent):
                if key[0] == round_:
                    send_report(client, key, unsent, address, say)
                else:
                    del unsent[key]  # its round is over: the round's bound judged it
            for test in step.get("tests") or []:
                key = (int(step.get("round") or 0), str(test.get("id")))
                if key in done:
                    continue
                ran = True
                exit_code, output, seconds = runner(test)
                done.add(key)
                say("preflight round %s test %s: exit %s in %.1f s" % (key[0], key[1], exit_code, seconds))
                if test.get("report"):
                    unsent[key] = (exit_code, output, seconds)
                    send_report(client, key, unsent, address, say)
        if not ran:
            sleep(_clamp_poll(step.get("poll_seconds"), DEFAULT_POLL_SECONDS))


def send_report(client: PreflightClient, key: Tuple[int, str],
                unsent: Dict[Tuple[int, str], Tuple[Optional[int], str, float]], address: str,
                say: Callable[[str], Any]) -> Optional[Dict[str, Any]]:
    """Send the result of ``key`` (round, test id) from ``unsent``: the answer, or None. Kept
    in ``unsent`` while the API fails (a 5xx, a throttle, no answer); a refusal drops it."""
    exit_code, output, seconds = unsent[key]
    try:
        answer = client.report(key[0], key[1], exit_code, output, seconds, address)
    except ControlError as error:
        say("preflight report of %s failed: %s" % (key[1], error))
        if error.status is None or error.status >= 500 or error.status == 429:
            return None  # sent again at the next poll while its round runs
        answer = None
    del unsent[key]
    return answer


POLL_BACKOFF_SECONDS = 5.0


def _wait_to_be_stopped(sleep: Optional[Callable[[float], Any]] = None) -> None:
    """Block until ECS stops the task. A Python process running as the container's PID 1
    ignores SIGTERM while its disposition is the default (the kernel does not apply default
    actions to PID 1): exit on it instead of waiting for SIGKILL."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    while True:
        (sleep or time.sleep)(3600)


def preflight_main(argv: Sequence[str]) -> int:
    """``preflight [--] command...``: the preflight, then exec the command (or wait to be stopped)."""
    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        sys.stderr.write("usage: gpu_recovery_client.py preflight -- <training command...>\n")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gpu_recovery_client: %(message)s")
    try:
        client = PreflightClient.from_env()
    except (RuntimeError, ValueError) as error:
        LOG.warning("no preflight: %s", error)
        client = None
    if client is not None and run_preflight(client, CommandRunner(), node_address()) == "stop":
        _wait_to_be_stopped()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(args[0], args)  # noqa: S606 (the user's own training command, as given)
    return 127  # pragma: no cover - execvp does not return


# ------------------------------------------------------------------ the all-reduce benchmark
#
# ``allreduce`` (under torchrun, one process per GPU): nccl-tests' all_reduce_perf table,
# printed by rank 0 in the tool's own format, from torch.distributed's NCCL all-reduce of
# float32 sums. busbw = algbw * 2(n-1)/n (nccl-tests PERFORMANCE.md). Out-of-place: the send
# buffer copied into the receive buffer, then reduced in place (torch has no out-of-place
# all-reduce; the copy adds under 1 % at the large sizes). Each size is checked once: every
# rank reduces ones, every element must equal n (#wrong counts those that do not).

WARMUP_ITERS = 5
TIMED_ITERS = 20


def _time_text(usec: float) -> str:
    if usec >= 10000.0:
        return "%7.0f" % usec
    if usec >= 100.0:
        return "%7.1f" % usec
    return "%7.2f" % usec


Half = Tuple[float, float, float, Optional[int]]  # time (us), algbw, busbw, #wrong


def table_row(size: int, count: int, dtype: str, redop: str, root: int, oop: Half, ip: Half) -> str:
    """One row as nccl-tests prints it (``%12li  %12li  %8s  %6s  %6s``, then per half
    ``  %7s  %6.2f  %6.2f  %5g``; #wrong ``N/A`` without validation)."""
    out = "%12li  %12li  %8s  %6s  %6s" % (size, count, dtype, redop, "%6i" % root)
    for usec, algbw, busbw, wrong in (oop, ip):
        out += "  %7s  %6.2f  %6.2f  %5s" % (_time_text(usec), algbw, busbw,
                                             "N/A" if wrong is None else "%g" % wrong)
    return out


Device = Tuple[int, int, str, int, str, str]  # rank, pid, host, device, PCI bus id, name


def table_header(min_bytes: int, max_bytes: int, devices: Sequence[Device]) -> List[str]:
    """all_reduce_perf's header: its parameters, "# Using devices" (rank, pid, host, device,
    PCI bus id, name), the table's column titles."""
    lines = ["# nThread 1 nGpus 1 minBytes %d maxBytes %d step: 2(factor) warmup iters: %d iters: %d "
             "agg iters: 1 validation: 1 graph: 0" % (min_bytes, max_bytes, WARMUP_ITERS, TIMED_ITERS),
             "#", "# Using devices"]
    for rank, pid, host, device, bus, name in devices:
        lines.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s" % (rank, 0, pid, host, device,
                                                                                   bus, name))
    lines += ["#",
              "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
              % ("", "", "", "", ""),
              "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s"
              % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
                 "algbw", "busbw", "#wrong"),
              "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s"
              % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
                 "")]
    return lines


def table_footer(wrong: int, busbws: Sequence[float]) -> List[str]:
    mean = sum(busbws) / len(busbws) if busbws else 0.0
    return ["# Out of bounds values : %d %s" % (wrong, "FAILED" if wrong else "OK"),
            "# Avg bus bandwidth    : %g " % mean, "#"]


def bandwidths(size: int, seconds: float, ranks: int) -> Tuple[float, float]:
    """(algbw, busbw) in GB/s of an all-reduce of ``size`` bytes taking ``seconds``."""
    algbw = size / 1e9 / seconds if seconds > 0 else 0.0
    return algbw, algbw * (2.0 * (ranks - 1) / ranks if ranks > 1 else 1.0)


def allreduce_benchmark(torch: Any, dist: Any, min_bytes: int, max_bytes: int, write: Callable[[str], Any],
                        clock: Callable[[], float] = time.perf_counter) -> int:
    """The benchmark in an initialized process group (``torch``, ``torch.distributed`` passed
    in); rank 0 writes the table. Returns the number of wrong values."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    bus = "%04x:%02x:%02x" % (getattr(props, "pci_domain_id", 0), getattr(props, "pci_bus_id", 0),
                              getattr(props, "pci_device_id", 0))
    mine = (rank, os.getpid(), socket.gethostname(), int(device.index or 0), bus, str(props.name))
    gathered: List[Any] = [None] * ranks
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        for line in table_header(min_bytes, max_bytes, gathered):
            write(line)
    total_wrong, busbws = 0, []
    size = min_bytes
    while size <= max_bytes:
        count = size // 4
        send = torch.ones(count, dtype=torch.float32, device=device)
        recv = torch.empty_like(send)
        timings = []
        for in_place in (False, True):
            for _ in range(WARMUP_ITERS):
                dist.all_reduce(send if in_place else recv.copy_(send))
            torch.cuda.synchronize()
            dist.barrier()
            started = clock()
            for _ in range(TIMED_ITERS):
                dist.all_reduce(send if in_place else recv.copy_(send))
            torch.cuda.synchronize()
            timings.append((clock() - started) / TIMED_ITERS)
        check = torch.ones(count, dtype=torch.float32, device=device)
        dist.all_reduce(check)
        wrong_here = torch.tensor([int((check != float(ranks)).sum().item())], device=device)
        dist.all_reduce(wrong_here)
        wrong = int(wrong_here.item())
        total_wrong += wrong
        halves = []
        for seconds in timings:
            algbw, busbw = bandwidths(size, seconds, ranks)
            halves.append((seconds * 1e6, algbw, busbw, wrong))
            busbws.append(busbw)
        if rank == 0:
            write(table_row(size, count, "float", "sum", -1, halves[0], halves[1]))
        size *= 2
    if rank == 0:
        for line in table_footer(total_wrong, busbws):
            write(line)
    return total_wrong


def allreduce_main(argv: Sequence[str]) -> int:  # pragma: no cover - needs GPUs and torchrun
    """``allreduce --min-bytes N --max-bytes M``, one process per GPU under torchrun."""
    import argparse
    import datetime

    import torch  # the training image's own
    import torch.distributed as dist

    parser = argparse.ArgumentParser(prog="gpu_recovery_client.py allreduce")
    parser.add_argument("--min-bytes", type=int, default=128 * 1024 * 1024)
    parser.add_argument("--max-bytes", type=int, default=1024 * 1024 * 1024)
    options = parser.parse_args(list(argv))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=300))
    try:
        wrong = allreduce_benchmark(torch, dist, options.min_bytes, options.max_bytes,
                                    lambda line: print(line, flush=True))
    finally:
        dist.destroy_process_group()
    return 1 if wrong else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "preflight":
        return preflight_main(args[1:])
    if args and args[0] == "allreduce":
        return allreduce_main(args[1:])
    sys.stderr.write("usage: gpu_recovery_client.py preflight -- <command...> | allreduce [--min-bytes N] "
                     "[--max-bytes M]\n")
    return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
