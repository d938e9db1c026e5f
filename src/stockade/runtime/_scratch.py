"""A run's scratch directory on the host: chosen when the run is planned, made when first
needed, removed at the end; and the sweep of those that killed runs left behind."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from stockade import _roots
from stockade._exceptions import SandboxError
from stockade._fs import remove_tree
from stockade._process import alive

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _sweep_leftovers() -> None:
    """Remove the scratch directories of stockade processes that are gone."""
    base = _temp_base()
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith("stockade-")]
    except OSError:
        return
    for entry in entries:
        parts = entry.name.split("-")
        if len(parts) != 3 or not parts[1].isdigit() or not entry.is_dir(follow_symlinks=False):
            continue
        if alive(int(parts[1])):
            continue  # its owner still runs (or it is another user's)
        import shutil

        shutil.rmtree(entry.path, ignore_errors=True)


def _temp_base() -> Path:
    """Where scratch directories go: ``$TMPDIR``, else /tmp (tempfile costs ~10 ms)."""
    return _roots.scratch_base()


def choose() -> Path:
    """A scratch directory's name for a run of this process (not made: see
    :class:`Scratch`). Named after the process, so that the sweep knows whose it is."""
    return _temp_base() / f"stockade-{os.getpid()}-{os.urandom(4).hex()}"


class Scratch:
    """A private scratch directory for one run, at the ``planned`` path (:func:`choose`,
    when the run was planned), made when first asked for: a contained run without egress
    needs none (and a mkdir and rmdir in /tmp cost about a millisecond on a slow disk).

    What a run killed with SIGKILL leaves behind is removed by the next run, once the
    process named in it is gone (placeholders: see :mod:`._placeholders`).
    """

    def __init__(self, planned: Path) -> None:
        self.planned = planned
        self._path: Path | None = None
        self._sweeper: Any = None

    def sweep_in_background(self) -> None:
        """Sweep the scratch directories of killed runs on the background thread, once.

        Called once the command runs: the run's own thread then mostly waits for it
        without the GIL, where a sweeping thread started earlier would take turns with
        its planning (each of whose system calls may wait for the GIL a while).
        """
        if self._sweeper is None:
            from stockade import _background

            self._sweeper = _background.submit(_sweep_leftovers)

    @property
    def path(self) -> Path:
        """The directory, made (mode 0700) on first use."""
        if self._path is None:
            try:
                self.planned.mkdir(mode=0o700)
            except FileExistsError:
                # The plan named it (its paths are in the mount plan and the launcher's
                # spec), so another name is no way out: a directory of that name that
                # this process did not make is nobody's to trust.
                raise SandboxError(
                    f"the run's scratch directory {self.planned} exists already; "
                    "the command did not run"
                ) from None
            self._path = self.planned
        return self._path

    def remove(self) -> None:
        """Remove the directory (if it was made); finish the sweep (or make it now)."""
        if self._path is not None:
            remove_tree(self._path)
            self._path = None
        if self._sweeper is None:
            _sweep_leftovers()  # the command never started
        else:
            self._sweeper.wait()


@contextlib.contextmanager
def scratch(planned: Path) -> Iterator[Scratch]:
    """A :class:`Scratch` for one run, removed (if it was made) at the end, when the
    scratch directories of killed runs have been swept too."""
    scratch = Scratch(planned)
    try:
        yield scratch
    finally:
        scratch.remove()
