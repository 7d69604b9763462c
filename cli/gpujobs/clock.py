"""Time, behind indirections the tests replace (no real waiting, a fixed clock).

Callers look these up at call time (``clock.sleep(...)``), so replacing the module's
attribute replaces them everywhere."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

sleep: Callable[[float], None] = time.sleep
monotonic: Callable[[], float] = time.monotonic


def utcnow() -> datetime:
    return datetime.now(UTC)
