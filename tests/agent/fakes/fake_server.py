"""A local HTTP server on 127.0.0.1 acting as the ECS agent introspection API and
the report API at once, recording every request it receives."""

from __future__ import annotations

import json
import os
import stat
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FAKES_DIR = Path(__file__).resolve().parent
SMI_DIR = FAKES_DIR / "nvidia_smi"
KERNEL_LOG_DIR = FAKES_DIR / "kernel_log"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] | None = None
    hang: bool = False  # never answer (until the server stops)


class FakeServer:
    """ECS introspection (GET /v1/tasks, /v1/metadata) + report API (POST anything).

    ``script(path, *replies)`` queues replies for a path; once the queue is empty
    the path answers ``default`` (200 {"ok": true}).
    """

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.ecs_tasks: dict[str, Any] = {"Tasks": []}
        self.ecs_metadata: dict[str, Any] | None = {
            "Cluster": "gpu-training",
            "ContainerInstanceArn": (
                "arn:aws:ecs:us-east-1:123456789012:container-instance/"
                "gpu-training/0f1e2d3c4b5a69788796a5b4c3d2e1f0"
            ),
            "Version": "Amazon ECS Agent - v1.80.0",
        }
        self.default = Reply(200, {"ok": True})
        self._scripts: dict[str, list[Reply]] = {}
        self._lock = threading.Lock()
        self._release = threading.Event()
        self.first_post = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any, headers: dict[str, str] | None) -> None:
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                server._record(self, None)
                if self.path == "/v1/tasks":
                    self._send(200, server.ecs_tasks, None)
                elif self.path == "/v1/metadata" and server.ecs_metadata is not None:
                    self._send(200, server.ecs_metadata, None)
                else:
                    self._send(404, {"message": "not found"}, None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                server._record(self, body)
                server.first_post.set()
                reply = server._next_reply(self.path)
                if reply.hang:
                    server._release.wait(10)
                    return
                self._send(reply.status, reply.body, reply.headers)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    # -- control ---------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def script(self, path: str, *replies: Reply) -> None:
        with self._lock:
            self._scripts.setdefault(path, []).extend(replies)

    def posts(self, path_suffix: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == "POST" and r.path.endswith(path_suffix)]

    # -- internals -------------------------------------------------------------

    def _record(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        with self._lock:
            self.requests.append(
                Recorded(
                    handler.command,
                    handler.path,
                    {k.lower(): v for k, v in handler.headers.items()},
                    body,
                )
            )

    def _next_reply(self, path: str) -> Reply:
        with self._lock:
            queue = self._scripts.get(path)
            return queue.pop(0) if queue else self.default


def write_executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def fake_nvidia_smi(
    directory: Path,
    gpu_csv: str = "healthy_gpu.csv",
    remap_csv: str = "healthy_remap.csv",
    sleep_seconds: float = 0,
    recovery_csv: str = "healthy_recovery_action.csv",
    nvlink_txt: str | Path = "real/nvlink_e_h100_ml_engineering.txt",
) -> Path:
    """An executable ``nvidia-smi`` printing recorded output; it logs its arguments. A
    recording's own header lines (starting ``# ``: where it comes from) are not printed. A
    recording named ``*.exit<N>.*`` is printed with exit code N (a query the driver refuses)."""
    calls = directory / "nvidia-smi.calls"

    def show(name: str | Path) -> str:
        path = SMI_DIR / name
        code = next((part[4:] for part in path.name.split(".") if part.startswith("exit")), "0")
        return f"sed '/^# /d' '{path}'; exit {code}"

    script = f"""#!/bin/sh
echo "$*" >> '{calls}'
if [ "{sleep_seconds}" != "0" ]; then sleep {sleep_seconds}; fi
case "$*" in
  *--query-remapped-rows=*) {show(remap_csv)} ;;
  *--query-gpu=index,gpu_recovery_action*) {show(recovery_csv)} ;;
  *--query-gpu=*) {show(gpu_csv)} ;;
  "nvlink -e") {show(nvlink_txt)} ;;
  *) echo "unexpected arguments: $*" >&2; exit 2 ;;
esac
"""
    return write_executable(directory / "nvidia-smi", script)


def fake_kernel_log(directory: Path) -> tuple[Path, Path]:
    """A kernel-log command printing the current content of a file (swap it between cycles)."""
    source = directory / "kmsg.txt"
    source.write_text("")
    command = write_executable(directory / "fake-kernel-log", f"#!/bin/sh\ncat '{source}'\n")
    return command, source


def env_without_proxy() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
