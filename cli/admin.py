"""``gpu-recovery-admin``: operator commands for a deployed stack.

    gpu-recovery-admin doctor [--stack-name GpuTrainingRecovery]   # is the account ready?
    gpu-recovery-admin issue-token --node-id <container-instance-id>   # prints the token once
    gpu-recovery-admin revoke-token --node-id <container-instance-id>
    gpu-recovery-admin list-tokens

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
from gpu_recovery.constants import DEFAULT_NODE_TOKEN_TABLE_NAME, ENV_NODE_TOKEN_TABLE
from gpu_recovery.tokens import TokenError, TokenStore


@dataclass
class Context:
    """What a command may use; tests inject ``store`` / ``session``."""

    args: argparse.Namespace
    store: TokenStore | None = None
    session: Any = None

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


COMMANDS: list[Command] = [
    Command("doctor", "check, read-only, that the deployed stack's account is ready for a GPU fault",
            doctor.add_arguments, _doctor),
    Command("issue-token", "create or rotate a node's report token; prints it once",
            _node_id_argument, _issue_token),
    Command("revoke-token", "revoke a node's report token", _node_id_argument, _revoke_token),
    Command("list-tokens", "list nodes and token status (never the tokens)", _no_arguments, _list_tokens),
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
         session: Any = None) -> int:
    args = build_parser().parse_args(argv)
    command = next(c for c in COMMANDS if c.name == args.command)
    try:
        return command.run(args, Context(args, store=store, session=session))
    except TokenError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # boto errors: say what failed, no traceback
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
