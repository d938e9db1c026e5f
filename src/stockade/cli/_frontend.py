"""Build and install the compiled front end of the ``stockade`` command (``_frontend.c``).

The front end hands ``stockade run`` to a warm run server without starting Python (about
a third of a served run's time), and execs the Python CLI for everything else. It is an
optional replacement of the console script that pip writes; ``stockade server
install-frontend`` puts it in place, and ``scripts/setup`` does so for a checkout.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from stockade import _build
from stockade._hash import sha256_hex
from stockade.cli import _client

_SOURCE_NAME = "_frontend.c"
#: a string every front end binary holds, by which install recognises one it may replace
MARKER = b"stockade compiled front end"


def _c_string(text: str) -> str:
    """``text`` as a C string literal: octal escapes for anything but plain ASCII, and for
    ``?`` (a trigraph like ``??/`` would otherwise turn into another character)."""
    out = []
    for byte in os.fsencode(text):
        char = chr(byte)
        if char in '"\\?' or not 32 <= byte < 127:
            out.append(f"\\{byte:03o}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def source(python: str | None = None) -> bytes:
    """The front end's C source for this installation: its interpreter (``python``,
    this one by default), key and protocol."""
    python = python or sys.executable
    defines = (
        f"#define STOCKADE_PYTHON {_c_string(python)}\n"
        f"#define STOCKADE_KEY {_c_string(_client.installation_key(python))}\n"
        f"#define STOCKADE_PROTOCOL {_client.PROTOCOL}\n"
        f"#define STOCKADE_MARKER {_c_string(MARKER.decode())}\n"
    )
    return defines.encode() + Path(__file__).with_name(_SOURCE_NAME).read_bytes()


def build_frontend(python: str | None = None) -> Path:
    """The front end for this installation, compiled into the user's cache on first use."""
    code = source(python)
    target = _build.cache_dir() / f"frontend-{sha256_hex(code)[:16]}"
    return _build.build(code, _SOURCE_NAME, target, "the stockade front end")


def _replaceable(path: Path) -> bool:
    """True for a file install may overwrite: pip's console script or a front end."""
    try:
        head = path.read_bytes()[: 1 << 20]
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return MARKER in head or (head.startswith(b"#!") and b"from stockade.cli import main" in head)


def install(bin_dir: Path) -> str:
    """Put the front end at ``bin_dir/stockade``; say what was done.

    Raises OSError when the place cannot be written and ValueError when the file there
    is something else than a ``stockade`` command (it is never overwritten).
    """
    built = build_frontend()
    target = bin_dir / "stockade"
    if not _replaceable(target):
        raise ValueError(f"{target} is neither pip's stockade script nor a front end")
    data = built.read_bytes()
    try:
        if target.read_bytes() == data:
            return f"{target} is up to date"
    except FileNotFoundError:
        pass
    from stockade._fs import replace_file

    replace_file(target, data, 0o755)  # every user of the installation runs it
    return f"installed the compiled front end at {target}"
