"""What the sandbox's output may ask of the caller's terminal.

A terminal does more than draw: escape sequences in a program's output can set the
clipboard (OSC 52, iTerm2's ``OSC 1337;Copy``), download a file to the host (iTerm2's
``OSC 1337;File=``, kitty's file transfer ``OSC 5113``), read a host file by its path
(kitty's graphics protocol, an APC string with ``t=f``), pass any of these through a
multiplexer (tmux's ``DCS tmux;`` passthrough), or make the terminal *answer*: a report
of the window title (``CSI 21 t``) or of a setting (``DCQRSS``, a DCS string) is typed
into the terminal's input, where the host's shell reads it once the run is over. A
clipboard the sandbox filled is pasted into that shell by the person.

So the relay (:mod:`._pty`) passes the sandbox's output through :class:`TerminalFilter`:
text, control characters, CSI sequences (colours, cursor, modes, the reports TUIs ask
for: cursor position, device attributes) and the harmless OSCs (titles, colours, the
working directory, hyperlinks, shell-integration marks) go through unchanged; the title
reports, every other OSC, and every DCS, APC, PM and SOS string are dropped whole. The
command still runs as it would in a terminal that ignores them. Only the relay of a
terminal filters: output to a pipe or a file is the caller's bytes, unchanged.
"""

from __future__ import annotations

import re

__all__ = ["TerminalFilter"]

_ESC = 0x1B
_BEL = 0x07
_CAN, _SUB = 0x18, 0x1A
#: OSC numbers a terminal only draws from: window and icon titles (0-2), colours (4, 10-19
#: and their resets 104, 110-119; a "?" query answers with a colour), the working
#: directory (7), hyperlinks (8), shell-integration marks (133, FinalTerm's)
_OSC_KEPT = frozenset({0, 1, 2, 4, 7, 8, 104, 133, *range(10, 20), *range(110, 120)})
#: window reports whose answer holds text the sandbox chose (the icon and window titles)
_CSI_T_DROPPED = frozenset({b"20", b"21"})
#: longest sequence kept whole; a longer OSC or string is dropped (a title or link is short)
_MAX_SEQUENCE = 4096

_GROUND, _ESCAPE, _CSI, _OSC, _STRING = range(5)
#: what could be dropped: an OSC or a string's start, any CSI that ends in ``t`` (a
#: control inside a CSI is executed where it stands and the CSI goes on, so its
#: parameters are not read here), CAN or SUB; a piece without one passes whole
_RISKY = re.compile(rb"\x1b[\]P_^X]|\x1b\[[^\x40-\x7e]*t|[\x18\x1a]")
#: the last escape of a piece is whole (a CSI, or a two-byte escape that starts nothing
#: longer) and only text follows it
_WHOLE_TAIL = re.compile(
    rb"\x1b(?:\[[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]"
    rb"|[\x20-\x2f]*[\x30-\x4f\x51-\x57\x59\x5a\x5c\x60-\x7e])[^\x1b]*"
)
#: a CSI whole: parameters, intermediates, the final byte (ECMA-48 5.4)
_WHOLE_CSI = re.compile(rb"\x1b\[([\x30-\x3f]*)[\x20-\x2f]*([\x40-\x7e])")


class TerminalFilter:
    """A streaming filter of one output stream bound for a person's terminal.

    :meth:`feed` takes what the command wrote, in any pieces, and returns what may reach
    the terminal; a sequence split across pieces is held until it ends.
    """

    def __init__(self) -> None:
        self._state = _GROUND
        self._seq = bytearray()
        self._overflow = False
        #: ESC seen inside an OSC or a string: ``\\`` ends it (ST), anything else aborts
        self._esc_in_string = False
        #: what was dropped, for the audit (counted, never the bytes)
        self.dropped = 0

    def feed(self, data: bytes) -> bytes:
        """The part of ``data`` (and of what came before) that may reach the terminal."""
        if self._state == _GROUND:
            if _ESC not in data:
                return data  # the common case: text and plain control characters
            if _RISKY.search(data) is None and _WHOLE_TAIL.fullmatch(data, data.rfind(b"\x1b")):
                # Colours and cursor moves only, the last one whole: nothing to judge.
                return data
        out = bytearray()
        i, n = 0, len(data)
        while i < n:
            if self._state == _GROUND:
                j = data.find(b"\x1b", i)
                if j < 0:
                    out += data[i:]
                    break
                out += data[i:j]
                csi = _WHOLE_CSI.match(data, j)
                if csi is not None:
                    # a whole CSI in this piece (colours, the cursor): judged at once
                    if _csi_kept(csi.group(1), csi.group(2)[0]):
                        out += csi.group(0)
                    else:
                        self.dropped += 1
                    i = csi.end()
                    continue
                self._start(_ESCAPE, data[j : j + 1])
                i = j + 1
                continue
            byte = data[i]
            i += 1
            if self._state == _ESCAPE:
                self._escape(byte, out)
            elif self._state == _CSI:
                self._csi(byte, out)
            else:
                self._string(byte, out)
        return bytes(out)

    def _start(self, state: int, first: bytes) -> None:
        self._state = state
        self._seq = bytearray(first)
        self._overflow = False
        self._esc_in_string = False

    def _escape(self, byte: int, out: bytearray) -> None:
        self._seq.append(byte)
        if byte == ord("["):
            self._state = _CSI
        elif byte == ord("]"):
            self._state = _OSC
        elif byte in (ord("P"), ord("_"), ord("^"), ord("X")):  # DCS, APC, PM, SOS
            self._state = _STRING
        elif 0x20 <= byte <= 0x2F:
            pass  # an intermediate (ESC ( B, ESC # 8): the final byte follows
        elif byte in (_CAN, _SUB):
            self._state = _GROUND  # the sequence is cancelled, and so is the byte
        elif byte == _ESC:
            out += self._seq[:-1]  # ESC ESC: the first one stands alone
            self._seq = bytearray(b"\x1b")
        else:
            out += self._seq  # ESC 7, ESC M, ESC c, ...: two bytes, kept
            self._state = _GROUND

    def _csi(self, byte: int, out: bytearray) -> None:
        if byte < 0x20:
            if byte in (_CAN, _SUB):
                self._state = _GROUND
            elif byte == _ESC:
                self._start(_ESCAPE, b"\x1b")
            else:
                out.append(byte)  # a control inside a CSI is executed where it stands
            return
        self._seq.append(byte)
        if len(self._seq) > _MAX_SEQUENCE:
            self.dropped += 1
            self._state = _GROUND
        elif 0x40 <= byte <= 0x7E:  # the final byte
            if _csi_kept(bytes(self._seq[2:-1]), byte):
                out += self._seq
            else:
                self.dropped += 1
            self._state = _GROUND

    def _string(self, byte: int, out: bytearray) -> None:
        if self._esc_in_string:
            self._esc_in_string = False
            if byte == ord("\\"):
                self._end_string(out, b"\x1b\\")
                return
            if byte == _ESC:
                return  # ESC ESC: an escaped ESC inside the string (tmux's passthrough)
            # an ESC that does not make ST aborts the string and starts a new sequence
            self._drop()
            self._start(_ESCAPE, b"\x1b")
            self._escape(byte, out)
            return
        if byte == _ESC:
            self._esc_in_string = True
        elif byte == _BEL and self._state == _OSC:
            self._end_string(out, b"\x07")
        elif byte in (_CAN, _SUB):
            self._drop()
        elif not self._overflow:
            self._seq.append(byte)
            if len(self._seq) > _MAX_SEQUENCE:
                self._overflow = True  # dropped whole once it ends; nothing more is kept
                self._seq = bytearray(self._seq[:16])

    def _end_string(self, out: bytearray, terminator: bytes) -> None:
        if self._state == _OSC and not self._overflow and _osc_kept(bytes(self._seq[2:])):
            out += self._seq + terminator
        else:
            self.dropped += 1
        self._state = _GROUND

    def _drop(self) -> None:
        self.dropped += 1
        self._state = _GROUND


def _csi_kept(params: bytes, final: int) -> bool:
    """Whether a CSI with ``params`` (and any intermediates) and ``final`` may pass."""
    return not (final == ord("t") and params.split(b";")[0] in _CSI_T_DROPPED)


def _osc_kept(body: bytes) -> bool:
    number = body.split(b";", 1)[0]
    return number.isdigit() and len(number) <= 5 and int(number) in _OSC_KEPT
