"""``gpu-recovery-admin``: issue, revoke and list node report tokens.

    gpu-recovery-admin issue-token --node-id <container-instance-id>   # prints the token once
    gpu-recovery-admin revoke-token --node-id <container-instance-id>
    gpu-recovery-admin list-tokens

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

from gpu_recovery.constants import DEFAULT_NODE_TOKEN_TABLE_NAME, ENV_NODE_TOKEN_TABLE
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
    return parser


def main(argv: Sequence[str] | None = None, store: TokenStore | None = None) -> int:
    args = build_parser().parse_args(argv)
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
