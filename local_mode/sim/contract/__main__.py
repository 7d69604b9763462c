"""``python -m local_mode.sim.contract``: the guards' lists and reports (docs/aws-contract.md).

* ``requests --list [--seen DIR] [--no-model]``: the operations the request guard covers,
  their limits and citations;
* ``grants --write``: synthesize the stack (~20 s) and write ``grants.json`` (``make
  contract-grants``); ``grants --check``: fail when the committed file differs;
* ``grants --unused DIR``: the statements no run used, from the usage files the runs wrote
  to ``DIR`` (``GRANTS_USAGE_DIR``, see grants.py);
* ``grants --operations DIR``: what each function called, per operation: the IAM action,
  the resource form and the statement that allowed it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import grants_file
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
    g = guards.add_parser("grants", help="the deployed functions' grants (grants.json) and their use (2b)")
    mode = g.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="synthesize and write grants.json")
    mode.add_argument("--check", action="store_true", help="synthesize and compare with grants.json")
    mode.add_argument("--unused", metavar="DIR", help="statements no run used (usage files in DIR)")
    mode.add_argument("--operations", metavar="DIR", help="each function's operations (usage files in DIR)")
    args = parser.parse_args(argv)
    if args.guard == "requests":
        seen = read_seen(args.seen) if args.seen else None
        print(render(coverage(seen), model=not args.no_model))
        return 0
    if args.write or args.check:
        content = grants_file.render_file(grants_file.synthesize())
        if args.write:
            grants_file.GRANTS_FILE.write_text(content)
            print(f"wrote {grants_file.GRANTS_FILE}")
            return 0
        if grants_file.GRANTS_FILE.read_text() != content:
            print(f"{grants_file.GRANTS_FILE} differs from the template: run {grants_file.REGENERATE}",
                  file=sys.stderr)
            return 1
        return 0
    from . import usage

    if args.unused:
        print(usage.unused_report(usage.read_usage(args.unused)))
        return 0
    print(usage.operations_report(usage.read_usage(args.operations)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
