"""``python -m local_mode.sim.contract requests --list [--seen DIR] [--no-model]``: the
operations the request guard covers, their limits and citations (docs/aws-contract.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .listing import coverage, render
from .requests import read_seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m local_mode.sim.contract")
    guards = parser.add_subparsers(dest="guard", required=True)
    requests = guards.add_parser("requests", help="the request guard (issue 40, 2a)")
    requests.add_argument(
        "--list",
        action="store_true",
        required=True,
        help="every operation covered, its model constraints and prose limits",
    )
    requests.add_argument(
        "--seen", type=Path, help="a GPU_RECOVERY_CONTRACT_SEEN directory: calls per operation"
    )
    requests.add_argument("--no-model", action="store_true", help="leave out the model's constraints")
    args = parser.parse_args(argv)
    seen = read_seen(args.seen) if args.seen else None
    print(render(coverage(seen), model=not args.no_model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
