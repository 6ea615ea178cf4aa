"""A package whose names load on first use (PEP 562 module `__getattr__`).

A technique package keeps its settings in a small `config.py` that TrainConfig and the command
line import; Python runs the package's `__init__` first, so an `__init__` that imported the
technique's code would load torch (and the model) just to read a switch. With `lazy_exports`,
`from gemref.data import JaggedBatch` still works, but `import gemref.data.config` loads only
that module. Nothing else changes: a name is imported from its module the first time it is read.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any, Callable


def lazy_exports(package: str, where: dict[str, tuple[str, ...]]
                 ) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """(__all__, __getattr__, __dir__) for the package named `package` (its `__name__`): each name
    in `where` ({module, relative like ".gem": the names it defines}) is imported from its module
    when first read, then kept; any other name is the package's submodule of that name, if any."""
    module_of = {name: module for module, names in where.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name in module_of:
            value = getattr(importlib.import_module(module_of[name], package), name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(module_of))

    return sorted(module_of), __getattr__, __dir__
