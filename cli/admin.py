"""``gpu-recovery-admin``: operator commands for a deployed stack.

    gpu-recovery-admin doctor [--stack-name GpuTrainingRecovery]   # is the account ready?
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

Credentials and region come from the usual AWS settings (``--region`` / ``--profile``
override them). Token commands use the table ``--table`` or ``$NODE_TOKEN_TABLE_NAME``
(the stack output ``NodeTokenTableName``). Only a token's SHA-256 hash is stored: a lost
token cannot be recovered, issue a new one (which also invalidates the old).

Commands are a registry (``COMMANDS``): to add one, write ``add_arguments(parser)`` and
``run(args, ctx) -> exit status`` and append a :class:`Command`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cli import doctor
from gpu_recovery.constants import (
    DEFAULT_INSTANCE_TABLE_NAME,
    DEFAULT_JOB_TABLE_NAME,
    DEFAULT_NODE_TOKEN_TABLE_NAME,
    ENV_INSTANCE_TABLE,
    ENV_JOB_TABLE,
    ENV_NODE_TOKEN_TABLE,
)
from gpu_recovery.tokens import TokenError, TokenStore


@dataclass
class Context:
    """What a command may use; tests inject ``store`` / ``session``."""

    args: argparse.Namespace
    store: TokenStore | None = None
    session: Any = None
    repo: Any = None  # the recovery Repository (breaker commands)

    def boto_session(self) -> Any:
        if self.session is None:
            import boto3

            self.session = boto3.session.Session(profile_name=self.args.profile,
                                                 region_name=self.args.region)
        return self.session

    def token_store(self) -> TokenStore:
        if self.store is None:
            table = self.args.table or os.environ.get(ENV_NODE_TOKEN_TABLE) or DEFAULT_NODE_TOKEN_TABLE_NAME
            self.store = TokenStore(self.boto_session().resource("dynamodb").Table(table))
        return self.store

    def repository(self) -> Any:
        if self.repo is None:
            from gpu_recovery.repository import Repository

            instances = (self.args.instance_table or os.environ.get(ENV_INSTANCE_TABLE)
                         or DEFAULT_INSTANCE_TABLE_NAME)
            jobs = os.environ.get(ENV_JOB_TABLE) or DEFAULT_JOB_TABLE_NAME
            self.repo = Repository(self.boto_session().resource("dynamodb"), jobs, instances)
        return self.repo


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Context], int]


def _caller() -> str:
    return os.environ.get("USER") or os.environ.get("USERNAME") or "gpu-recovery-admin"


def _node_id_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-id", required=True, help="ECS container instance id of the node")


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    return None


def _issue_token(args: argparse.Namespace, ctx: Context) -> int:
    token = ctx.token_store().issue(args.node_id, issued_by=_caller())
    print(token)
    print(f"token issued for node {args.node_id}; it is shown only now. Put it in "
          "/etc/gpu-node-agent/token (mode 0600) or GPU_AGENT_TOKEN.", file=sys.stderr)
    return 0


def _revoke_token(args: argparse.Namespace, ctx: Context) -> int:
    if ctx.token_store().revoke(args.node_id, revoked_by=_caller()):
        print(f"token of node {args.node_id} revoked", file=sys.stderr)
        return 0
    print(f"node {args.node_id} has no token", file=sys.stderr)
    return 1


def _list_tokens(args: argparse.Namespace, ctx: Context) -> int:
    for row in ctx.token_store().list():
        print(json.dumps(row, default=str, sort_keys=True))
    return 0


def _doctor(args: argparse.Namespace, ctx: Context) -> int:
    return doctor.run(args, ctx.boto_session())


def _breaker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instance-table", help=f"container-instance table (default ${ENV_INSTANCE_TABLE} "
                                                 f"or {DEFAULT_INSTANCE_TABLE_NAME})")
    actions = parser.add_subparsers(dest="breaker_command", required=True)
    actions.add_parser("show", help="state, nodes acted on in the window, backlog")
    reset = actions.add_parser("reset", help="close the breaker: resume or drop its backlog")
    choice = reset.add_mutually_exclusive_group(required=True)
    choice.add_argument("--resume-backlog", action="store_true",
                        help="carry the held-back node actions out (the recovery sweep does it)")
    choice.add_argument("--drop-backlog", action="store_true", help="forget the held-back node actions")
    reset.add_argument("--max-backlog-age-hours", type=float, default=24.0,
                       help="with --resume-backlog: drop entries older than this (default 24)")


def _breaker(args: argparse.Namespace, ctx: Context) -> int:
    import time

    return breaker_command(args, ctx.repository(), time.time())


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


COMMANDS: list[Command] = [
    Command("doctor", "check, read-only, that the deployed stack's account is ready for a GPU fault",
            doctor.add_arguments, _doctor),
    Command("issue-token", "create or rotate a node's report token; prints it once",
            _node_id_argument, _issue_token),
    Command("revoke-token", "revoke a node's report token", _node_id_argument, _revoke_token),
    Command("list-tokens", "list nodes and token status (never the tokens)", _no_arguments, _list_tokens),
    Command("breaker", "show or reset the blast-radius breaker", _breaker_arguments, _breaker),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-recovery-admin", description=__doc__.split("\n")[0])
    parser.add_argument("--table", help=f"node-token table (default ${ENV_NODE_TOKEN_TABLE} or "
                                        f"{DEFAULT_NODE_TOKEN_TABLE_NAME})")
    parser.add_argument("--region", help="AWS region")
    parser.add_argument("--profile", help="AWS profile")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_arguments(sub.add_parser(command.name, help=command.help))
    return parser


def main(argv: Sequence[str] | None = None, store: TokenStore | None = None,
         session: Any = None, repo: Any = None) -> int:
    args = build_parser().parse_args(argv)
    command = next(c for c in COMMANDS if c.name == args.command)
    try:
        return command.run(args, Context(args, store=store, session=session, repo=repo))
    except TokenError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # boto errors: say what failed, no traceback
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
