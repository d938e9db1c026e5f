"""How a policy error shows what the person wrote (#24, polish list).

A person wrote TOML: the error names the file and the line, the key path, the value once
as TOML spells it (never a Python repr such as ``False`` or ``{'allow': ['x']}``, never
quoted twice) and the fix. A file without ``version`` is read as version 1 with one note
on stderr naming the file and the line to add; the twin: a file with it gets no note.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from stockade import PolicyError
from stockade.policy import load_policy
from stockade.policy._text import locate, toml_value
from tests.conftest import World, wait_for_file
from tests.policy.conftest import user_policy

# (file text, the message after "FILE:LINE: ")
CASES = {
    "python-bool": (
        "version = 1\n[layers]\nfirewall = false\n",
        3,
        "layers.firewall: false: unknown key; [layers] takes ",
    ),
    "python-dict": (
        'version = 1\nnetwrok = { allow = ["x"] }\n',
        2,
        'netwrok: { allow = ["x"] }: unknown key; the top-level keys are ',
    ),
    "bare-wildcard": (
        'version = 1\n\n[network]\nallow = ["*"]\n',
        4,
        'network.allow[0]: "*": a bare wildcard allows every host; list the hosts',
    ),
    "single-quotes-in-value": (
        "version = 1\n[network]\nallow = [\"'x'\"]\n",
        3,
        "network.allow[0]: \"'x'\": has characters not allowed in a host name",
    ),
    "port": (
        'version = 1\n[network]\nallow = ["a.test:99999"]\n',
        3,
        'network.allow[0]: "a.test:99999": port "99999" is not a number from 1 to 65535',
    ),
    "env-pass-entry": (
        'version = 1\n[env]\npass = [{ name = "X", other = 1 }]\n',
        3,
        'env.pass[0]: { name = "X", other = 1 }: unknown key "other"; ',
    ),
    "dotted-host-pin": (
        'version = 1\n[network]\nhosts = { "a.test" = "nope" }\n',
        3,
        'network.hosts.a.test: "nope": expected an IP address literal',
    ),
    "second-rule": (
        'version = 1\n[network]\nallow = ["a.test"]\n'
        '[[network.rules]]\nhost = "a.test"\n'
        '[[network.rules]]\nhost = "a.test"\naction = "maybe"\n',
        8,
        'network.rules[1].action: "maybe": expected allow, deny or report',
    ),
    "no-proxy": (
        'version = 1\n[network.upstream]\nproxy = "http://127.0.0.1:3128"\nno_proxy = ["*"]\n',
        4,
        'network.upstream.no_proxy[0]: "*": a bare wildcard',
    ),
}


@pytest.mark.parametrize(("text", "line", "message"), CASES.values(), ids=CASES.keys())
def test_error_names_file_line_key_and_value_once(
    tmp_path: Path, text: str, line: int, message: str
) -> None:
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    got = str(info.value)
    assert got.startswith(f"{path}:{line}: {message}"), got
    # No Python repr anywhere: no single-quoted value, no True/False/None.
    assert not re.search(r"\b(True|False|None)\b", got), got
    assert "{'" not in got, got
    assert "['" not in got, got


def test_workspace_file_error_has_its_line_too(home: Path) -> None:
    ws = Path.cwd()
    (ws / "stockade.toml").write_text('version = 1\n[network]\ndeny = ["https://x.test"]\n')
    with pytest.raises(PolicyError) as info:
        load_policy()
    assert str(info.value).startswith(
        f'{ws / "stockade.toml"}:3: network.deny[0]: "https://x.test": write a host name'
    ), info.value


def test_toml_value_spells_what_toml_would() -> None:
    assert toml_value(False) == "false"
    assert toml_value({"allow": ["x", 1], "a.b": True}) == '{ allow = ["x", 1], "a.b" = true }'
    assert toml_value('say "hi"\n') == '"say \\"hi\\"\\n"'
    assert toml_value("\x1b[31m") == '"\\u001b[31m"'


def test_locate_prefers_the_key_line_and_the_indexed_array_table() -> None:
    text = (
        "version = 1\n[network]\n"
        'allow = ["a"]\n'
        "[[network.rules]]\nhost = 'a'\n"
        "[[network.rules]]\nhost = 'b'\n"
        "[secrets.TOKEN]\nfrom = 'env:X'\n"
    )
    assert locate(text, "network.allow[0]") == 3
    assert locate(text, "network.rules[0].host") == 5
    assert locate(text, "network.rules[1].host") == 7
    assert locate(text, "secrets.TOKEN.from") == 9
    assert locate(text, "network.tls_ports") == 2  # not written: its table's line
    assert locate(text, "limits.pids") is None


def test_missing_version_is_one_note_naming_file_and_line(world: World) -> None:
    path = world.root / "noversion.toml"
    path.write_text('[network]\nallow = ["x.test"]\n')
    proc = world.stockade("check", "--policy", str(path))
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "version" in line]
    assert notes == [
        f"stockade: note: {path}: no version key; read as version 1. Add the line "
        "`version = 1` at the top of the file"
    ], proc.stderr
    assert "x.test" in proc.stdout  # still accepted: the policy is read as version 1


def test_missing_version_note_on_run_too(world: World) -> None:
    path = Path(world.env["XDG_CONFIG_HOME"]) / "stockade" / "policy.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('[network]\nallow = ["x.test"]\n')
    proc = world.stockade("run", "--", "true")
    # The note is printed before the sandbox starts, whether or not this host runs it.
    assert proc.stderr.count("no version key") == 1, proc.stderr


def test_a_file_with_version_gets_no_note(world: World) -> None:
    path = world.root / "versioned.toml"
    path.write_text('version = 1\n[network]\nallow = ["x.test"]\n')
    proc = world.stockade("check", "--policy", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "version" not in proc.stderr, proc.stderr


def test_an_empty_workspace_file_gets_no_note(world: World) -> None:
    """An empty stockade.toml is what a live run of the workspace holds a missing one with
    (its placeholder): a second run beside it says nothing about a version. Its twin,
    a file with content and no version, is noted (above)."""
    long = subprocess.Popen(
        [*world.command, "run", "--", "sh", "-c", "touch started; sleep 5"],
        cwd=world.workspace, env=world.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_for_file(world.workspace / "started", long)
        placeholder = world.workspace / "stockade.toml"
        assert placeholder.is_file()
        assert placeholder.stat().st_size == 0
        proc = world.stockade("run", "--", "true")
        assert proc.returncode == 0, proc.stderr
        assert "version" not in proc.stderr, proc.stderr
    finally:
        long.kill()
        long.communicate()


def test_the_builtin_default_gets_no_note(world: World) -> None:
    proc = world.stockade("check")
    assert proc.returncode == 0, proc.stderr
    assert "version" not in proc.stderr, proc.stderr


def test_user_policy_without_version_and_workspace_file_notes_both(home: Path) -> None:
    user_policy(home, '[network]\nallow = ["x.test"]\n')
    (Path.cwd() / "stockade.toml").write_text('[network]\nallow = ["x.test"]\n')
    policy = load_policy()
    assert len(policy.hints) == 2
    assert "policy.toml: no version key" in policy.hints[0]
    assert "stockade.toml: no version key" in policy.hints[1]


def test_workspace_flag_refusal_names_the_flag_not_a_source(world: World) -> None:
    home = world.env["HOME"]
    proc = world.stockade("check", "--workspace", home)
    assert proc.returncode == 125
    assert proc.stderr == (
        f"stockade: --workspace {home}: the workspace would be your whole home directory; "
        "choose a project directory\n"
    ), proc.stderr
    proc = world.stockade("run", "--workspace", "/", "--", "true")
    assert proc.returncode == 125
    assert "built-in" not in proc.stderr
    assert proc.stderr.startswith("stockade: --workspace /: the workspace would be the whole"), (
        proc.stderr
    )
    # The twin: a project directory is accepted.
    ok = world.stockade("check", "--workspace", str(world.workspace))
    assert ok.returncode == 0, ok.stderr


def test_default_workspace_refusal_names_the_current_directory(world: World) -> None:
    home = Path(world.env["HOME"])
    proc = world.stockade("check", cwd=home)
    assert proc.returncode == 125
    assert "built-in" not in proc.stderr
    assert proc.stderr.startswith(
        f"stockade: the workspace is the current directory, {home}, by default: the "
        "workspace would be your whole home directory"
    ), proc.stderr
    assert "--workspace DIR" in proc.stderr


def test_api_workspace_refusal_names_the_argument(home: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(workspace=home, workspace_name="workspace")
    assert str(info.value) == (
        f'workspace="{home}": the workspace would be your whole home directory; '
        "choose a project directory"
    )


def test_a_policy_file_workspace_refusal_still_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('version = 1\n[filesystem]\nworkspace = "/"\n')
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert str(info.value).startswith(f'{path}:3: filesystem.workspace: "/": the workspace')


def test_locate_reads_any_text_in_one_pass() -> None:
    # Lines a fuzzer writes (an unclosed header of blanks, a long dotted key): a
    # backtracking pattern took minutes on these; the scan is plain string operations.
    for text in (
        "[" + " " * 5000 + "a",
        "[[" + "a " * 3000,
        "a" + " ." * 4000 + "=",
        '"\\"' * 3000,
    ):
        assert locate(text, "a.b[0]") in (None, 1)
