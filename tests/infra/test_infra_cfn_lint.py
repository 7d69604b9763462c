"""cfn-lint on the synthesized templates: no errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from infra_synth import Synth

# Warnings tolerated, each with the reason.
ALLOWED_WARNINGS: dict[str, str] = {
    "W3005": (
        "CDK's lambda.Function adds DependsOn on its role (and the role's default policy) "
        "although Role is also referenced with GetAtt; the redundant DependsOn is harmless "
        "and comes from aws-cdk-lib, not from this stack."
    ),
}
_CODE = re.compile(r":([EWI]\d{4}):")


# the quick tier lints the default template; the slow tier also the custom and agent
# configurations' templates, which switch optional resources on (tests/conftest.py)
@pytest.mark.parametrize("which", ["default_synth", pytest.param("custom_synth", marks=pytest.mark.slow),
                                   pytest.param("agent_synth", marks=pytest.mark.slow)])
def test_cfn_lint_has_no_errors(which: str, request: pytest.FixtureRequest) -> None:
    """Given a synthesized template, When cfn-lint runs on it, Then it reports no error
    and only listed warnings."""
    synth: Synth = request.getfixturevalue(which)
    template = synth.outdir / "GpuTrainingRecovery.template.json"
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    result = subprocess.run(
        [str(cfn_lint), "--format", "parseable", "--regions", "us-east-1", "--", str(template)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    problems = [line for line in result.stdout.splitlines() if line.strip()]
    codes = [(m.group(1) if (m := _CODE.search(p)) else "?", p) for p in problems]
    errors = [p for code, p in codes if not code.startswith(("W", "I"))]
    unexpected = [p for code, p in codes if code.startswith("W") and code not in ALLOWED_WARNINGS]
    assert errors == [], "\n".join(errors) or result.stderr
    assert unexpected == [], "\n".join(unexpected)
