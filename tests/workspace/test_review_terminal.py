"""What a reviewer reads is what the sandbox wrote, never what it wants the terminal to do.

An overlay run's files are the sandbox's choice, names and bytes alike, and `stockade
changes`, `diff`, `review`, `apply` and `checkpoints` print them to the person deciding
whether to apply them. An escape sequence there could erase the line of the diff that
plants a hook, move the cursor over it, retitle the window or set the clipboard (OSC 52);
a bidi control could show a line other than the one applied. Each is shown escaped; the
twin: ordinary names and text, tabs and CRLF line ends are shown as they are, and
``--json`` keeps the exact text.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import World
from tests.workspace.test_overlay import WHO, cli, run_id_of

pytestmark = pytest.mark.usefixtures("kernel")

#: erase the line above, OSC 52 (write the clipboard), a carriage return over the line,
#: a right-to-left override
HOSTILE = "ok\\033[1A\\033[2K\\033]52;c;ZXZpbA==\\007\\rcovered\\342\\200\\256txt"
CONTROLS = ("\x1b", "\x07", "\u202e")


def _no_controls(text: str) -> None:
    for ch in CONTROLS:
        assert ch not in text, (ch, text)
    # a carriage return survives only as part of a CRLF line end
    assert "\r" not in text.replace("\r\n", "\n"), text


@pytest.mark.parametrize("who", WHO)
def test_review_output_escapes_what_the_sandbox_wrote(world: World, who: str) -> None:
    (world.workspace / "a.txt").write_text("hello\n")
    script = (
        f"printf '{HOSTILE}\\n' > a.txt; printf 'x\\n' > \"$(printf 'n{HOSTILE}')\"; "
        "printf 'col1\\tcol2\\r\\nplain\\n' > crlf.txt"
    )
    proc = cli(world, who, "run", "--overlay", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    run = run_id_of(proc)

    changes = cli(world, who, "changes", run)
    assert changes.returncode == 0, changes.stderr
    _no_controls(changes.stdout)
    assert "\\x1b[1A" in changes.stdout  # the name is shown, escaped
    assert "crlf.txt" in changes.stdout  # the twin: an ordinary name as it is

    diff = cli(world, who, "diff", run)
    assert diff.returncode == 0, diff.stderr
    _no_controls(diff.stdout)
    assert "+ok\\x1b[1A\\x1b[2K\\x1b]52;c;ZXZpbA==\\x07\\rcovered\\u202etxt\n" in diff.stdout
    assert "-hello\n" in diff.stdout
    # tabs and the CRLF line end kept as they are (text mode reads "\r\n" as "\n"; an
    # escaped one would read "\\r")
    assert "+col1\tcol2\n+plain\n" in diff.stdout, repr(diff.stdout)

    exact = json.loads(cli(world, who, "diff", "--json", run, "a.txt").stdout)
    assert "\x1b[2K" in exact["changes"][0]["diff"]  # --json: the exact text

    review = cli(world, who, "review", run)
    assert review.returncode == 0, review.stderr
    _no_controls(review.stdout)
    assert "a.txt" in review.stdout

    applied = cli(world, who, "apply", run)
    _no_controls(applied.stdout)
    assert "crlf.txt" in applied.stdout
    # escaping is for the screen only: the bytes applied are the bytes written
    assert (world.workspace / "a.txt").read_bytes().startswith(b"ok\x1b[1A\x1b[2K")


@pytest.mark.parametrize("who", WHO)
def test_diff_never_reads_through_a_link_in_the_workspace(world: World, who: str) -> None:
    # A cloned repository may hold a link to a host secret. The run cannot read through it
    # (the files layer), but a run that replaces the link with a file makes the old side
    # of the diff "the link": a reviewer (or the agent, through the MCP server's diff)
    # must get the link's target text, never the content of the file it points to.
    secret = world.root / "host-secret"
    secret.write_text("HOST-SECRET-MATERIAL\n")
    (world.workspace / "key").symlink_to(secret)
    (world.workspace / "plain.txt").write_text("old text\n")
    if who == "nobody":
        # uid 65534 could read the secret itself: the test is about what the diff reads
        secret.chmod(0o644)
    proc = cli(
        world,
        who,
        "run",
        "--overlay",
        "--",
        "sh",
        "-c",
        "rm key; echo new > key; echo new > plain.txt",
    )
    assert proc.returncode == 0, proc.stderr
    run = run_id_of(proc)
    for args in (("diff", run), ("diff", "--json", run)):
        out = cli(world, who, *args)
        assert out.returncode == 0, out.stderr
        assert "HOST-SECRET-MATERIAL" not in out.stdout
    diff = cli(world, who, "diff", run).stdout
    assert f"-{secret}\n\\ No newline at end of file\n+new\n" in diff  # the link, as git shows it
    assert "-old text\n+new\n" in diff  # the twin: a file's old content is shown
