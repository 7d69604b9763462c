"""A package's names imported when first asked for (PEP 562): a function that needs one
small module of a package (an authorizer's token lookup, the control API's ``Outcome``) does
not load every module the package exports."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's module ``__getattr__``: ``name`` from its submodule ``homes[name]``."""
    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{home}"), name)
    return __getattr__
