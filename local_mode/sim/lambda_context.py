"""``LambdaContext``: the Lambda context object every simulated invocation gets, in both worlds.

The moto world's bus (:class:`~local_mode.sim.bus.EventBus`), the local API server
(``local_mode.server``), the campaigns and the scale world's functions
(``local_mode.scale_recovery``) hand their handlers this one class: the fields Powertools
reads (function name, ARN, memory, request id, log group and stream) and the invocation's
time left. In the moto world the time left runs on the wall clock from the context's
creation (``timeout_seconds``); the scale world passes ``seconds_left``, the simulated time
to the invocation's deadline.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ..events import ACCOUNT_ID, REGION


@dataclass
class LambdaContext:
    """The parts of the Lambda context object handlers and Powertools read."""

    function_name: str
    memory_limit_in_mb: int = 256
    function_version: str = "$LATEST"
    timeout_seconds: float = 300
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    region: str = REGION
    account: str = ACCOUNT_ID
    log_group_name: str = ""
    log_stream_name: str = "local"
    #: seconds left in the invocation (None: ``timeout_seconds`` from now, on the wall clock)
    seconds_left: Callable[[], float] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.invoked_function_arn = (
            f"arn:aws:lambda:{self.region}:{self.account}:function:{self.function_name}"
        )
        self.log_group_name = self.log_group_name or f"/aws/lambda/{self.function_name}"
        self._deadline = time.monotonic() + self.timeout_seconds

    def time_left(self) -> float:
        """Seconds left in the invocation."""
        if self.seconds_left is not None:
            return self.seconds_left()
        return self._deadline - time.monotonic()

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int(self.time_left() * 1000))
