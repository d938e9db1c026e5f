"""The compiled front end of the ``stockade`` command (cli/_frontend.c).

Served runs through it are tested with the server's own tests (tests/cli/test_server.py
runs each of them with both front ends); here: how it is built and installed, and that
whatever it does not serve becomes the Python CLI, safely.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stockade import _build
from stockade.cli import _frontend
from tests.conftest import World

PIP_SCRIPT = (
    f"#!{sys.executable}\n"
    "import sys\n"
    "from stockade.cli import main\n"
    "if __name__ == '__main__':\n"
    "    sys.exit(main())\n"
)


@pytest.fixture(scope="module")
def frontend() -> str:
    return str(_frontend.build_frontend())


def test_install_replaces_pips_script_once(tmp_path: Path) -> None:
    (tmp_path / "stockade").write_text(PIP_SCRIPT)
    assert _frontend.install(tmp_path).startswith("installed the compiled front end")
    installed = tmp_path / "stockade"
    assert _frontend.MARKER in installed.read_bytes()
    assert installed.stat().st_mode & 0o777 == 0o755
    assert _frontend.install(tmp_path).endswith("is up to date")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stockade"]  # no temporary left


def test_install_never_overwrites_another_program(tmp_path: Path) -> None:
    other = tmp_path / "stockade"
    other.write_text("#!/bin/sh\necho another stockade\n")
    with pytest.raises(ValueError, match="neither pip's stockade script"):
        _frontend.install(tmp_path)
    assert other.read_text() == "#!/bin/sh\necho another stockade\n"
    # The twin: where nothing is, it installs.
    other.unlink()
    assert _frontend.install(tmp_path).startswith("installed")


def test_install_frontend_action(tmp_path: Path) -> None:
    def action(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "stockade", "server", "install-frontend", *args],
            capture_output=True,
            text=True,
            check=False,
        )

    missing = action("--bin-dir", str(tmp_path / "missing"))
    assert missing.returncode == 125
    assert "cannot install the front end in" in missing.stderr
    done = action("--bin-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "installed the compiled front end" in done.stdout
    version = subprocess.run(
        [str(tmp_path / "stockade"), "--version"], capture_output=True, text=True, check=False
    )
    assert version.stdout.startswith("stockade ")


def test_other_verbs_are_the_python_cli(frontend: str) -> None:
    def both(*args: str) -> list[tuple[int, str, str]]:
        return [
            (p.returncode, p.stdout, p.stderr)
            for p in (
                subprocess.run(
                    [*cmd, *args], capture_output=True, text=True, check=False, timeout=60
                )
                for cmd in ([frontend], [sys.executable, "-m", "stockade"])
            )
        ]

    for args in (["--version"], ["no-such-verb"], ["check", "--json"], []):
        compiled, python = both(*args)
        assert compiled == python, args


def test_the_python_it_becomes_imports_nothing_from_the_working_directory(
    tmp_path: Path, frontend: str
) -> None:
    """The caller's directory is the agent's workspace: a ``stockade`` package planted there
    must not be what runs outside the sandbox (``python -m`` and ``-c`` would put the
    directory first on sys.path; the front end passes ``-P``)."""
    planted = tmp_path / "stockade"
    planted.mkdir()
    (planted / "__init__.py").write_text("print('PLANTED'); raise SystemExit(99)\n")
    (planted / "cli.py").write_text("print('PLANTED'); raise SystemExit(99)\n")
    # The plant works on an interpreter that takes the directory first...
    naive = subprocess.run(
        [sys.executable, "-c", "import stockade"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert naive.returncode == 99
    assert "PLANTED" in naive.stdout
    # ...and not on the front end, for a verb it hands over nor for a run it could not serve.
    for args in (["--version"], ["check"]):
        proc = subprocess.run(
            [frontend, *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
            env=dict(os.environ, STOCKADE_SERVER="0"),
        )
        assert "PLANTED" not in proc.stdout + proc.stderr
        assert proc.returncode == 0, proc.stderr


@pytest.mark.usefixtures("kernel")
def test_without_a_server_the_run_happens_in_python(world: World, frontend: str) -> None:
    world.command = [frontend]
    # Not one started on first use either (tests/cli/test_server_autostart.py).
    world.env["STOCKADE_SERVER"] = "manual"
    proc = world.stockade("run", "--", "sh", "-c", "cat ~/.ssh/id_ed25519; echo ran; exit 6")
    assert proc.returncode == 6, proc.stderr
    assert proc.stdout == "ran\n"
    assert world.canary not in proc.stdout + proc.stderr
    # Told to ignore servers, the same.
    env = dict(world.env, STOCKADE_SERVER="0")
    proc = world.stockade("run", "--", "sh", "-c", "echo ran; exit 6", env=env)
    assert (proc.returncode, proc.stdout) == (6, "ran\n")


@pytest.mark.parametrize(
    "text",
    ["/usr/bin/python3", '/a "quoted"\\path', "/trigraph??/x??=y", "/caf\u00e9/\n\t/py", "/x\\"],
)
def test_c_string_round_trips(tmp_path: Path, text: str) -> None:
    """What the front end is built with (an interpreter's path) reaches it unchanged."""
    source = tmp_path / "echo.c"
    source.write_text(
        "#include <stdio.h>\n"
        f"int main(void) {{ fputs({_frontend._c_string(text)}, stdout); return 0; }}\n"
    )
    cc = _build.compiler("a test program")
    subprocess.run([cc, "-Wall", "-Werror", "-o", str(tmp_path / "echo"), str(source)], check=True)
    out = subprocess.run([str(tmp_path / "echo")], capture_output=True, check=True).stdout
    assert out == os.fsencode(text)


def test_no_compiler_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    from stockade._exceptions import Unavailable

    with pytest.raises(Unavailable) as info:
        _frontend.build_frontend()
    assert info.value.feature == "the stockade front end (a C compiler to build it)"
    # The twin: with a compiler on PATH, it builds.
    monkeypatch.setenv("PATH", str(Path(shutil.which("cc") or "/usr/bin/cc").parent))
    assert _frontend.MARKER in _frontend.build_frontend().read_bytes()
