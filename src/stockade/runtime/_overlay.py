"""An overlay workspace for one run: the layer made before, its base recorded after.

The sandbox sees the workspace as usual, but every write lands in an upper layer that
lives in stockade's state (:class:`stockade.workspace.Layer`). Under bubblewrap the
launcher mounts the overlay over the workspace (``enforce/_launcher.c``, record ``o``)
and bubblewrap binds the real workspace read-only as the lower layer; under gVisor the
entry mounts the same overlay host-side, in the user and mount namespace runsc starts in,
and runsc binds the merged view (``enforce/_gvisor_entry.c``). Both are overlayfs
with ``userxattr``, so the layer has one format. What the run wrote is then reviewed and
applied or discarded (``stockade changes/diff/apply/discard``).

Fail closed: under bubblewrap an overlay needs the container layer (the mount
namespace), the files layer (the launcher mounts only under Landlock, which also keeps
the bubblewrap init's view, where the layer is bound, out of reach) and the new mount
API; under gVisor, a kernel that mounts overlayfs in a user namespace (refused at start,
with the kernel's reason). Without them the run is refused with the reason, never given
a read-write workspace instead.
"""

from __future__ import annotations

from pathlib import Path

from stockade._exceptions import Unavailable
from stockade.policy import Policy
from stockade.workspace._layer import Layer


def refusal(
    policy: Policy, *, gvisor: bool, launcher_binds: bool, scratch: Path | None = None
) -> Unavailable | None:
    """Why this run cannot have an overlay workspace, or None when it can (``scratch``:
    the run's scratch directory)."""
    layers = policy.layers
    if policy.container.backend == "landlock":
        return Unavailable(
            "an overlay workspace with the landlock backend (it has no mount namespace)",
            "run it with --backend bubblewrap, or without --overlay",
        )
    if gvisor:
        # Mounted host-side, around runsc, by the gVisor entry (enforce/_gvisor_entry.c), in
        # the mount namespace runsc is started in: the sandbox reaches the files only
        # through runsc's binds of the merged view, so neither Landlock nor the
        # launcher's mount API is needed. gVisor's own overlays keep no layer a review
        # can read (docs/gvisor.md). What the kernel refuses there is named at start.
        # runsc's state, bundle, log and pid file live in the scratch directory, reached
        # by path from that namespace: under the workspace they would land in the layer
        # (and the runtime, reading the host's files, would take a run for one that
        # never started).
        if scratch is not None and _inside(scratch, policy.filesystem.workspace):
            return Unavailable(
                f"an overlay workspace with the gVisor backend while the run's scratch "
                f"directory ({scratch}) lies inside the workspace",
                "set TMPDIR to a directory outside the workspace",
            )
        return None
    if not layers.container:
        return Unavailable(
            "an overlay workspace without the container layer",
            "keep the container layer on (the overlay is mounted in its mount namespace)",
        )
    if not layers.files:
        return Unavailable(
            "an overlay workspace without the files layer",
            "keep the files layer on (the launcher mounts the overlay only under Landlock)",
        )
    if not launcher_binds:
        return Unavailable(
            "an overlay workspace on this kernel (the new mount API, Linux 5.12+, is missing)",
            "upgrade the kernel, or run without --overlay",
        )
    return None


def _inside(path: Path, top: Path) -> bool:
    import os

    real, root = os.path.realpath(path), os.path.realpath(top)
    return real == root or real.startswith(root.rstrip("/") + "/")


def begin(run_id: str, workspace: Path, existing: Layer | None = None) -> Layer:
    """Make the run's layer (``$XDG_STATE_HOME/stockade/layers/RUN_ID``), or mark an
    existing one (a Sandbox session's) in use again."""
    import os

    if existing is not None:
        if existing.workspace != workspace:
            raise Unavailable(
                f"the overlay layer of {existing.workspace} for workspace {workspace}",
                "use one Sandbox per workspace",
            )
        runs = [*existing.meta.get("runs", []), run_id]
        existing.update(state="running", pid=os.getpid(), last_run=run_id, runs=runs)
        return existing
    try:
        return Layer.create(run_id, workspace)
    except OSError as exc:
        raise Unavailable(
            f"the overlay layer directory ({exc.filename}: {exc.strerror})",
            "make $XDG_STATE_HOME (~/.local/state) writable, or run without --overlay",
        ) from None


def end(layer: Layer, returncode: int) -> None:
    """Record the base of every changed path and mark the layer finished."""
    import os

    try:
        with os.scandir(layer.upper) as entries:
            untouched = next(entries, None) is None
    except OSError:
        untouched = False
    if untouched and not layer.base_path.exists():
        # Nothing written and no base recorded before: record_base would write no base
        # either. Its module (with hashlib, some 5 ms) stays unimported: start-up.
        layer.update(state="finished", returncode=returncode)
        return
    from stockade.workspace._apply import record_base

    try:
        record_base(layer, state="finished", returncode=returncode)
    except BaseException:
        layer.update(state="finished", returncode=returncode)
        raise
