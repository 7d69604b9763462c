"""``python -m local_mode.sim.contract grants ...``: the grants file and the grants reports.

* ``grants --write``: synthesize the stack (~20 s) and write ``grants.json`` (``make
  contract-grants``); ``grants --check``: fail when the committed file differs;
* ``grants --unused DIR``: the statements no run used, from the usage files the runs wrote
  to ``DIR`` (``GRANTS_USAGE_DIR``, see grants.py);
* ``grants --operations DIR``: what each function called, per operation: the IAM action,
  the resource form and the statement that allowed it (docs/aws-contract.md's table).
"""

from __future__ import annotations

import argparse
import sys

from . import grants_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m local_mode.sim.contract")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grants", help="the deployed functions' grants (grants.json) and their use")
    mode = g.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="synthesize and write grants.json")
    mode.add_argument("--check", action="store_true", help="synthesize and compare with grants.json")
    mode.add_argument("--unused", metavar="DIR", help="statements no run used (usage files in DIR)")
    mode.add_argument("--operations", metavar="DIR", help="each function's operations (usage files in DIR)")
    args = parser.parse_args(argv)
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
