"""How a policy value is shown in an error: once, in TOML terms, on one line.

A person wrote TOML, so an error shows what they wrote as TOML would spell it
(``false``, ``"x.test"``, ``["a", "b"]``, ``{ allow = ["x"] }``), never a Python repr
(``False``, ``'x.test'``, ``{'allow': ['x']}``), and the value appears once: the part of
the message that names the key quotes it, and the reason after it does not repeat it.
"""

from __future__ import annotations

import datetime
import re

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
#: longest value shown; a longer one is cut with "..."
SHOWN_MAX = 80


def one_line(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\n``, ``\\x1e``, ``\\u2028``).

    Values and key names from a policy end up in a one-line error on a terminal: a line
    break would split it, an escape sequence would reach the terminal.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def for_terminal(text: str) -> str:
    """``text`` safe to write to a person's terminal: line breaks and tabs kept, every other
    non-printable character escaped (``\\x1b``, ``\\r``, ``\\u202e``).

    For what a sandbox chose and a person reads to decide (a diff of the files it wrote,
    their names, a checkpoint's name): an escape sequence there could move the cursor,
    erase a line of the diff, retitle the window or write the clipboard, and a bidi
    control could show a line other than the one that would be applied. A ``\\r`` just
    before a line break (a CRLF file) changes nothing on screen and is kept.
    """
    if text.isprintable():
        return text
    out = []
    last = len(text) - 1
    for i, ch in enumerate(text):
        if ch.isprintable() or ch in "\n\t" or (ch == "\r" and i < last and text[i + 1] == "\n"):
            out.append(ch)
        else:
            out.append(repr(ch)[1:-1] if ch != "\\" else ch)
    return "".join(out)


def printable(text: str, limit: int = 120) -> str:
    """``text`` cut to ``limit`` characters, every non-printable character and ``\\`` as ``?``.

    For names a sandbox chose (a host, an SNI, a path) on their way into the audit log, an
    error body or a terminal: one safe line, whatever bytes the name held.
    """
    cleaned = "".join(ch if ch.isprintable() and ch != "\\" else "?" for ch in text[:limit])
    return cleaned + ("…" if len(text) > limit else "")


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: ``"..."`` with ``\\`` and ``"`` escaped and every
    non-printable character as a TOML escape (``\\n``, ``\\u001b``), so it stays one line."""
    out = ['"']
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif not ch.isprintable():
            code = ord(ch)
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_key(key: str) -> str:
    """A table key as TOML writes it: bare when it may be, else quoted."""
    return key if _BARE_KEY.match(key) else toml_string(key)


def toml_value(value: object) -> str:
    """``value`` (as tomllib returns it) written back as TOML, on one line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        inner = ", ".join(f"{toml_key(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }"
    return toml_string(str(value))


def shown(value: object) -> str:
    """:func:`toml_value`, cut to :data:`SHOWN_MAX` characters: the value in an error."""
    text = toml_value(value)
    if len(text) > SHOWN_MAX:
        text = text[: SHOWN_MAX - 3] + "..."
    return text


_PART = re.compile(r"""[A-Za-z0-9_-]+|"((?:[^"\\]|\\.)*)"|'([^']*)'""")
_KEY_STEP = re.compile(r"""([A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*")((?:\[\d+\])*)""")
#: a key as a line starts it: bare characters, quotes, dots and blanks only
_KEY_TEXT = re.compile(r"""[A-Za-z0-9_.\-"' \t]+""")


def _dotted(text: str) -> list[str]:
    """The parts of a dotted TOML key (``a."b.c".d`` is ``a``, ``b.c``, ``d``)."""
    out = []
    for m in _PART.finditer(text):
        if m.group(1) is not None:
            out.append(m.group(1))
        elif m.group(2) is not None:
            out.append(m.group(2))
        else:
            out.append(m.group(0))
    return out


def locate(text: str, key: str) -> int | None:
    """The line (from 1) of ``text`` that sets the key path of an error, or None.

    ``key`` is the path an error names (``network.allow[0]``, ``layers.firewall``,
    ``network.rules[2].host``, ``network.hosts."a.test"``). The line chosen is the one
    whose table header and key share the longest prefix with that path: the key's own
    line when the file spells it, else the line of its table. An index selects the
    matching ``[[array]]`` table; inside an array or inline table the line of the key
    holding it is given. Only a guide for the person reading the error (the schema
    check is on the parsed TOML, never on this scan), so a line it cannot find is None.
    """
    wanted: list[tuple[str, int | None]] = []
    for step in _KEY_STEP.finditer(key):
        name = step.group(1)
        if name.startswith('"'):
            name = name[1:-1]
        indices = re.findall(r"\[(\d+)\]", step.group(2))
        wanted.append((name, int(indices[0]) if indices else None))
    if not wanted:
        return None
    best, best_line = 0, None
    header: list[str] = []
    header_index: int | None = None
    seen: dict[tuple[str, ...], int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        # Plain string operations, no backtracking regular expression: the text is
        # anything a person (or a fuzzer) wrote, and this runs only to word an error.
        stripped = line.strip()
        path: list[str]
        key_text, equals, _ = stripped.partition("=")
        if stripped.startswith("[") and not (equals and _KEY_TEXT.fullmatch(key_text)):
            array = stripped.startswith("[[")
            inner = stripped[2:] if array else stripped[1:]
            close = inner.find("]")
            if close < 0:
                continue
            header = _dotted(inner[:close])
            if array:
                count = seen.get(tuple(header), -1) + 1
                seen[tuple(header)] = count
                header_index = count
            else:
                header_index = None
            path = header
        elif equals and key_text and _KEY_TEXT.fullmatch(key_text):
            path = header + _dotted(key_text)
        else:
            continue
        score = 0
        for depth, (name, index) in enumerate(wanted):
            if depth >= len(path) or path[depth] != name:
                break
            in_array = depth == len(header) - 1 and header_index is not None
            if in_array and index is not None and header_index != index:
                break
            score += 1
        if score > best:
            best, best_line = score, number
    return best_line
