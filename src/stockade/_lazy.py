"""Attributes of a package loaded on first use (PEP 562's module ``__getattr__``).

The CLI has a start-up budget: a package whose names need asyncio, ssl or h11 (the
proxy), or a whole subsystem (the overlay), names them in a table and loads each module
only when one of its names is first read. One loader for every such package, so they
all fail the same way (an ``AttributeError`` naming the package) and cache the same way
(the value goes into the package's globals: the next read costs nothing).
"""

from __future__ import annotations

TYPE_CHECKING = False  # without importing typing: this module is on the CLI's hot path
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def load(package: str, table: Mapping[str, str], name: str, namespace: dict[str, Any]) -> Any:
    """The value of ``package.name``, from the module ``table[name]`` names.

    ``table`` maps each lazy name to its module (absolute, or relative to ``package`` when
    it starts with ``.``); ``namespace`` is the package's ``globals()``, where the value is
    kept once loaded.
    """
    module = table.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, package), name)
    namespace[name] = value
    return value
