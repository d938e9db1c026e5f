"""The copy-on-write workspace: an overlay run's layer, its review, apply and discard.

An overlay run (``[filesystem] workspace = { path = ".", mode = "overlay" }``,
``stockade run --overlay``, ``Sandbox(overlay=True)``) leaves the real workspace as it
was; what the command wrote is kept in a layer under stockade's state directory. This
package reads that layer (:func:`changes`, :func:`diff`), writes it into the real
workspace (:func:`apply`, with a three-way check and the protected set) or throws it
away (:func:`discard`), and keeps checkpoints of it (:func:`checkpoint`,
:func:`rollback`). The mount itself is the launcher's (see ``stockade.runtime._overlay``).

The names are imported when first used: ``stockade run --overlay`` needs only the layer
and the base record, and the CLI has a start-up budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stockade._lazy import load

if TYPE_CHECKING:
    from stockade.workspace._apply import Outcome, apply, discard, protected_reason, record_base
    from stockade.workspace._changes import Change, scan
    from stockade.workspace._checkpoint import (
        checkpoint,
        checkpoints,
        delete_checkpoint,
        rollback,
    )
    from stockade.workspace._diff import diff, selected
    from stockade.workspace._layer import Layer, LayerError, layers_dir

__all__ = [
    "Change",
    "Layer",
    "LayerError",
    "Outcome",
    "apply",
    "changes",
    "checkpoint",
    "checkpoints",
    "delete_checkpoint",
    "diff",
    "discard",
    "layers_dir",
    "protected_reason",
    "record_base",
    "rollback",
    "scan",
    "selected",
]

_WHERE = {
    "Outcome": "._apply",
    "apply": "._apply",
    "discard": "._apply",
    "protected_reason": "._apply",
    "record_base": "._apply",
    "Change": "._changes",
    "scan": "._changes",
    "checkpoint": "._checkpoint",
    "checkpoints": "._checkpoint",
    "delete_checkpoint": "._checkpoint",
    "rollback": "._checkpoint",
    "diff": "._diff",
    "selected": "._diff",
    "Layer": "._layer",
    "LayerError": "._layer",
    "layers_dir": "._layer",
}


def __getattr__(name: str) -> Any:
    return load(__name__, _WHERE, name, globals())


def changes(layer: Layer, paths: tuple[str, ...] = ()) -> list[Change]:
    """The changes in ``layer`` at or below ``paths`` (all when empty)."""
    from stockade.workspace._changes import scan
    from stockade.workspace._diff import selected

    return selected(scan(layer), paths)
