"""CloudWatch Logs of the scale world: lines by (group, stream), what the tasks print, the
health check's verdict among them (:class:`~local_mode.sim.aws_stand_ins.LogsClient` reads
it; the moto world writes to moto's CloudWatch Logs)."""

from __future__ import annotations

from typing import Any


class LogStore:
    """CloudWatch Logs: lines by (group, stream)."""

    def __init__(self) -> None:
        self.streams: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def put(self, group: str, stream: str, at: float, message: str) -> None:
        self.streams.setdefault((group, stream), []).append(
            {"timestamp": int(at * 1000), "message": message, "ingestionTime": int(at * 1000)})
