"""``gpu-recovery-admin``: issue, revoke and list node report tokens; the blast-radius breaker.

    gpu-recovery-admin issue-token --node-id <container-instance-id>   # prints the token once
    gpu-recovery-admin revoke-token --node-id <container-instance-id>
    gpu-recovery-admin list-tokens
    gpu-recovery-admin breaker show
    gpu-recovery-admin breaker reset --resume-backlog | --drop-backlog

``breaker`` reads and writes the breaker's item in the container-instance table
(``--instance-table`` or ``$CONTAINER_INSTANCE_TABLE_NAME``). ``reset --resume-backlog``
releases the held-back node actions: the recovery sweep carries them out within a
minute (entries older than ``--max-backlog-age-hours``, default 24, are dropped: a stale
backlog is not replayed); ``--drop-backlog`` forgets them.

The table is ``--table`` or ``$NODE_TOKEN_TABLE_NAME`` (the stack output
``NodeTokenTableName``); credentials and region come from the usual AWS settings
(``--region`` / ``--profile`` override them). Only the token's SHA-256 hash is stored:
a lost token cannot be recovered, issue a new one (which also invalidates the old).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from gpu_recovery.constants import (
    DEFAULT_INSTANCE_TABLE_NAME,
    DEFAULT_JOB_TABLE_NAME,
    DEFAULT_NODE_TOKEN_TABLE_NAME,
    ENV_INSTANCE_TABLE,
    ENV_JOB_TABLE,
    ENV_NODE_TOKEN_TABLE,
)
from gpu_recovery.tokens import TokenError, TokenStore


def _store(args: argparse.Namespace) -> TokenStore:
    import boto3

    session = boto3.session.Session(profile_name=args.profile, region_name=args.region)
    table = args.table or os.environ.get(ENV_NODE_TOKEN_TABLE) or DEFAULT_NODE_TOKEN_TABLE_NAME
    return TokenStore(session.resource("dynamodb").Table(table))


def _caller() -> str:
    return os.environ.get("USER") or os.environ.get("USERNAME") or "gpu-recovery-admin"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-recovery-admin", description=__doc__.split("\n")[0])
    parser.add_argument("--table", help=f"node-token table (default ${ENV_NODE_TOKEN_TABLE} or "
                                        f"{DEFAULT_NODE_TOKEN_TABLE_NAME})")
    parser.add_argument("--region", help="AWS region")
    parser.add_argument("--profile", help="AWS profile")
    sub = parser.add_subparsers(dest="command", required=True)
    issue = sub.add_parser("issue-token", help="create or rotate a node's token; prints it once")
    issue.add_argument("--node-id", required=True, help="ECS container instance id of the node")
    revoke = sub.add_parser("revoke-token", help="revoke a node's token")
    revoke.add_argument("--node-id", required=True)
    sub.add_parser("list-tokens", help="list nodes and token status (never the tokens)")
    breaker = sub.add_parser("breaker", help="show or reset the blast-radius breaker")
    breaker.add_argument("--instance-table", help=f"container-instance table (default ${ENV_INSTANCE_TABLE} "
                                                  f"or {DEFAULT_INSTANCE_TABLE_NAME})")
    actions = breaker.add_subparsers(dest="breaker_command", required=True)
    actions.add_parser("show", help="state, nodes acted on in the window, backlog")
    reset = actions.add_parser("reset", help="close the breaker: resume or drop its backlog")
    choice = reset.add_mutually_exclusive_group(required=True)
    choice.add_argument("--resume-backlog", action="store_true",
                        help="carry the held-back node actions out (the recovery sweep does it)")
    choice.add_argument("--drop-backlog", action="store_true", help="forget the held-back node actions")
    reset.add_argument("--max-backlog-age-hours", type=float, default=24.0,
                       help="with --resume-backlog: drop entries older than this (default 24)")
    return parser


def _repository(args: argparse.Namespace) -> Any:
    import boto3

    from gpu_recovery.repository import Repository

    session = boto3.session.Session(profile_name=args.profile, region_name=args.region)
    table = args.instance_table or os.environ.get(ENV_INSTANCE_TABLE) or DEFAULT_INSTANCE_TABLE_NAME
    jobs = os.environ.get(ENV_JOB_TABLE) or DEFAULT_JOB_TABLE_NAME
    return Repository(session.resource("dynamodb"), jobs, table)


def breaker_command(args: argparse.Namespace, repo: Any, now: float) -> int:
    """``breaker show`` / ``breaker reset``: one JSON document on stdout, a sentence on stderr."""
    from gpu_recovery.domain import breaker as policy
    from gpu_recovery.recovery.breaker import reset_breaker

    stored = repo.get_breaker()
    if args.breaker_command == "show":
        state = policy.normalize(stored)
        window_seconds = float((stored or {}).get("window_seconds") or 600)
        in_window = sorted({e["node"] for e in state["window"] if now - window_seconds < e["at"] <= now})
        shown = {"state": state["state"], "trips": state["trips"], "tripped_at": state["tripped_at"],
                 "trip_reason": state["trip_reason"], "nodes_in_window": in_window,
                 "limit": (stored or {}).get("limit"),
                 "cluster_gpu_nodes": (stored or {}).get("cluster_gpu_nodes"),
                 "window_seconds": window_seconds, "backlog": state["backlog"],
                 "released_not_yet_carried_out": sorted(((stored or {}).get("released") or {}).values(),
                                                        key=lambda e: str(e.get("node"))),
                 "last_reset_at": state["last_reset_at"], "last_reset_by": state["last_reset_by"]}
        print(json.dumps(shown, default=str, sort_keys=True, indent=2))
        if stored is None:
            print("the breaker has never acted (no node action recorded yet)", file=sys.stderr)
        return 0
    result = reset_breaker(repo, now=now, resume_backlog=bool(args.resume_backlog), by=_caller(),
                           max_backlog_age_seconds=args.max_backlog_age_hours * 3600)
    if not result.done:
        print("error: the breaker changed while resetting it three times in a row; try again",
              file=sys.stderr)
        return 1
    print(json.dumps({"state": result.state["state"], "released": list(result.released),
                      "dropped": list(result.dropped)}, default=str, sort_keys=True, indent=2))
    if result.released:
        print(f"breaker closed; {len(result.released)} held-back node action(s) released: the recovery "
              "sweep carries them out within a minute", file=sys.stderr)
    else:
        print(f"breaker closed; {len(result.dropped)} held-back node action(s) dropped", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None, store: TokenStore | None = None, repo: Any = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "breaker":
        import time

        try:
            return breaker_command(args, repo or _repository(args), time.time())
        except Exception as error:  # boto errors: say what failed, no traceback
            print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
            return 1
    try:
        store = store or _store(args)
        if args.command == "issue-token":
            token = store.issue(args.node_id, issued_by=_caller())
            print(token)
            print(f"token issued for node {args.node_id}; it is shown only now. Put it in "
                  "/etc/gpu-node-agent/token (mode 0600) or GPU_AGENT_TOKEN.", file=sys.stderr)
            return 0
        if args.command == "revoke-token":
            if store.revoke(args.node_id, revoked_by=_caller()):
                print(f"token of node {args.node_id} revoked", file=sys.stderr)
                return 0
            print(f"node {args.node_id} has no token", file=sys.stderr)
            return 1
        rows: list[dict[str, Any]] = store.list()
        for row in rows:
            print(json.dumps(row, default=str, sort_keys=True))
        return 0
    except TokenError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # boto errors: say what failed, no traceback
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
