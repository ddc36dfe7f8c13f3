"""Loading one compiled extension module of a package without running the package's
__init__ (which for egglog and scipy.optimize costs a few hundred milliseconds of imports that
eqsat does not use)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType


def load_extension(name: str) -> ModuleType:
    """The extension module `name` ("package.sub.module"), found in the package's directories
    by its file name and loaded by itself, then registered in sys.modules so a later ordinary
    import reuses it. Raises ImportError where no such file exists or it fails to load."""
    if name in sys.modules:
        return sys.modules[name]
    top, *subdirs, stem = name.split(".")
    spec = importlib.util.find_spec(top)
    where = [os.path.join(d, *subdirs) for d in (spec.submodule_search_locations or ())] \
        if spec else []
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    path = next((os.path.join(d, f) for d in where if os.path.isdir(d)
                 for f in sorted(os.listdir(d))
                 if f.startswith(stem + ".") and f.endswith(suffixes)), None)
    if path is None:
        raise ImportError(f"no compiled extension file for {name}")
    ext = importlib.util.spec_from_file_location(name, path)
    if ext is None or ext.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(ext)
    sys.modules[name] = module
    try:
        ext.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
