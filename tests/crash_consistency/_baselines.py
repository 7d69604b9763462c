"""Each campaign flow's unbroken run, made once per source tree and shared.

The campaigns' tests are parametrized by the positions of the unbroken run's calls, so every
process that collects them (each xdist worker, each ``make`` tier of ``.ci/run``) needs every
flow's unbroken run before a test starts: about 80 s of one core for the 29 flows. The run is
deterministic in the code, so it is kept on disk under a digest of everything it depends on
(the sources the world runs, the AWS packages' versions, Python's), and made by one process:
a flow is made under its lock, and a collector finds the flows another one is making
meanwhile already made when it gets to them (:func:`prefetch`). A change to any of those
sources is a new digest, so a run is never read for code it was not made with.
``GPU_RECOVERY_BASELINES_DIR`` moves the store (default: the system's temporary directory).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]
#: what a flow's unbroken run depends on: the stack, the simulation, the deployment as data
SOURCES = ("lambdas", "local_mode", "infra", "health_check", "agent", "tests/crash_consistency")
SUFFIXES = frozenset({".py", ".json", ".yaml", ".yml", ".sh", ".txt", ".toml"})
PACKAGES = ("moto", "botocore", "boto3", "aws-lambda-powertools", "pydantic")

Run = Callable[[tuple[int, str] | None], Any]
_made: dict[str, Any] = {}


@cache
def tree_digest() -> str:
    digest = hashlib.sha256(sys.version.encode())
    for package in PACKAGES:
        try:
            digest.update(f"{package}=={metadata.version(package)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(package.encode())
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in SUFFIXES and "__pycache__" not in path.parts and path.is_file():
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


def _store() -> Path:
    base = os.environ.get("GPU_RECOVERY_BASELINES_DIR") or os.path.join(tempfile.gettempdir(),
                                                                          "gpu-recovery-baselines")
    store = Path(base) / tree_digest()
    if not store.is_dir():
        store.mkdir(parents=True, exist_ok=True)
        _forget_old(Path(base))
    with contextlib.suppress(OSError):
        os.utime(store)  # read now: not an old store
    return store


def _forget_old(base: Path, days: float = 2.0) -> None:
    """The stores of trees no run read for ``days`` (each edit of the sources makes one)."""
    cutoff = time.time() - days * 86400
    for old in base.iterdir():
        with contextlib.suppress(OSError):
            if old.is_dir() and old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)


def _made_under_lock(name: str, run: Run, lock: IO[str]) -> Any:
    """The flow's run from the store, or made now and stored (``lock`` held)."""
    path = Path(lock.name).with_suffix(".pickle")
    try:
        with open(path, "rb") as stored:
            result = pickle.load(stored)  # noqa: S301 (made by this file, under its digest)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        result = run(None)
        partial = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
        with open(partial, "wb") as out:
            pickle.dump(result, out)
        os.replace(partial, path)  # whole or absent: a reader never sees half of it
    _made[name] = result
    return result


def baseline(name: str, run: Run) -> Any:
    """``run(None)``: the unbroken run of the flow ``name``, made at most once per source tree."""
    if name in _made:
        return _made[name]
    with open(_store() / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _made_under_lock(name, run, lock)


def prefetch(runs: Mapping[str, Run]) -> None:
    """Every one of ``runs``' unbroken runs: those no other process is making first, then
    those it was making (made by then, read)."""
    later = []
    for name, run in runs.items():
        if name in _made:
            continue
        with open(_store() / f"{name}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                later.append(name)
                continue
            _made_under_lock(name, run, lock)
    for name in later:
        baseline(name, runs[name])
