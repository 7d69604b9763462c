"""Load a stand-alone script shipped beside the Lambda code (the node agent, the training
client) as a module: users copy these files onto nodes or into training images, so they
are not packages of this repository."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

CLIENT_PATH = Path(__file__).resolve().parents[1] / "training_client" / "gpu_recovery_client.py"


def load_script(name: str, path: Path) -> Any:
    """``path`` imported once as module ``name`` (later calls return the same module)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_client_library() -> Any:
    """The shipped training client file itself (training code copies it or pip-installs it;
    it is not a package of this repository)."""
    return load_script("gpu_recovery_client", CLIENT_PATH)
