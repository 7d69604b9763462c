"""``gpu-recovery-admin inject-fault``: inject a fault into the local playground (``make playground``).
``fault`` is its deprecated old name (too close to ``faults``, which reads a job's fault analysis).

    gpu-recovery-admin inject-fault nodes                   # the playground's nodes and what runs there
    gpu-recovery-admin inject-fault xid 79 --job <job id> --rank 1  # XID 79 on the GPU node of rank 1
    gpu-recovery-admin inject-fault xid 48 --node node-2 [--gpu 3] [--persistent]
    gpu-recovery-admin inject-fault xid 79 --node node-2 --repair-does-not-hold  # fails again under load
    gpu-recovery-admin inject-fault dead-gpu --node node-2  # the DCGM diag will say replace
    gpu-recovery-admin inject-fault flap --node node-3 [--times 3] [--seconds 30]  # ECS agent flaps
    gpu-recovery-admin inject-fault app-error --job <job id> [--rank 0] [--exit-code 1]
    gpu-recovery-admin inject-fault lost-node --node node-4 [--seconds 300]  # heartbeats stop
    gpu-recovery-admin inject-fault link --node node-1 --peer node-2 [--factor 0.3]  # a degraded link
    gpu-recovery-admin inject-fault link --job <job id> --rank 0 --peer-rank 1   # between two of its ranks
    gpu-recovery-admin inject-fault slow-node --node node-3 [--factor 0.4] [--network]  # slow under load
    gpu-recovery-admin inject-fault recovery-action reset --node node-2 [--gpu 0]  # the driver's warning
    gpu-recovery-admin inject-fault remap-pending --job <job id> --rank 1  # a row remap waits for a reset
    gpu-recovery-admin inject-fault rising-counter nvlink_replay_errors --node node-3 [--per-hour 600]
    gpu-recovery-admin inject-fault capacity-block-expiry --node node-2  # AWS's notices (docs/aws-notices.md)
    gpu-recovery-admin inject-fault spot-interruption --job <job id> --rank 1
    gpu-recovery-admin inject-fault scheduled-maintenance --node node-3 [--lead-seconds 172800] [--retirement]

Local only: the endpoint (``--endpoint`` or ``$GPUJOBS_ENDPOINT``, what ``make playground``
prints) must be on this machine (127.0.0.1, localhost, ::1); anything else is refused
before a request is sent. The playground answers on its local-only route ``POST
/local/faults``, which no deployed API has. ``--persistent``: a reboot does not fix the
GPU (it faults again; the fault catalog escalates), or the link or node stays slow.
``--repair-does-not-hold [N]``: the node's next N repairs (default 1) do not hold: after each
it passes idle checks and fails again under load, which its validation after repair catches
(docs/remediation.md). A degraded link or a slow node crashes nothing: the gang preflight of
the next job restarted (or started, ``preflight: always``) on it measures it and pins it
(docs/preflight.md). The injected fault is one JSON document on stdout, a sentence on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

ENDPOINT_ENV = "GPUJOBS_ENDPOINT"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
TIMEOUT_SECONDS = 30.0
EXIT_OK, EXIT_UNREACHABLE, EXIT_REFUSED = 0, 1, 2


class FaultError(Exception):
    def __init__(self, message: str, exit_code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", help=f"the playground's local API (default ${ENDPOINT_ENV}); "
                                           "only 127.0.0.1, localhost or ::1")
    actions = parser.add_subparsers(dest="fault_command", required=True)
    nodes = actions.add_parser("nodes", help="the playground's nodes: health, agent, free GPUs, ranks")
    nodes.add_argument("--json", action="store_true", help="print JSON")

    def target(p: argparse.ArgumentParser, rank_help: str = "the rank whose node is hit (default 0)") -> None:
        where = p.add_mutually_exclusive_group(required=True)
        where.add_argument("--node", help="node name (node-1...), instance id or container instance id")
        where.add_argument("--job", help="a job id: the node its --rank runs on now")
        p.add_argument("--rank", type=int, default=0, help=rank_help)

    xid = actions.add_parser("xid", help="the GPU driver logs an XID: the node agent reports it, ranks crash")
    xid.add_argument("xid", type=int, help="XID, e.g. 79 (fallen off the bus), 48 (ECC), 13 (application)")
    target(xid)
    xid.add_argument("--gpu", type=int, default=0, help="GPU index on the node (default 0)")
    xid.add_argument("--persistent", action="store_true", help="a reboot does not fix it")
    xid.add_argument("--repair-does-not-hold", type=int, nargs="?", const=1, default=None, metavar="N",
                     help="the node's next N repairs (default 1) do not hold: it passes idle checks, then "
                          "fails under load (its validation after repair catches it)")
    dead = actions.add_parser("dead-gpu", help="a GPU dies: ranks exit 1, the DCGM diag says replace")
    target(dead)
    dead.add_argument("--gpu", type=int, default=0, help="GPU index on the node (default 0)")
    flap = actions.add_parser("flap", help="the node's ECS agent disconnects and reconnects, repeatedly")
    target(flap)
    flap.add_argument("--times", type=int, default=3, help="disconnections (default 3)")
    flap.add_argument("--seconds", type=float, default=30.0, help="each one this long (default 30)")
    app = actions.add_parser("app-error", help="a rank exits non-zero on healthy GPUs (an application bug)")
    target(app, "the rank that exits (default 0)")
    app.add_argument("--exit-code", type=int, default=1, help="its exit code (default 1)")
    lost = actions.add_parser("lost-node", help="the node agent goes silent: its ranks miss heartbeats")
    target(lost)
    lost.add_argument("--seconds", type=float, default=300.0, help="silent this long (default 300)")
    link = actions.add_parser("link", help="the network path between two nodes is degraded (a gang "
                                           "preflight holding both measures it)")
    target(link)
    peer = link.add_mutually_exclusive_group(required=True)
    peer.add_argument("--peer", help="the link's other node")
    peer.add_argument("--peer-rank", type=int, help="with --job: the node of this rank of the job")
    link.add_argument("--factor", type=float, default=0.3, help="share of its bandwidth left (default 0.3)")
    link.add_argument("--persistent", action="store_true", help="a reboot does not heal it")
    slow = actions.add_parser("slow-node", help="a node is slow under load: its GPUs, or with --network its "
                                                "network path")
    target(slow)
    slow.add_argument("--factor", type=float, default=0.4, help="share of its bandwidth left (default 0.4)")
    slow.add_argument("--network", action="store_true", help="its network path, not its GPUs (its loopback "
                                                             "passes)")
    slow.add_argument("--persistent", action="store_true", help="a reboot does not heal it")
    # The driver's warnings on a GPU that still runs (docs/driver-warnings.md).
    action = actions.add_parser("recovery-action",
                                help="the driver's recovery action changes (the GPU still runs)")
    action.add_argument("action", choices=("reset", "reboot", "drain-p2p", "drain-and-reset"),
                        help="what the driver asks for (nvidia-smi's GPU Recovery Action)")
    target(action)
    action.add_argument("--gpu", type=int, default=0, help="GPU index on the node (default 0)")
    remap = actions.add_parser("remap-pending", help="a row remap waits for a GPU reset (the GPU still runs)")
    target(remap)
    remap.add_argument("--gpu", type=int, default=0, help="GPU index on the node (default 0)")
    rising = actions.add_parser("rising-counter", help="an error counter starts rising (the GPU still runs)")
    rising.add_argument("counter", choices=("nvlink_replay_errors", "nvlink_recovery_errors",
                                            "nvlink_crc_errors", "ecc_corrected_volatile"),
                        help="the counter the node agent reports")
    target(rising)
    rising.add_argument("--per-hour", type=float, default=600.0,
                        help="how fast it rises (default 600/h; the catalog's rates: docs/fault-catalog.md)")
    rising.add_argument("--gpu", type=int, default=0, help="GPU index on the node (default 0)")
    # AWS's own notices that a node goes away (docs/aws-notices.md): the documented event shapes.
    block = actions.add_parser("capacity-block-expiry",
                               help="EC2's Capacity Block Expiration Warning for the node's block (its "
                                    "instances go 10 min later)")
    target(block)
    spot = actions.add_parser("spot-interruption", help="EC2's Spot Instance Interruption Warning (2 min)")
    target(spot)
    scheduled = actions.add_parser("scheduled-maintenance", help="an AWS Health scheduled event for the node "
                                                                 "(reboot maintenance, or --retirement)")
    target(scheduled)
    scheduled.add_argument("--lead-seconds", type=float, default=None,
                           help="the window starts this long from now (default 2 days)")
    scheduled.add_argument("--retirement", action="store_true",
                           help="an instance retirement (the node does not come back) instead of a reboot")


def local_endpoint(endpoint: str | None) -> str:
    """The playground's base URL (scheme://host:port), or FaultError when ``endpoint`` is
    missing or not on this machine."""
    if not endpoint:
        raise FaultError(f"no endpoint: pass --endpoint or set {ENDPOINT_ENV} (make playground prints it)")
    parts = urllib.parse.urlsplit(endpoint.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FaultError(f"invalid endpoint {endpoint!r}: expected http://127.0.0.1:<port>")
    if parts.hostname.lower() not in LOOPBACK_HOSTS:
        raise FaultError(f"fault injection is for the local playground only: {endpoint} is not on this "
                         "machine (a deployed API has no fault route; start one with `make playground`)")
    return f"{parts.scheme}://{parts.netloc}"


def request(base: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{base}{path}", data=data, method=method,  # noqa: S310 (loopback http)
                                 headers={"Content-Type": "application/json", "Accept": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    try:
        with opener.open(req, timeout=TIMEOUT_SECONDS) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as error:
        try:
            doc = json.loads(error.read() or b"{}")
        except ValueError:
            doc = {}
        if error.code == 403 and doc.get("error") == "MISSING_AUTHENTICATION_TOKEN":
            raise FaultError(f"{base} runs no playground (no {path} route): start one with `make playground`"
                             ) from None
        field = f" (field: {doc['field']})" if doc.get("field") else ""
        raise FaultError(f"HTTP {error.code}: {doc.get('message') or error.reason}{field}") from None
    except (OSError, ValueError) as error:
        raise FaultError(f"cannot reach the playground at {base}: {getattr(error, 'reason', error)}",
                         EXIT_UNREACHABLE) from None


def fault_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": args.fault_command.replace("-", "_")}
    if args.node:
        body["node"] = args.node
    else:
        body.update(job_id=args.job, rank=args.rank)
    for name in ("xid", "gpu", "persistent", "times", "seconds", "exit_code", "action", "counter",
                 "per_hour", "repair_does_not_hold", "peer", "peer_rank", "factor", "network",
                 "lead_seconds"):
        if getattr(args, name, None) is not None:
            body[name] = getattr(args, name)
    if getattr(args, "retirement", False):
        body["retirement"] = True
    return body


def run(args: argparse.Namespace) -> int:
    try:
        base = local_endpoint(args.endpoint or os.environ.get(ENDPOINT_ENV))
        if args.fault_command == "nodes":
            nodes = request(base, "GET", "/local/nodes")["nodes"]
            print_nodes(nodes, as_json=args.json)
            return EXIT_OK
        done = request(base, "POST", "/local/faults", fault_body(args))
    except FaultError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    print(json.dumps(done, indent=2, sort_keys=True))
    print(f"injected: {done.get('detail')}; follow it with `gpujobs watch <job id>` and on the playground's "
          "console", file=sys.stderr)
    return EXIT_OK


def print_nodes(nodes: list[dict[str, Any]], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(nodes, indent=2, sort_keys=True))
        return
    rows = [["NODE", "STATUS", "AGENT", "HEALTH", "GPUS FREE", "REBOOTS", "RUNNING"]]
    for node in nodes:
        agent = ("rebooting" if node.get("rebooting") else
                 "connected" if node.get("agent_connected") else "down")
        running = ", ".join("health check" if t.get("health_check") else
                            f"{t.get('job_id')} rank {t.get('rank')}" for t in node.get("tasks") or []) or "-"
        rows.append([str(node.get("name")), str(node.get("status")), agent, str(node.get("health")),
                     f"{node.get('free_gpus')}/{node.get('gpus')}", str(node.get("reboots")), running])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(v.ljust(widths[i]) for i, v in enumerate(row)).rstrip())
