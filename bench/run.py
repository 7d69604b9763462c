"""`make bench`: every performance figure the issues ask for, printed (not asserted).

Runs against the embedded emulator; absolute times are those of moto on this
machine, while call and item counts are what AWS would see.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import sys
import time
from typing import Any, TextIO


class _DropEmf(io.TextIOBase, TextIO):
    """Passes output through, minus Powertools' EMF metric lines.

    Powertools ``Metrics`` instances share one buffer per process and flush it as EMF JSON
    on stdout (in Lambda, CloudWatch reads it); here every handler runs in one process.
    A ``TextIO`` too, as ``sys.stdout`` is typed (typeshed declares ``io.StringIO`` so).
    """

    def __init__(self, target: Any) -> None:
        self._target = target
        self._partial = ""

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            if not line.startswith('{"_aws"'):
                self._target.write(line + "\n")
        self._target.flush()
        return len(text)

    def flush(self) -> None:
        if self._partial and not self._partial.startswith('{"_aws"'):
            self._target.write(self._partial)
        self._partial = ""
        self._target.flush()

SECTIONS = (
    ("Recovery loop", "bench.recovery_bench"),
    ("Crash consistency", "bench.crash_consistency_bench"),
    ("False repairs", "bench.false_repairs_bench"),
    ("Remediation MTTR", "bench.remediation_bench"),
    ("Validation after repair", "bench.validation_bench"),
    ("Relocation in a full cluster", "bench.relocation_bench"),
    ("Gang preflight", "bench.preflight_bench"),
    ("Node heartbeats", "bench.heartbeat_bench"),
    ("Heartbeat writes per partition", "bench.heartbeat_partitions_bench"),
    ("Jobs API", "bench.jobs_api_bench"),
    ("Queue scheduler", "bench.scheduler_bench"),
    ("Time sharing", "bench.time_sharing_bench"),
    ("Large jobs", "bench.scale_bench"),
    ("Goodput with hot spares (model)", "bench.goodput_bench"),
    ("Goodput over days, from the stack's ledger", "bench.goodput_days_bench"),
    ("Driver warnings", "bench.warnings_bench"),
    ("Cold starts: handler import times", "bench.imports_bench"),
)


def main(argv: list[str] | None = None) -> int:
    wanted = set(argv if argv is not None else sys.argv[1:])
    from bench.recovery_bench import quiet_logs

    quiet_logs()
    results: dict[str, Any] = {}
    for title, module_name in SECTIONS:
        short = module_name.rsplit(".", 1)[-1].removesuffix("_bench")
        if wanted and short not in wanted:
            continue
        print(f"\n{'=' * 78}\n{title}  ({module_name})\n{'=' * 78}", flush=True)
        started = time.perf_counter()
        module = importlib.import_module(module_name)
        with contextlib.redirect_stdout(_DropEmf(sys.stdout)) as filtered:
            results[short] = module.run()
            filtered.flush()
        print(f"[{title}: {time.perf_counter() - started:.1f} s]", flush=True)
    print("\nAll figures as JSON:")
    print(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
