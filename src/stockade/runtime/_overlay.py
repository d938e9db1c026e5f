"""An overlay workspace for one run: the layer made before, its base recorded after.

The sandbox sees the workspace as usual, but the launcher mounts an overlay over it
(``enforce/_launcher.c``, record ``o``) whose upper layer lives in stockade's state
(:class:`stockade.workspace.Layer`); bubblewrap binds the real workspace read-only as
the lower layer. What the run wrote is then reviewed and applied or discarded
(``stockade changes/diff/apply/discard``).

Fail closed: an overlay needs the container layer (the mount namespace), the files layer
(the launcher mounts only under Landlock, which also keeps the bubblewrap init's view,
where the layer is bound, out of reach) and the new mount API; without any of them the
run is refused with the reason, never given a read-write workspace instead.
"""

from __future__ import annotations

from pathlib import Path

from stockade._exceptions import Unavailable
from stockade.policy import Policy
from stockade.workspace._apply import record_base
from stockade.workspace._layer import Layer


def refusal(policy: Policy, *, gvisor: bool, launcher_binds: bool) -> Unavailable | None:
    """Why this run cannot have an overlay workspace, or None when it can."""
    layers = policy.layers
    if policy.container.backend == "landlock":
        return Unavailable(
            "an overlay workspace with the landlock backend (it has no mount namespace)",
            "run it with --backend bubblewrap, or without --overlay",
        )
    if gvisor:
        # Measured with runsc release-20240729.0: runsc's --overlay2 keeps its upper
        # layer in a memory-backed file of its own format (no review can read it), and
        # the Sentry's own overlayfs, mounted inside, refuses an upper directory on a
        # host (gofer) mount with EINVAL: it takes a tmpfs upper only, which dies with
        # the sandbox. Neither leaves a layer on the host to review and apply.
        return Unavailable(
            "an overlay workspace with the gVisor backend (gVisor's overlay keeps its "
            "upper layer inside the sandbox, where no review can read it)",
            "run it with --backend bubblewrap, or without --overlay",
        )
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
    try:
        record_base(layer, state="finished", returncode=returncode)
    except BaseException:
        layer.update(state="finished", returncode=returncode)
        raise
