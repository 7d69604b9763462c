"""One synthesis per configuration, shared by every infra test (synth is slow: jsii).

The helpers live in ``infra_synth`` (see there why test modules must not import conftest).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from infra_synth import AGENT_CONTEXT, CUSTOM_CONTEXT, DEFAULT_CONTEXT, Synth, synthesize

from infra.health_check import DEFAULT_SCRIPT, SCRIPT_ENV_VAR


@pytest.fixture(scope="session")
def health_check_script() -> Iterator[Path]:
    """The real script; a throwaway copy under /tmp only while it does not exist yet."""
    if DEFAULT_SCRIPT.exists() or os.environ.get(SCRIPT_ENV_VAR):
        yield Path(os.environ.get(SCRIPT_ENV_VAR) or DEFAULT_SCRIPT)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dcgm_health_check.sh"
        path.write_text("#!/bin/sh\n# placeholder for tests\ndcgmi diag -r \"$DCGM_LEVEL\"\n")
        os.environ[SCRIPT_ENV_VAR] = str(path)
        try:
            yield path
        finally:
            os.environ.pop(SCRIPT_ENV_VAR, None)


@pytest.fixture(scope="session")
def default_synth(tmp_path_factory: pytest.TempPathFactory, health_check_script: Path) -> Synth:
    return synthesize(DEFAULT_CONTEXT, tmp_path_factory.mktemp("cdk-default"))


@pytest.fixture(scope="session")
def custom_synth(tmp_path_factory: pytest.TempPathFactory, health_check_script: Path) -> Synth:
    return synthesize(CUSTOM_CONTEXT, tmp_path_factory.mktemp("cdk-custom"))


@pytest.fixture(scope="session")
def agent_synth(tmp_path_factory: pytest.TempPathFactory, health_check_script: Path) -> Synth:
    return synthesize(AGENT_CONTEXT, tmp_path_factory.mktemp("cdk-agent"))
