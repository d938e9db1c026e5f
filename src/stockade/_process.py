"""Processes named in what stockade leaves on disk (scratch directories, cgroups, the
placeholder registry): whether their owner still runs."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists; one of another user counts (it is not ours to judge)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
