"""egglog's native module (`egglog.bindings`), loaded by itself: the only part of egglog that
eqsat uses."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

from ..extension import load_extension


def _load_bindings() -> Any:
    """egglog's native module (`egglog.bindings`), the only part of egglog we use.

    `import egglog` first runs the package's __init__, which builds its high-level Python API
    (and imports black for pretty-printing): ~0.15 s on every cold optimize. The extension
    module does not need that package code, so it is loaded by itself when egglog has not been
    imported yet; a later `import egglog` finds it in sys.modules and reuses it.
    """
    if "egglog.bindings" in sys.modules:
        return sys.modules["egglog.bindings"]
    if "egglog" in sys.modules:
        from egglog import bindings as native

        return native
    try:
        native = load_extension("egglog.bindings")
    except Exception:  # an unusual install: the ordinary import always works
        from egglog import bindings as native

        return native
    sys.meta_path.insert(0, _BindingsAttribute())
    return native


class _BindingsAttribute(importlib.abc.MetaPathFinder):
    """Sets `egglog.bindings` on the egglog package when it is imported after the bindings
    were loaded by themselves (the import system sets a submodule attribute only when it
    loads the submodule), then removes itself."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "egglog":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                run(module)
                module.bindings = sys.modules["egglog.bindings"]

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


bindings = _load_bindings()
