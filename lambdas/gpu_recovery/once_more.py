"""A call tried once more at once when it fails (:func:`twice`): for a call against a deadline
AWS sets, where the next delivery or the sweep's minute comes too late, and for a claim whose
condition its own token passes again, so that a claim written but whose answer was lost is its
claimer's at once instead of "raced" until its lease ends.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import TypeVar

from botocore.exceptions import BotoCoreError, ClientError

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


def twice(step: Callable[[], _T], *, done: Callable[[_T], bool] = lambda _: True,
          retry_on: tuple[type[Exception], ...] = (ClientError, BotoCoreError)) -> _T:
    """``step`` tried again at once when a call of it fails (or its result is not ``done``).
    The second try's failure is raised; every step given is idempotent."""
    try:
        first = step()
        if done(first):
            return first
    except retry_on as error:
        logger.warning("a call failed: tried again at once", extra={"error": str(error)})
    return step()


def claimed_with_token(claim: Callable[[str], bool]) -> bool:
    """``claim`` made with its claimer's token, random per try, and sent once more when it
    raises: its answer may be lost, the claim written, and the token passes its condition
    again."""
    token = secrets.token_hex(8)
    return twice(lambda: claim(token))
