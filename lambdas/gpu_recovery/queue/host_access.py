"""What a queue job's task definition may not reach of its host: the evidence the stack judges
nodes by comes from there.

The node agent reads its node's token from the host (``/etc/gpu-node-agent``) and XIDs from the
kernel log (``/dev/kmsg``, through journald): a training container that can read that token or
write that log could report any XID of the node it runs on (a reboot or a replacement with no
check), and one with the host's PID namespace reaches both through ``/proc``. So the jobs API
refuses, at submit, a task definition that gives a container the host itself (``privileged``,
``pidMode: host``, the capabilities that amount to it), a host volume over the system's
directories, or the kernel's log and memory devices. What GPU training needs stays allowed: the
GPUs, EFA's devices (``/dev/infiniband``), ``ipcMode: host`` and shared memory, ``IPC_LOCK``,
and host volumes of data (``/fsx``, ``/data``, ``/mnt/...``). Tag-registered jobs are started by
their users, not through this check (docs/security.md).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

# A host volume at, inside or above one of these gives the container the host's configuration,
# devices, processes, logs or the container runtime.
PROTECTED_HOST_PATHS = ("/etc", "/dev", "/proc", "/sys", "/run", "/var/run", "/var/lib/ecs",
                        "/var/lib/docker", "/var/log", "/boot", "/root")
REFUSED_DEVICES = ("/dev/kmsg", "/dev/mem", "/dev/kmem", "/dev/port")
REFUSED_CAPABILITIES = ("ALL", "SYS_ADMIN", "SYS_MODULE", "SYS_RAWIO", "SYS_BOOT")


def host_access_refusal(task_definition: Mapping[str, Any]) -> str | None:
    """Why ``task_definition`` (DescribeTaskDefinition's) reaches too far into its host, or None."""
    if str(task_definition.get("pidMode") or "") == "host":
        return "pidMode host shares the host's processes (and through /proc their files)"
    for volume in task_definition.get("volumes") or []:
        source = str(((volume or {}).get("host") or {}).get("sourcePath") or "")
        if source and _protected(source):
            return f"volume {volume.get('name')!r} mounts the host's {source}"
    for container in task_definition.get("containerDefinitions") or []:
        name = container.get("name")
        if container.get("privileged"):
            return f"container {name!r} is privileged"
        linux = container.get("linuxParameters") or {}
        for device in linux.get("devices") or []:
            host_path = posixpath.normpath(str(device.get("hostPath") or "/"))
            if host_path in REFUSED_DEVICES:
                return f"container {name!r} is given the host's {host_path}"
        capabilities = (linux.get("capabilities") or {}).get("add") or []
        added = {str(c).upper().removeprefix("CAP_") for c in capabilities}
        refused = sorted(added & set(REFUSED_CAPABILITIES))
        if refused:
            return f"container {name!r} adds the capabilities {', '.join(refused)}"
    return None


def _protected(source: str) -> bool:
    path = posixpath.normpath("/" + source.lstrip("/"))
    return any(path == p or path.startswith(p + "/") or p.startswith(path.rstrip("/") + "/")
               for p in PROTECTED_HOST_PATHS)
