"""The terminal filter of the relay: what the sandbox's output may ask of a terminal.

Each dropped sequence has its kept twin; every case is also fed one byte at a time (a
sequence split across reads is judged whole), and the end-to-end test runs a real
sandbox under a real pty.
"""

from __future__ import annotations

import pytest

from stockade.runtime._escapes import TerminalFilter
from tests.conftest import World
from tests.runtime.test_terminal import caller

ESC = b"\x1b"
ST = ESC + b"\\"

KEPT = [
    b"plain text\r\n\ttabs and a bell\x07",
    ESC + b"[1;31mred" + ESC + b"[0m",
    ESC + b"[?1049h" + ESC + b"[2J" + ESC + b"[H",  # alternate screen, clear, home
    ESC + b"[6n" + ESC + b"[c",  # cursor position and device attributes: TUIs ask
    ESC + b"[8;24;80t",  # resize: not a report
    ESC + b"]0;a title\x07",
    ESC + b"]2;a title" + ST,
    ESC + b"]8;;https://example.test/\x07link" + ESC + b"]8;;\x07",
    ESC + b"]11;?\x07",  # background colour query: answered with a colour
    ESC + b"]7;file://host/dir\x07",
    ESC + b"]133;A\x07",
    ESC + b"7" + ESC + b"8" + ESC + b"(B" + ESC + b"M",
    "héllo wörld ✓".encode(),
]

DROPPED = [
    ESC + b"]52;c;ZWNobyBwd25lZA==\x07",  # set the clipboard
    ESC + b"]52;c;?" + ST,  # read it
    ESC + b"]1337;File=name=eA==;inline=0:ZXZpbA==\x07",  # iTerm2: a file to Downloads
    ESC + b"]1337;Copy=:ZXZpbA==\x07",
    ESC + b"]5113;ac=send;id=1\x07",  # kitty: file transfer
    ESC + b"]50;?\x07",  # font report
    ESC + b"]9;notify\x07",
    ESC + b"[21t",  # window title report: typed into the shell
    ESC + b"[20t",
    ESC + b"P$qm" + ST,  # DECRQSS
    ESC + b"Ptmux;" + ESC + ESC + b"]52;c;ZXZpbA==\x07" + ST,  # tmux passthrough
    ESC + b"_Ga=T,t=f;L2V0Yy9wYXNzd2Q=" + ST,  # kitty graphics from a host path
    ESC + b"^privacy message" + ST,
    ESC + b"Xstart of string" + ST,
    ESC + b"]0;" + b"x" * 5000 + b"\x07",  # too long to be a title
]


def _whole(data: bytes) -> bytes:
    f = TerminalFilter()
    return f.feed(data)


def _bytewise(data: bytes) -> bytes:
    f = TerminalFilter()
    return b"".join(f.feed(data[i : i + 1]) for i in range(len(data)))


@pytest.mark.parametrize("seq", KEPT)
def test_what_draws_goes_through_unchanged(seq: bytes) -> None:
    assert _whole(seq) == seq
    assert _bytewise(seq) == seq


@pytest.mark.parametrize("seq", DROPPED)
def test_what_acts_on_the_host_is_dropped_whole(seq: bytes) -> None:
    framed = b"before " + seq + b" after"
    assert _whole(framed) == b"before  after"
    assert _bytewise(framed) == b"before  after"


def test_a_cancelled_or_aborted_sequence_does_not_swallow_what_follows() -> None:
    assert _whole(ESC + b"]52;c;abc\x18text") == b"text"  # CAN ends the string
    # an ESC that does not make ST starts a new sequence, which is judged on its own
    assert _whole(ESC + b"]52;c;abc" + ESC + b"[1mbold") == ESC + b"[1mbold"


def test_the_drop_is_counted() -> None:
    f = TerminalFilter()
    f.feed(DROPPED[0] + KEPT[1] + DROPPED[7])
    assert f.dropped == 2


@pytest.mark.usefixtures("kernel")
def test_a_sandbox_cannot_set_the_callers_clipboard(world: World) -> None:
    script = r"printf 'A\033]52;c;ZXZpbA==\007B\033[21tC\033[1;32mD\033[0m\033]0;title\007E\n'"
    with caller(world, "--", "sh", "-c", script) as c:
        assert c.wait() == 0, c.out[-3000:]
    assert b"]52;" not in c.out
    assert b"[21t" not in c.out
    # the twin: colours and a title reach the terminal
    assert b"A" + b"BC\x1b[1;32mD\x1b[0m\x1b]0;title\x07E" in c.out


def test_a_control_inside_a_csi_does_not_hide_a_title_report() -> None:
    # A terminal executes the newline and goes on with the CSI: "2", then "1", then "t"
    # is a report of the window title.
    assert _whole(b"a" + ESC + b"[2\n1t" + b"b") == b"a\nb"
    assert _bytewise(b"a" + ESC + b"[2\n1t" + b"b") == b"a\nb"


def test_a_sequence_split_at_a_piece_end_is_judged_whole() -> None:
    f = TerminalFilter()
    out = f.feed(b"x" + ESC + b"[1m" + ESC + b"]5") + f.feed(b"2;c;ZXZpbA==\x07y")
    assert out == b"x" + ESC + b"[1my"
    f = TerminalFilter()
    assert f.feed(ESC + b"[1mok" + ESC + b"[") + f.feed(b"0m") == ESC + b"[1mok" + ESC + b"[0m"


@pytest.mark.usefixtures("kernel")
def test_a_learning_runs_captured_output_is_filtered_too(world: World) -> None:
    # learn captures the task's output (verify compares its digest) and writes it out
    # afterwards: to a terminal, through the same filter as a relayed run.
    script = r"printf 'A\033]52;c;ZXZpbA==\007B\033[1;32mC\033[0m\n'"
    out = world.root / "learnt"
    with caller(world, "learn", "-o", str(out), "--", "sh", "-c", script, exact=True) as c:
        assert c.wait() == 0, c.out[-3000:]
    assert b"]52;" not in c.out
    assert b"AB\x1b[1;32mC\x1b[0m" in c.out  # the twin: colours reach the terminal
