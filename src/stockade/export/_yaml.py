"""A small deterministic YAML writer for the documents ``export`` produces.

Why not PyYAML: export is the only writer of YAML in stockade, its documents are plain
JSON-like data (mappings with string keys, lists, strings, integers, booleans), and a
writer of that subset is short enough to read whole. It keeps the package's required
dependencies at the three it has (docs/dependencies.md), and the output depends on this
file alone, not on an installed library's version, so golden files stay byte-identical.
The tests parse every output back with PyYAML (a development dependency) and compare.

The rules: keys sorted; block style; two spaces of indentation; a string is written
plain only when no YAML 1.1 or 1.2 reader can take it for anything but that string,
as a literal block (``|``) when it is multi-line text a reader keeps byte for byte,
and otherwise double-quoted with JSON escapes (every JSON string is a valid YAML
double-quoted scalar) plus escapes for the characters YAML does not allow raw.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Plain scalars: a conservative shape. It starts with a letter, ``_`` or ``/`` (so no
# number, indicator or sign can start it) and holds no space, ``#``, comma or bracket.
# ``:`` may appear inside (URLs, image references) but not at the end.
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./:@=+-]*")
# Words a YAML 1.1 reader turns into booleans or null (PyYAML and many Kubernetes tools
# still read YAML 1.1: an unquoted ``no`` or ``on`` is the classic trap), and the
# special floats of both versions.
_RESERVED = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null", "nan", "inf"})
# What YAML allows unescaped in a document (its c-printable set, without tab, CR and LF,
# which are handled by the callers): everything else is escaped in a quoted scalar.
# NEL and the Unicode line and paragraph separators are line breaks to a YAML 1.1 reader,
# and a byte-order mark is allowed only at the start of a stream: escaped too.
_NOT_PRINTABLE = re.compile(
    "[^\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
)


def dump_all(documents: Iterable[Mapping[str, Any]]) -> str:
    """The documents as one YAML stream, each after a ``---`` line."""
    out: list[str] = []
    for doc in documents:
        out.append("---")
        out.extend(_block(doc, 0) if doc else ["{}"])
    return "\n".join(out) + "\n"


def _block(value: Mapping[str, Any] | Sequence[Any], indent: int) -> list[str]:
    """The lines of a non-empty mapping or sequence whose entries start at ``indent``."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, Mapping):
        for key in sorted(value):
            if not isinstance(key, str):
                raise TypeError(f"mapping keys must be strings, not {type(key).__name__}")
            item = value[key]
            head = f"{pad}{_scalar(key)}:"
            if _is_collection(item) and item:
                lines.append(head)
                lines.extend(_block(item, indent + 2))
            elif isinstance(item, str) and _literal_ok(item):
                lines.append(head + " " + _literal_header(item))
                lines.extend(f"{pad}  {line}" if line else "" for line in _literal_lines(item))
            else:
                lines.append(f"{head} {_scalar(item)}")
        return lines
    for item in value:
        if _is_collection(item) and item:
            # The first line of the nested block carries the dash in place of its
            # indentation: "- key: value", further keys aligned under "key".
            nested = _block(item, indent + 2)
            nested[0] = f"{pad}- {nested[0][indent + 2 :]}"
            lines.extend(nested)
        else:
            lines.append(f"{pad}- {_scalar(item)}")
    return lines


def _is_collection(value: object) -> bool:
    return isinstance(value, Mapping) or (
        isinstance(value, Sequence) and not isinstance(value, str | bytes)
    )


def _scalar(value: object) -> str:
    """A value on one line: ``{}``, ``[]``, a boolean, an integer, or a string."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if _PLAIN.fullmatch(value) and value.lower() not in _RESERVED and value[-1] != ":":
            return value
        return _quoted(value)
    if isinstance(value, Mapping) and not value:
        return "{}"
    if _is_collection(value) and not value:
        return "[]"
    # Floats are left out on purpose: Kubernetes quantities are strings, and a float's
    # spelling is where YAML writers disagree.
    raise TypeError(f"cannot write a {type(value).__name__} as YAML: {value!r}")


def _quoted(text: str) -> str:
    encoded = json.dumps(text, ensure_ascii=False)
    return _NOT_PRINTABLE.sub(_escape, encoded)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _literal_ok(text: str) -> bool:
    """True when a literal block keeps ``text`` exactly: multi-line, printable, and
    no line a reader could take for indentation or trailing space it drops."""
    if "\n" not in text or "\r" in text or "\t" in text:
        return False
    if _NOT_PRINTABLE.search(text.replace("\n", "")):
        return False
    lines = text.split("\n")
    # Lines of spaces only and trailing spaces are where block scalars are subtle
    # (they may count as indentation, or as the indicator's empty lines): quote them.
    body = lines[:-1] if lines[-1] == "" else lines
    # A block of empty lines only reads back as "" under clip chomping: quote that too.
    if not any(body) or any(line != line.rstrip(" ") or line.isspace() for line in body):
        return False
    # A text that ends in more than one newline keeps them only with "keep" chomping,
    # and a blank last line is ambiguous with it: quote those too.
    return not text.endswith("\n\n")


def _literal_header(text: str) -> str:
    # The indentation indicator is needed when the first line starts with a space
    # (otherwise a reader would take that space as the block's indentation).
    indicator = "2" if text.startswith(" ") else ""
    chomp = "" if text.endswith("\n") else "-"
    return f"|{indicator}{chomp}"


def _literal_lines(text: str) -> list[str]:
    return (text[:-1] if text.endswith("\n") else text).split("\n")
