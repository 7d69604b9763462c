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

``go_suspend()`` tells the API the job may be interrupted now: every rank is stopped (ECS
StopTask: SIGTERM, then SIGKILL). It does not return; ``go_suspend(block=False)`` returns
the API's answer instead (tests, simulations).

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
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, Mapping, Optional, Set, Tuple

try:  # POSIX; elsewhere each process polls on its own (at worst a few more requests)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__version__ = "1.0.0"
__all__ = ["ControlError", "SuspendClient", "go_suspend", "receive_suspend_command"]

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
        """Block until ECS stops the task. A Python process running as the container's
        PID 1 ignores SIGTERM while its disposition is the default (the kernel does not
        apply default actions to PID 1): exit on it instead of waiting for SIGKILL."""
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        while True:
            self._sleep(3600)

    # --------------------------------------------------------------------------- HTTP
    def _call(self, method: str, path: str) -> Tuple[int, Any]:
        url = join_url(self.url, path)
        if self.attempt is not None:
            url += "?" + urllib.parse.urlencode({"attempt": self.attempt})
        headers = {"Authorization": "Bearer " + self.token, "Accept": "application/json",
                   "User-Agent": USER_AGENT}
        request = urllib.request.Request(  # noqa: S310 (scheme checked)
            url, data=b"" if method == "POST" else None, headers=headers, method=method)
        with self._opener.open(request, timeout=self.timeout) as response:
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
