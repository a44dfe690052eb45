"""Import Python source (a task or a candidate) as a module, with real file names in its tracebacks."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_file(path: Path, module_name: str) -> ModuleType:
    """Execute the file at ``path`` as module ``module_name`` (registered in sys.modules while it runs)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def import_source(source: str, module_name: str, directory: Path, filename: str) -> ModuleType:
    """Write ``source`` to ``directory/filename`` and import it: tracebacks then show the offending lines."""
    path = directory / filename
    path.write_text(source, encoding="utf-8")
    return import_file(path, module_name)
