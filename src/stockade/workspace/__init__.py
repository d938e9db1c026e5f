"""The copy-on-write workspace: an overlay run's layer, its review, apply and discard.

An overlay run (``[filesystem] workspace = { path = ".", mode = "overlay" }``,
``stockade run --overlay``, ``Sandbox(overlay=True)``) leaves the real workspace as it
was; what the command wrote is kept in a layer under stockade's state directory. This
package reads that layer (:func:`changes`, :func:`diff`) and writes it into the real
workspace (:func:`apply`, with a three-way check and the protected set) or throws it
away (:func:`discard`). The mount itself is the launcher's (see
``stockade.runtime._overlay``).
"""

from __future__ import annotations

from stockade.workspace._apply import Outcome, apply, discard, protected_reason, record_base
from stockade.workspace._changes import Change, scan
from stockade.workspace._checkpoint import checkpoint, checkpoints, delete_checkpoint, rollback
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


def changes(layer: Layer, paths: tuple[str, ...] = ()) -> list[Change]:
    """The changes in ``layer`` at or below ``paths`` (all when empty)."""
    return selected(scan(layer), paths)
