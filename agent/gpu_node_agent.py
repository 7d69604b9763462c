#!/usr/bin/env python3
"""GPU node agent: heartbeats and GPU telemetry for the ECS GPU recovery API.

Every GPU_AGENT_INTERVAL seconds the agent

1. lists the tasks running on this node (ECS agent introspection API, the
   ``~/.gputasker/running_tasks/*.json`` metadata files of the original
   gputasker design, optional ``<task-id>.step`` progress files),
2. collects GPU telemetry with ``nvidia-smi`` and the NVIDIA Xid errors that
   appeared in the kernel log since the last report,
3. posts ``/v1/report_tasks`` (the heartbeat) and ``/v1/report_gpu``.

Python standard library only, Python 3.8+ (keep the syntax 3.8-compatible:
no ``match``, no ``X | Y`` / ``list[str]`` annotations, no dict union).
See agent/README.md for installation and every setting.
"""

import argparse
import collections
import contextlib
import glob
import ipaddress
import json
import logging
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple

__version__ = "1.0.0"

LOG = logging.getLogger("gpu-node-agent")

USER_AGENT = "gpu-node-agent/" + __version__

GPU_QUERY_FIELDS = (
    "index",
    "uuid",
    "pci.bus_id",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.volatile.total",
)
REMAP_QUERY_FIELDS = ("gpu_uuid", "remapped_rows.pending", "remapped_rows.failure")
# The driver's own recovery action (R565+; "None", "Reset", "Reboot", "Drain P2P", "Drain and
# Reset"). Its own query: a driver that does not know the field refuses the whole query.
RECOVERY_QUERY_FIELDS = ("index", "gpu_recovery_action")
# nvidia-smi's words -> the values the health check reports (health_check/README.md).
RECOVERY_ACTIONS = {
    "none": "none",
    "reset": "gpu_reset",
    "gpu reset": "gpu_reset",
    "reboot": "node_reboot",
    "node reboot": "node_reboot",
    "drain p2p": "drain_p2p",
    "drain and reset": "drain_and_reset",
}
# `nvidia-smi nvlink -e` counters summed over a GPU's links ("Link 3: Replay Errors: 2").
NVLINK_COUNTERS = {
    "replay errors": "nvlink_replay_errors",
    "recovery errors": "nvlink_recovery_errors",
    "crc errors": "nvlink_crc_errors",
}
NVLINK_GPU_RE = re.compile(r"^GPU (\d+):")
NVLINK_LINK_RE = re.compile(r"^Link (\d+): ([A-Za-z][A-Za-z ]*?): (\S+)\s*$")

# Share of the interval one cycle may use in total (collection + both reports).
CYCLE_BUDGET_FRACTION = 0.9
# Share of the remaining budget report_tasks may use before report_gpu gets its turn.
TASKS_REPORT_BUDGET_FRACTION = 0.6
MAX_BACKOFF_SECONDS = 8.0
# Bounded memories.
MAX_SEEN_KERNEL_LINES = 10000
MAX_PENDING_XID_EVENTS = 1000
MAX_SERVER_MESSAGE_CHARS = 500

# "NVRM: Xid (PCI:0000:10:1c): 79, pid=1234, name=python, GPU has fallen off the bus."
# MIG variant: "NVRM: Xid (PCI:0000:07:00 GPU-I:01 GPU-C:00): 45, ..."
XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]+:[0-9A-Fa-f:.]+)[^)]*\): (\d+)")


# --------------------------------------------------------------------------- config


class Config(object):
    """Settings, read from GPU_AGENT_* environment variables (see README.md)."""

    def __init__(self, environ: Optional[Dict[str, str]] = None) -> None:
        env = os.environ if environ is None else environ
        self.api_url = (env.get("GPU_AGENT_API_URL") or "").strip()
        self.interval = _float(env, "GPU_AGENT_INTERVAL", 30.0, minimum=1.0)
        self.node_id = (env.get("GPU_AGENT_NODE_ID") or "").strip() or None
        self.token = (env.get("GPU_AGENT_TOKEN") or "").strip() or None
        self.token_file = env.get("GPU_AGENT_TOKEN_FILE") or "/etc/gpu-node-agent/token"
        self.introspection_url = (
            env.get("GPU_AGENT_ECS_INTROSPECTION_URL") or "http://localhost:51678"
        ).strip()
        self.tasks_dir = os.path.expanduser(env.get("GPU_AGENT_TASKS_DIR") or "~/.gputasker/running_tasks")
        self.progress_dir = env.get("GPU_AGENT_PROGRESS_DIR") or "/var/run/gpu-recovery/progress"
        self.proc_stat = env.get("GPU_AGENT_PROC_STAT") or "/proc/stat"
        self.nvidia_smi = env.get("GPU_AGENT_NVIDIA_SMI") or "nvidia-smi"
        self.xid_command = (env.get("GPU_AGENT_XID_COMMAND") or "").strip() or None
        self.command_timeout = _float(env, "GPU_AGENT_COMMAND_TIMEOUT", 10.0, minimum=0.1)
        self.http_timeout = _float(env, "GPU_AGENT_HTTP_TIMEOUT", 10.0, minimum=0.1)
        self.retry_base = _float(env, "GPU_AGENT_RETRY_BASE_SECONDS", 1.0, minimum=0.0)
        self.log_level = (env.get("GPU_AGENT_LOG_LEVEL") or "INFO").upper()

    @property
    def xid_window_seconds(self) -> int:
        """How far back the kernel log is read each cycle (de-duplication removes overlap)."""
        return int(self.interval) + 10


def _float(env: Any, name: str, default: float, minimum: float) -> float:
    raw = env.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        LOG.warning("invalid %s=%r, using default %s", name, raw, default)
        return default
    return max(value, minimum)


# --------------------------------------------------------------------------- helpers


def join_url(base: str, path: str) -> str:
    """Append an absolute API path to a base URL that may carry a path prefix (a stage)."""
    parts = urllib.parse.urlsplit(base.strip())
    prefix = parts.path.rstrip("/")
    return urllib.parse.urlunsplit(
        (parts.scheme, parts.netloc, prefix + "/" + path.lstrip("/"), parts.query, "")
    )


def check_http_url(url: str) -> str:
    """The URL, if it is http(s); urllib would also open file:// and other schemes."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ValueError("not an http(s) URL: %r" % url)
    return url


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_DIRECT_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_DEFAULT_OPENER = urllib.request.build_opener()


def _opener_for(url: str) -> Any:
    """Never send local traffic (ECS introspection, a local API) through an HTTP proxy."""
    return _DIRECT_OPENER if _is_loopback(url) else _DEFAULT_OPENER


def _to_int(value: Any) -> Optional[int]:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        text = str(value).strip()
        if not text:
            return None
        return int(float(text)) if "." in text else int(text)
    except (TypeError, ValueError):
        return None


def task_id_from_arn(arn: str) -> str:
    """arn:aws:ecs:region:acct:task/cluster/abc -> abc (the last path segment)."""
    return arn.rstrip("/").rsplit("/", 1)[-1]


# --------------------------------------------------------------------------- subprocesses


class CommandError(Exception):
    """A command could not be run, timed out or failed."""


class CommandRunner(object):
    """Runs commands with a hard timeout without ever blocking on a stuck child.

    Each child gets its own process group, killed as a whole on timeout. A child
    that does not die at once (e.g. nvidia-smi stuck in the kernel on a lost GPU)
    is left behind and reaped in a later cycle instead of being waited for.
    """

    def __init__(self) -> None:
        self._orphans: List[subprocess.Popen] = []

    def reap(self) -> None:
        self._orphans = [p for p in self._orphans if p.poll() is None]
        if self._orphans:
            LOG.warning("%d timed-out command(s) still not exited", len(self._orphans))

    def run(self, argv: List[str], timeout: float) -> Tuple[int, str, str]:
        if timeout <= 0:
            raise CommandError("no time left in this cycle to run %s" % argv[0])
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
        except FileNotFoundError:
            raise CommandError("%s: command not found" % argv[0]) from None
        except OSError as exc:
            raise CommandError("%s: %s" % (argv[0], exc)) from None
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            raise CommandError("%s timed out after %.1fs" % (argv[0], timeout)) from None
        return (
            proc.returncode,
            out.decode("utf-8", "replace"),
            err.decode("utf-8", "replace"),
        )

    def _kill(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            with contextlib.suppress(OSError):
                proc.kill()
        try:
            proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            self._orphans.append(proc)
        except (OSError, ValueError):
            pass


# --------------------------------------------------------------------------- nvidia-smi


def parse_smi_value(text: Optional[str]) -> Optional[str]:
    """nvidia-smi placeholders ("[N/A]", "[Not Supported]", "N/A", "") become None."""
    if text is None:
        return None
    value = text.strip()
    if not value or value.startswith("[") or value.upper() in ("N/A", "NA"):
        return None
    return value


def parse_smi_int(text: Optional[str]) -> Optional[int]:
    return _to_int(parse_smi_value(text))


def parse_smi_bool(text: Optional[str]) -> Optional[bool]:
    value = parse_smi_value(text)
    if value is None:
        return None
    low = value.lower()
    if low in ("yes", "true", "enabled", "pending"):
        return True
    if low in ("no", "false", "disabled"):
        return False
    number = _to_int(value)
    return None if number is None else number != 0


def normalize_pci_bus_id(text: str) -> Optional[str]:
    """Canonical "dddd:bb:dd" (domain:bus:device, lower case) of a PCI address.

    nvidia-smi prints "00000000:10:1C.0", the kernel "PCI:0000:10:1c"; both give
    "0000:10:1c". The function number is dropped (a GPU is function 0).
    """
    value = text.strip()
    if value.upper().startswith("PCI:"):
        value = value[4:]
    parts = value.split(":")
    try:
        if len(parts) == 3:
            domain, bus, devfn = parts
        elif len(parts) == 2:
            domain, bus, devfn = "0", parts[0], parts[1]
        else:
            return None
        device = devfn.split(".", 1)[0]
        return "%04x:%02x:%02x" % (int(domain, 16), int(bus, 16), int(device, 16))
    except ValueError:
        return None


def parse_gpu_csv(text: str) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Rows of ``--query-gpu=<GPU_QUERY_FIELDS> --format=csv,noheader,nounits``.

    Returns (gpus, problems): a line that is not a row (e.g. "Unable to determine
    the device handle for GPU0000:10:1C.0: Unknown Error") goes to problems.
    """
    gpus: List[Dict[str, Any]] = []
    problems: List[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        cells = [c.strip() for c in line.split(",")]
        index = _to_int(cells[0]) if cells else None
        if len(cells) != len(GPU_QUERY_FIELDS) or index is None:
            problems.append(line)
            continue
        bus = parse_smi_value(cells[2])
        gpus.append(
            {
                "index": index,
                "uuid": parse_smi_value(cells[1]),
                "pci_bus_id": normalize_pci_bus_id(bus) if bus else None,
                "utilization_gpu": parse_smi_int(cells[3]),
                "memory_used_mib": parse_smi_int(cells[4]),
                "memory_total_mib": parse_smi_int(cells[5]),
                "temperature_c": parse_smi_int(cells[6]),
                "ecc_uncorrected_volatile": parse_smi_int(cells[7]),
                "ecc_corrected_volatile": parse_smi_int(cells[8]),
            }
        )
    return gpus, problems


def parse_recovery_action(text: Optional[str]) -> Optional[str]:
    """nvidia-smi's "GPU Recovery Action" as the health check names it; None for N/A or
    nothing; "unknown" for a value the man page does not list (logged once a cycle)."""
    value = parse_smi_value(text)
    if value is None:
        return None
    found = RECOVERY_ACTIONS.get(" ".join(value.lower().split()))
    if found is None:
        LOG.warning("GPU recovery action not recognized: %r", value)
        return "unknown"
    return found


def parse_recovery_csv(text: str) -> Dict[int, Optional[str]]:
    """GPU index -> recovery action from ``--query-gpu=index,gpu_recovery_action --format=csv,noheader``."""
    result: Dict[int, Optional[str]] = {}
    for raw in text.splitlines():
        cells = [c.strip() for c in raw.strip().split(",")]
        if len(cells) != len(RECOVERY_QUERY_FIELDS):
            continue
        index = _to_int(cells[0])
        if index is not None:
            result[index] = parse_recovery_action(cells[1])
    return result


def parse_nvlink_errors(text: str) -> Dict[int, Dict[str, int]]:
    """GPU index -> {counter: sum over its links} from ``nvidia-smi nvlink -e``.

    Lines look like "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)" then, per link,
    "Link 0: Replay Errors: 0" / "Recovery Errors" / "CRC Errors". Other counters (newer
    drivers print more) and other lines are ignored; a GPU that lists no known counter
    (no NVLink) is left out.
    """
    result: Dict[int, Dict[str, int]] = {}
    gpu: Optional[int] = None
    for raw in text.splitlines():
        line = raw.strip()
        head = NVLINK_GPU_RE.match(line)
        if head:
            gpu = int(head.group(1))
            continue
        link = NVLINK_LINK_RE.match(line)
        if gpu is None or not link:
            continue
        name = NVLINK_COUNTERS.get(" ".join(link.group(2).lower().split()))
        value = parse_smi_int(link.group(3))
        if name is None or value is None:
            continue
        counters = result.setdefault(gpu, {})
        counters[name] = counters.get(name, 0) + value
    return result


def parse_remap_csv(text: str) -> Dict[str, Tuple[Optional[bool], Optional[bool]]]:
    """uuid -> (pending, failure) from ``--query-remapped-rows=<REMAP_QUERY_FIELDS>``."""
    result: Dict[str, Tuple[Optional[bool], Optional[bool]]] = {}
    for raw in text.splitlines():
        cells = [c.strip() for c in raw.strip().split(",")]
        if len(cells) != len(REMAP_QUERY_FIELDS):
            continue
        uuid = parse_smi_value(cells[0])
        if uuid and uuid.upper().startswith("GPU-"):
            result[uuid] = (parse_smi_bool(cells[1]), parse_smi_bool(cells[2]))
    return result


def collect_gpus(
    config: Config,
    runner: CommandRunner,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """(gpus, error). gpus carry "pci_bus_id" for Xid mapping; it is removed before sending."""

    def timeout() -> float:
        return min(config.command_timeout, deadline - clock())

    argv = [
        config.nvidia_smi,
        "--query-gpu=" + ",".join(GPU_QUERY_FIELDS),
        "--format=csv,noheader,nounits",
    ]
    try:
        code, out, err = runner.run(argv, timeout())
    except CommandError as exc:
        return [], str(exc)
    gpus, problems = parse_gpu_csv(out)
    error = None
    if code != 0 or problems:
        detail = " | ".join(problems + [ln.strip() for ln in err.splitlines() if ln.strip()])
        detail = detail[:MAX_SERVER_MESSAGE_CHARS] or "no output"
        error = "nvidia-smi exited %d: %s" % (code, detail)
    if not gpus:
        return [], error or "nvidia-smi listed no GPU"

    remap: Dict[str, Tuple[Optional[bool], Optional[bool]]] = {}
    argv = [
        config.nvidia_smi,
        "--query-remapped-rows=" + ",".join(REMAP_QUERY_FIELDS),
        "--format=csv,noheader,nounits",
    ]
    try:
        code, out, _err = runner.run(argv, timeout())
        remap = parse_remap_csv(out)
        if code != 0:
            LOG.debug("nvidia-smi --query-remapped-rows exited %d", code)
    except CommandError as exc:
        # Pre-Ampere GPUs have no row remapper: not an error of the report.
        LOG.debug("remapped rows unavailable: %s", exc)
    for gpu in gpus:
        pending, failure = remap.get(gpu.get("uuid") or "", (None, None))
        gpu["remapped_rows_pending"] = pending
        gpu["remapped_rows_failure"] = failure

    recovery = _optional_query(
        runner,
        [config.nvidia_smi, "--query-gpu=" + ",".join(RECOVERY_QUERY_FIELDS), "--format=csv,noheader"],
        timeout(),
        parse_recovery_csv,
        "recovery action unavailable (a driver before R565)",
    )
    nvlink = _optional_query(
        runner, [config.nvidia_smi, "nvlink", "-e"], timeout(), parse_nvlink_errors,
        "NVLink error counters unavailable (no NVLink)",
    )
    for gpu in gpus:
        gpu["recovery_action"] = recovery.get(gpu["index"])
        counters = nvlink.get(gpu["index"]) or {}
        for name in NVLINK_COUNTERS.values():
            gpu[name] = counters.get(name)
    return gpus, error


def _optional_query(runner: "CommandRunner", argv: List[str], timeout: float,
                    parse: Callable[[str], Dict[int, Any]], missing: str) -> Dict[int, Any]:
    """A query some drivers or GPUs cannot answer: its parsed output, or {} (not an error of
    the report: the fields are null)."""
    try:
        code, out, err = runner.run(argv, timeout)
    except CommandError as exc:
        LOG.debug("%s: %s", missing, exc)
        return {}
    if code != 0:
        LOG.debug("%s: %s exited %d: %s", missing, " ".join(argv[1:]), code, err.strip()[:200])
        return {}
    return parse(out)


# --------------------------------------------------------------------------- Xids


class XidTracker(object):
    """Reads NVIDIA Xid errors from the kernel log and returns each log line once.

    The kernel log is read over a window a bit longer than the interval, so
    consecutive reads overlap; lines already seen (a bounded memory) are skipped.
    Events not yet delivered (report failed) are kept for the next report.
    """

    def __init__(self, config: Config, runner: CommandRunner) -> None:
        self.config = config
        self.runner = runner
        self._seen: collections.OrderedDict = collections.OrderedDict()
        self._pending: List[Tuple[str, int]] = []
        self._warned = False

    def commands(self) -> List[List[str]]:
        window = str(self.config.xid_window_seconds)
        if self.config.xid_command:
            return [shlex.split(self.config.xid_command.replace("{window}", window))]
        return [
            # Timestamps keep two identical messages distinct for the de-duplication.
            [
                "journalctl",
                "-k",
                "-q",
                "--no-pager",
                "-o",
                "short-monotonic",
                "--since",
                "-%ss" % window,
            ],
            ["dmesg"],
        ]

    def read_kernel_log(self, deadline: float, clock: Callable[[], float]) -> Optional[str]:
        errors = []
        for argv in self.commands():
            try:
                timeout = min(self.config.command_timeout, deadline - clock())
                code, out, err = self.runner.run(argv, timeout)
            except CommandError as exc:
                errors.append(str(exc))
                continue
            if code == 0:
                return out
            errors.append("%s exited %d: %s" % (argv[0], code, err.strip()[:200]))
        # Warn once, then keep quiet: a node without kernel-log access stays that way.
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        LOG.log(level, "cannot read the kernel log for Xids: %s", "; ".join(errors))
        return None

    def parse_new(self, text: str) -> List[Tuple[str, int]]:
        """(pci "dddd:bb:dd", xid) for every Xid line not seen before."""
        events = []
        for raw in text.splitlines():
            line = raw.strip()
            match = XID_RE.search(line)
            if not match:
                continue
            if line in self._seen:
                self._seen.move_to_end(line)
                continue
            self._seen[line] = True
            while len(self._seen) > MAX_SEEN_KERNEL_LINES:
                self._seen.popitem(last=False)
            pci = normalize_pci_bus_id(match.group(1)) or match.group(1).lower()
            events.append((pci, int(match.group(2))))
        return events

    def collect(self, deadline: float, clock: Callable[[], float] = time.monotonic) -> List[Tuple[str, int]]:
        """Undelivered + new Xid events; call delivered() once they reached the API."""
        text = self.read_kernel_log(deadline, clock)
        if text is not None:
            self._pending.extend(self.parse_new(text))
            del self._pending[:-MAX_PENDING_XID_EVENTS]
        return list(self._pending)

    def delivered(self, count: int) -> None:
        del self._pending[:count]


def attach_xids(gpus: List[Dict[str, Any]], events: List[Tuple[str, int]]) -> List[Dict[str, Any]]:
    """Adds "xids" to each GPU; returns the events whose PCI address matches no GPU."""
    by_pci: Dict[str, Dict[str, Any]] = {}
    for gpu in gpus:
        gpu["xids"] = []
        if gpu.get("pci_bus_id"):
            by_pci[gpu["pci_bus_id"]] = gpu
    unmapped: List[Dict[str, Any]] = []
    for pci, xid in events:
        found = by_pci.get(pci)
        if found is None:
            unmapped.append({"pci_bus_id": pci, "xid": xid})
        else:
            found["xids"].append(xid)
    return unmapped


# --------------------------------------------------------------------------- tasks


def _http_get_json(url: str, timeout: float) -> Any:
    if timeout <= 0:
        raise OSError("no time left in this cycle")
    request = urllib.request.Request(  # noqa: S310 (scheme checked)
        check_http_url(url), headers={"User-Agent": USER_AGENT}
    )
    with _opener_for(url).open(request, timeout=timeout) as response:
        return json.loads(response.read().decode("utf-8"))


def introspection_tasks(config: Config, timeout: float) -> List[Dict[str, Any]]:
    """RUNNING tasks from the ECS agent introspection API; [] on a node without ECS."""
    url = join_url(config.introspection_url, "/v1/tasks")
    try:
        data = _http_get_json(url, timeout)
    except (OSError, ValueError, urllib.error.URLError) as exc:
        LOG.debug("ECS introspection %s unavailable: %s", url, exc)
        return []
    if not isinstance(data, dict):
        LOG.debug("ECS introspection %s: unexpected response", url)
        return []
    tasks = []
    for task in data.get("Tasks") or []:
        if not isinstance(task, dict) or task.get("KnownStatus") != "RUNNING":
            continue
        arn = task.get("Arn")
        if arn:
            tasks.append({"task_arn": arn})
    return tasks


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    except OSError:
        return False
    return True


def metadata_tasks(config: Config) -> List[Dict[str, Any]]:
    """Tasks from the gputasker metadata files whose process is still alive."""
    tasks = []
    for path in sorted(glob.glob(os.path.join(config.tasks_dir, "*.json"))):
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            LOG.warning("skipping task metadata file %s: %s", path, exc)
            continue
        pid = _to_int(data.get("remote_pid"))
        if pid is not None and pid > 0 and not _pid_alive(pid):
            LOG.debug("task metadata %s: pid %d is gone, not reported", path, pid)
            continue
        log_id = data.get("running_log_id")
        task = {
            "task_arn": data.get("task_arn") or None,
            "running_log_id": None if log_id in (None, "") else str(log_id),
            "remote_pid": pid,
            "remote_pgid": _to_int(data.get("remote_pgid")),
            "step": _to_int(data.get("step")),
        }
        if not task["task_arn"] and not task["running_log_id"]:
            LOG.warning("skipping task metadata file %s: no running_log_id or task_arn", path)
            continue
        tasks.append(task)
    return tasks


def read_step(config: Config, key: str) -> Optional[int]:
    if not key or "/" in key or key.startswith("."):
        return None
    path = os.path.join(config.progress_dir, key + ".step")
    try:
        with open(path, encoding="utf-8") as handle:
            return _to_int(handle.read(64))
    except OSError:
        return None


def read_boot_time(path: str) -> Optional[float]:
    """Host boot time (epoch seconds) from the ``btime`` line of /proc/stat, or None.

    Sent with each task report so the service can tell a rebooted node is back even if
    the ECS agent-disconnect event was missed.
    """
    try:
        with open(path) as handle:
            for line in handle:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        LOG.debug("no boot time from %s", path)
    return None


def collect_tasks(config: Config, timeout: float) -> List[Dict[str, Any]]:
    """Every task on the node, merged by task ARN, with null fields omitted."""
    merged: collections.OrderedDict = collections.OrderedDict()
    for task in introspection_tasks(config, timeout) + metadata_tasks(config):
        key = task.get("task_arn") or ("log:" + str(task.get("running_log_id")))
        entry = merged.setdefault(key, {})
        for name, value in task.items():
            if value is not None and entry.get(name) is None:
                entry[name] = value
    result = []
    for entry in merged.values():
        key = task_id_from_arn(entry["task_arn"]) if entry.get("task_arn") else None
        step = read_step(config, key) if key else None
        if step is None and entry.get("running_log_id"):
            step = read_step(config, entry["running_log_id"])
        if step is not None:
            entry["step"] = step
        result.append({k: v for k, v in entry.items() if v is not None})
    return result


def resolve_node_id(config: Config, timeout: float, cached: Optional[str] = None) -> Optional[str]:
    if config.node_id:
        return config.node_id
    url = join_url(config.introspection_url, "/v1/metadata")
    try:
        arn = (_http_get_json(url, timeout) or {}).get("ContainerInstanceArn")
    except (OSError, ValueError, AttributeError, urllib.error.URLError) as exc:
        LOG.debug("ECS introspection %s unavailable: %s", url, exc)
        return cached
    return task_id_from_arn(arn) if arn else cached


def read_token(config: Config) -> Optional[str]:
    """GPU_AGENT_TOKEN, else the token file, re-read every cycle so rotation works."""
    if config.token:
        return config.token
    try:
        with open(config.token_file, encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError as exc:
        LOG.warning("cannot read token file %s: %s", config.token_file, exc)
        return None


# --------------------------------------------------------------------------- HTTP


class PostResult(object):
    def __init__(
        self,
        ok: bool,
        status: Optional[int] = None,
        attempts: int = 0,
        error: Optional[str] = None,
    ) -> None:
        self.ok = ok
        self.status = status
        self.attempts = attempts
        self.error = error

    def summary(self) -> str:
        state = "ok" if self.ok else "failed"
        return "%s(status=%s,attempts=%d)" % (state, self.status or "-", self.attempts)


def _retry_after(headers: Any) -> float:
    try:
        return max(0.0, float(headers.get("Retry-After") or 0))
    except (TypeError, ValueError):
        return 0.0


def post_json(
    url: str,
    body: Dict[str, Any],
    token: Optional[str],
    deadline: float,
    config: Config,
    clock: Callable[[], float] = time.monotonic,
    sleep: Optional[Callable[[float], Any]] = None,
) -> PostResult:
    """POST JSON; retries network errors, 5xx and 429 with backoff until the deadline."""
    try:
        check_http_url(url)
    except ValueError as exc:
        LOG.error("%s", exc)
        return PostResult(False, None, 0, str(exc))
    data = json.dumps(body, separators=(",", ":")).encode("utf-8")
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    if token:
        headers["Authorization"] = "Bearer " + token
    do_sleep = sleep or time.sleep
    opener = _opener_for(url)
    attempt = 0
    status: Optional[int] = None
    error: Optional[str] = None
    while True:
        remaining = deadline - clock()
        if remaining <= 0.05:
            error = error or "no time left in this cycle"
            break
        attempt += 1
        wait_at_least = 0.0
        request = urllib.request.Request(  # noqa: S310 (scheme checked)
            url, data=data, headers=headers, method="POST"
        )
        try:
            with opener.open(request, timeout=min(config.http_timeout, remaining)) as response:
                status = response.status
                response.read(65536)
            return PostResult(True, status, attempt)
        except urllib.error.HTTPError as exc:
            status = exc.code
            try:
                message = exc.read(4096).decode("utf-8", "replace").strip()
            except Exception:  # the body may be unreadable, the status is what matters
                message = ""
            message = message[:MAX_SERVER_MESSAGE_CHARS]
            error = "HTTP %d: %s" % (status, message or exc.reason)
            if status != 429 and status < 500:
                LOG.warning("%s rejected with %s (not retried)", url, error)
                return PostResult(False, status, attempt, error)
            wait_at_least = _retry_after(exc.headers)
            LOG.debug("%s attempt %d: %s", url, attempt, error)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            # URLError, timeouts, resets, and http.client errors (HTTPException is
            # not an OSError: caught below).
            status = None
            error = "%s: %s" % (type(exc).__name__, getattr(exc, "reason", exc))
            LOG.debug("%s attempt %d: %s", url, attempt, error)
        except Exception as exc:  # http.client.HTTPException and other protocol errors
            status = None
            error = "%s: %s" % (type(exc).__name__, exc)
            LOG.debug("%s attempt %d: %s", url, attempt, error)
        cap = min(MAX_BACKOFF_SECONDS, config.retry_base * (2 ** (attempt - 1)))
        backoff = random.uniform(0, cap)  # full jitter
        delay = max(backoff, wait_at_least)
        if clock() + delay >= deadline - 0.05:
            break
        do_sleep(delay)
    LOG.warning("%s failed after %d attempt(s): %s", url, attempt, error)
    return PostResult(False, status, attempt, error)


# --------------------------------------------------------------------------- agent


class Agent(object):
    def __init__(
        self,
        config: Config,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        stop_event: Optional[threading.Event] = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.wall_clock = wall_clock
        self.stop_event = stop_event or threading.Event()
        self.runner = CommandRunner()
        self.xids = XidTracker(config, self.runner)
        self.node_id: Optional[str] = None

    def _sleep(self, seconds: float) -> None:
        self.stop_event.wait(seconds)

    def run_cycle(self) -> bool:
        """One collection + report round. True if both reports were accepted."""
        cfg = self.config
        start = self.clock()
        deadline = start + cfg.interval * CYCLE_BUDGET_FRACTION

        def left(cap: float) -> float:
            return max(0.0, min(cap, deadline - self.clock()))

        self.runner.reap()
        self.node_id = resolve_node_id(cfg, left(2.0), self.node_id)
        tasks = collect_tasks(cfg, left(2.0))
        gpus, gpu_error = collect_gpus(cfg, self.runner, deadline, self.clock)
        events = self.xids.collect(deadline, self.clock)
        unmapped = attach_xids(gpus, events)
        for gpu in gpus:
            gpu.pop("pci_bus_id", None)
        xid_count = sum(len(g["xids"]) for g in gpus) + len(unmapped)

        if not cfg.api_url or not self.node_id:
            problem = "no node id (set GPU_AGENT_NODE_ID or run the ECS agent)"
            if not cfg.api_url:
                problem = "GPU_AGENT_API_URL is not set"
            LOG.error("cycle ok=false node_id=%s error=%r", self.node_id or "-", problem)
            return False

        token = read_token(cfg)
        timestamp = self.wall_clock()
        tasks_body = {"node_id": self.node_id, "timestamp": timestamp, "tasks": tasks}
        boot_time = read_boot_time(cfg.proc_stat)
        if boot_time is not None:
            tasks_body["boot_time"] = boot_time
        gpu_body: Dict[str, Any] = {"node_id": self.node_id, "timestamp": timestamp, "gpus": gpus}
        if unmapped:
            gpu_body["unmapped_xids"] = unmapped
        if gpu_error:
            gpu_body["error"] = gpu_error

        now = self.clock()
        tasks_deadline = now + (deadline - now) * TASKS_REPORT_BUDGET_FRACTION
        tasks_result = post_json(
            join_url(cfg.api_url, "/v1/report_tasks"),
            tasks_body,
            token,
            tasks_deadline,
            cfg,
            self.clock,
            self._sleep,
        )
        gpu_result = post_json(
            join_url(cfg.api_url, "/v1/report_gpu"),
            gpu_body,
            token,
            deadline,
            cfg,
            self.clock,
            self._sleep,
        )
        if gpu_result.ok:
            self.xids.delivered(len(events))
        ok = tasks_result.ok and gpu_result.ok
        LOG.info(
            "cycle ok=%s node_id=%s tasks=%d gpus=%d xids=%d report_tasks=%s report_gpu=%s "
            "gpu_error=%s duration=%.2fs",
            str(ok).lower(),
            self.node_id,
            len(tasks),
            len(gpus),
            xid_count,
            tasks_result.summary(),
            gpu_result.summary(),
            "none" if not gpu_error else repr(gpu_error),
            self.clock() - start,
        )
        return ok

    def safe_cycle(self) -> bool:
        try:
            return self.run_cycle()
        except Exception:  # one cycle's failure never stops the loop
            LOG.exception("cycle ok=false error=unexpected")
            return False

    def _cycle_then_set(self, done: threading.Event) -> None:
        try:
            self.safe_cycle()
        finally:
            done.set()

    def run_forever(self) -> None:
        """Cycles every interval until stop_event is set.

        Each cycle runs in a daemon thread so that a stop request is honoured
        within a fraction of a second even while a request is in flight.
        """
        while not self.stop_event.is_set():
            start = self.clock()
            done = threading.Event()
            threading.Thread(
                target=self._cycle_then_set, args=(done,), name="gpu-agent-cycle", daemon=True
            ).start()
            while not done.is_set() and not self.stop_event.is_set():
                self.stop_event.wait(0.1)
            if self.stop_event.is_set():
                break
            self.stop_event.wait(max(0.0, start + self.config.interval - self.clock()))


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s gpu-node-agent %(message)s"))
    LOG.handlers[:] = [handler]
    LOG.setLevel(getattr(logging, level, logging.INFO))
    LOG.propagate = False


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="GPU node agent (heartbeats + GPU telemetry)")
    parser.add_argument(
        "--once", action="store_true", help="run one cycle and exit; exit code 1 if a report failed"
    )
    parser.add_argument("--version", action="version", version=__version__)
    args = parser.parse_args(argv)

    config = Config()
    setup_logging(config.log_level)
    agent = Agent(config)
    if args.once:
        return 0 if agent.safe_cycle() else 1

    def on_signal(signum: int, _frame: Any) -> None:
        LOG.info("stopping on signal %d", signum)
        agent.stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    LOG.info(
        "starting version=%s api=%s interval=%ss",
        __version__,
        config.api_url or "-",
        config.interval,
    )
    agent.run_forever()
    LOG.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
