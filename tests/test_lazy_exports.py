"""The packages that import their names when first asked for (``gpu_recovery.lazy_exports``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpu_recovery.lazy_exports import lazy_exports


def test_a_name_is_imported_from_its_home_and_an_unknown_name_is_an_attribute_error() -> None:
    get = lazy_exports("gpu_recovery", {"Settings": "settings"})
    from gpu_recovery.settings import Settings

    assert get("Settings") is Settings
    with pytest.raises(AttributeError, match="module 'gpu_recovery' has no attribute 'Nope'"):
        get("Nope")


@pytest.mark.parametrize(("package", "name", "home"), [
    ("gpu_recovery.repository", "Repository", "gpu_recovery.repository.recovery_loop"),
    ("gpu_recovery.recovery", "RecoveryService", "gpu_recovery.recovery.service"),
])
def test_a_package_loads_a_home_only_when_its_name_is_asked_for(package: str, name: str, home: str) -> None:
    script = (f"import sys, importlib; p = importlib.import_module({package!r}); "
              f"before = {home!r} in sys.modules; getattr(p, {name!r}); "
              f"print(before, {home!r} in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": "lambdas:."})
    assert out.stdout.split() == ["False", "True"]
