"""Where an overlay run's writes live: one directory per run in stockade's state.

``$XDG_STATE_HOME/stockade/layers/RUN_ID/`` holds ``upper/`` (the overlay's upper layer:
every file the run wrote, whiteouts for what it deleted), ``work/`` (overlayfs's own
scratch) and ``layer.json`` (the run, the workspace, when it began, and the base of each
changed file once the run ended). None of it is bound into the sandbox where the
command can reach it: the launcher masks the bind it mounts the overlay from.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from stockade._exceptions import StockadeError
from stockade._fs import remove_tree, replace_file

#: the metadata format of ``layer.json``
LAYER_FORMAT = 1


class LayerError(StockadeError):
    """A layer is missing, damaged, or cannot be used for what was asked (exit 125)."""


def layers_dir() -> Path:
    """``$XDG_STATE_HOME/stockade/layers`` (``~/.local/state`` when unset)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "stockade" / "layers"


def coarse_now_ns() -> int:
    """The clock the kernel stamps ctime with (coarse real time), in nanoseconds.

    A file changed after this instant has a ctime at least this value; one changed in
    the same tick just before it has that value too (:func:`next_coarse_tick_ns` is the
    start that tells the two apart).
    """
    # Python does not name it; 5 is CLOCK_REALTIME_COARSE in <linux/time.h>.
    return time.clock_gettime_ns(getattr(time, "CLOCK_REALTIME_COARSE", 5))


def next_coarse_tick_ns() -> int:
    """A run's start that tells a host file changed before it from one changed after.

    The kernel stamps ctime from the coarse clock, or (multigrain timestamps, Linux 6.13
    and later) from the fine one when the old stamp was looked at: a file changed before
    this call has a ctime at most the fine time it returns; this call then waits (one
    tick at most, 1 to 4 ms) until the coarse clock has passed that time too, so a file
    changed after it has a ctime at or above it. With the coarse clock alone a file
    written in the same tick just before the run would read as changed during it (and be
    refused at apply); with the fine clock alone one changed early in the run could read
    as before it (and be missed).
    """
    start = time.time_ns()
    while coarse_now_ns() < start:
        time.sleep(0.0002)
    return start


def _write_json(path: Path, data: dict[str, Any]) -> None:
    # Atomic: a reader (or a run killed mid-write) sees the old or the new file. No
    # fsync: it would cost every overlay run a disk flush, and the file is a record of
    # the layer beside it, which a crash of the machine loses alike.
    # One line, by the C encoder: json.dump with an indent encodes in Python, seconds
    # for the base record of 10,000 paths.
    replace_file(path, json.dumps(data, sort_keys=True, separators=(",", ":")).encode())


class Layer:
    """One run's copy-on-write layer on disk."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.upper = root / "upper"
        self.work = root / "work"
        self.meta_path = root / "layer.json"

    def __repr__(self) -> str:
        return f"Layer({str(self.root)!r})"

    # --- creation and lookup ------------------------------------------------------

    @classmethod
    def create(cls, run_id: str, workspace: Path, *, base: Path | None = None) -> Layer:
        """Make the layer of run ``run_id`` over ``workspace`` (directories 0700).

        The upper directory's root takes the workspace root's mode: overlayfs shows the
        merged root with the upper root's attributes.
        """
        parent = base if base is not None else layers_dir()
        parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        root = parent / run_id
        root.mkdir(mode=0o700)
        layer = cls(root)
        try:
            layer._make(run_id, workspace)
        except BaseException:
            _remove_tree(root)  # no half-made layer left to list
            raise
        return layer

    def _make(self, run_id: str, workspace: Path) -> None:
        layer = self
        st = os.stat(workspace)
        layer.upper.mkdir(mode=0o700)
        os.chmod(layer.upper, stat.S_IMODE(st.st_mode))
        layer.work.mkdir(mode=0o700)
        _write_json(
            layer.meta_path,
            {
                "format": LAYER_FORMAT,
                "run_id": run_id,
                "workspace": str(workspace),
                "workspace_dev": st.st_dev,
                "workspace_ino": st.st_ino,
                "started": time.time(),
                "started_coarse_ns": next_coarse_tick_ns(),
                "state": "running",
                "pid": os.getpid(),
                "runs": [run_id],
            },
        )

    @classmethod
    def open(cls, run: str, *, base: Path | None = None) -> Layer:
        """The layer of run ``run`` (a run id or a unique prefix of one, a path, or
        ``last``: the newest layer)."""
        if run == "last":
            every = cls.all(base)
            if not every:
                raise LayerError("no overlay layers yet; run one with 'stockade run --overlay'")
            return every[-1]
        if "/" in run:
            root = Path(run)
        else:
            parent = base if base is not None else layers_dir()
            if not run or run.startswith("."):
                raise LayerError(f"{run!r} is not a run id; see 'stockade changes --list'")
            root = parent / run
            if not root.is_dir():
                try:
                    matches = [e.name for e in os.scandir(parent) if e.name.startswith(run)]
                except FileNotFoundError:
                    matches = []
                if len(matches) > 1:
                    raise LayerError(
                        f"run {run!r} is ambiguous ({', '.join(sorted(matches))}); give more of it"
                    )
                if not matches:
                    raise LayerError(
                        f"no overlay layer for run {run!r} in {parent}; 'stockade changes --list' lists them"
                    )
                root = parent / matches[0]
        layer = cls(root)
        if not layer.meta_path.is_file() or not layer.upper.is_dir():
            raise LayerError(f"{root} is not an overlay layer (no layer.json or upper/)")
        return layer

    @staticmethod
    def all(base: Path | None = None) -> list[Layer]:
        """Every layer under the state directory, oldest first."""
        parent = base if base is not None else layers_dir()
        try:
            roots = [Path(e.path) for e in os.scandir(parent) if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return []
        layers = [Layer(r) for r in roots if (r / "layer.json").is_file()]
        return sorted(layers, key=lambda la: la.meta.get("started", 0))

    # --- metadata -------------------------------------------------------------------

    @property
    def meta(self) -> dict[str, Any]:
        try:
            with open(self.meta_path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise LayerError(f"{self.meta_path}: cannot read the layer's metadata: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != LAYER_FORMAT:
            raise LayerError(f"{self.meta_path}: not a layer of format {LAYER_FORMAT}")
        return data

    @property
    def base_path(self) -> Path:
        return self.root / "base.json"

    @property
    def base(self) -> dict[str, Any] | None:
        """The base record of every path the layer changes (None: none recorded yet).

        Kept apart from ``layer.json``, which every step reads: a layer of 10,000 files
        has a base of 10,000 entries."""
        try:
            with open(self.base_path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise LayerError(f"{self.base_path}: cannot read the base record: {exc}") from None
        return data if isinstance(data, dict) else None

    def write_base(self, base: dict[str, Any]) -> None:
        """Replace the base record (atomically)."""
        _write_json(self.base_path, base)

    def update(self, **changes: Any) -> None:
        """Write ``changes`` into ``layer.json`` (atomically)."""
        _write_json(self.meta_path, {**self.meta, **changes})

    @property
    def run_id(self) -> str:
        return str(self.meta["run_id"])

    @property
    def workspace(self) -> Path:
        return Path(self.meta["workspace"])

    @property
    def state(self) -> str:
        """``running``, ``finished``, or ``interrupted`` (its run died before the end)."""
        meta = self.meta
        state = str(meta.get("state", "running"))
        if state == "running":
            pid = meta.get("pid")
            if not isinstance(pid, int) or not _alive(pid):
                return "interrupted"
        return state

    def check_workspace(self) -> None:
        """Refuse when the workspace directory is not the one the run began on."""
        meta = self.meta
        try:
            st = os.stat(self.workspace)
        except OSError as exc:
            raise LayerError(
                f"workspace {self.workspace} of run {self.run_id}: {exc.strerror}"
            ) from None
        if (st.st_dev, st.st_ino) != (meta.get("workspace_dev"), meta.get("workspace_ino")):
            raise LayerError(
                f"workspace {self.workspace} is not the directory run {self.run_id} began on "
                "(it was replaced since); nothing applied"
            )

    def discard(self) -> None:
        """Remove the layer and everything in it."""
        if self.state == "running":
            raise LayerError(
                f"run {self.run_id} is still running; stop it before discarding its layer"
            )
        _remove_tree(self.root)


def _alive(pid: int) -> bool:
    from stockade._process import alive

    return alive(pid)


def _remove_tree(path: Path) -> None:
    # overlayfs leaves work/work with mode 0: open each directory up before removing.
    for root, dirs, _files in os.walk(path, topdown=True):
        for name in dirs:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                with contextlib.suppress(OSError):
                    os.chmod(full, 0o700)
    remove_tree(path)
    if os.path.lexists(path):
        raise LayerError(f"could not remove {path} completely; remove it by hand")
