"""The documentation stays true: the policy reference is generated, examples parse."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from stockade.cli import VERBS
from stockade.policy import parse_policy_text
from stockade.policy._schema import reference_markdown
from tests.conftest import require

DOCS = Path(__file__).resolve().parent.parent / "docs"


def blocks(name: str, lang: str) -> list[str]:
    text = (DOCS / name).read_text(encoding="utf-8")
    return re.findall(rf"```{lang}\n(.*?)```", text, re.DOTALL)


def test_policy_reference_is_the_generated_text() -> None:
    committed = (DOCS / "policy.md").read_text(encoding="utf-8")
    assert committed == reference_markdown(), (
        "docs/policy.md is stale: run python -m stockade.policy._schema > docs/policy.md"
    )


@pytest.mark.parametrize(
    "name",
    [
        "quickstart.md",
        "api.md",
        "mcp.md",
        "recipes.md",
        "srt.md",
        "dependencies.md",
        "integrations.md",
        "learn.md",
    ],
)
def test_page_exists_and_links_resolve(name: str) -> None:
    text = (DOCS / name).read_text(encoding="utf-8")
    assert text.startswith("# ")
    for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", text):
        if target == "security-model.md":
            continue  # written by another part of the project
        assert (DOCS / target).is_file(), f"{name} links to missing {target}"


@pytest.mark.parametrize("name", ["mcp.md", "recipes.md", "learn.md"])
def test_json_examples_parse(name: str) -> None:
    found = blocks(name, "json")
    assert found
    for block in found:
        json.loads(block)


@pytest.mark.parametrize("name", ["quickstart.md", "recipes.md", "srt.md", "mcp.md"])
def test_toml_examples_are_valid_policies(name: str, tmp_path: Path) -> None:
    for block in blocks(name, "toml"):
        tomllib.loads(block)
        parse_policy_text(block, name, workspace=tmp_path)


@pytest.mark.parametrize("name", ["api.md", "recipes.md", "quickstart.md", "integrations.md"])
def test_python_examples_compile(name: str) -> None:
    for i, block in enumerate(blocks(name, "python")):
        compile(block, f"{name}[{i}]", "exec")


def test_every_verb_is_in_the_quickstart() -> None:
    text = (DOCS / "quickstart.md").read_text(encoding="utf-8")
    for verb in VERBS:
        assert f"stockade {verb}" in text, verb


# --- the command blocks of the quickstart and the MCP page, run for real ------------------

#: doc -> {command line: why it is not run here}; every other line of a ``sh`` block runs
NOT_RUN: dict[str, dict[str, str]] = {
    "quickstart.md": {
        "pip install .": "installs the package: the test runs the installed checkout",
        "pip install 'stockade[mcp]'": "installs from an index",
        "stockade run --allow-host pypi.org --allow-host files.pythonhosted.org -- pip "
        "download requests": "reaches pypi.org (tests/runtime/test_toolchains.py runs pip "
        "through the proxy against a local index)",
    },
    "mcp.md": {
        "pip install 'stockade[mcp]'": "installs from an index",
        'claude mcp add stockade -- stockade mcp --workspace "$PWD"': "needs Claude Code",
    },
}
#: lines the docs write with optional parts in brackets: the form that runs
SPELLED: dict[str, str] = {
    "stockade mcp --workspace ~/src/project [--policy ~/.config/stockade/agent.toml]": (
        "stockade mcp --workspace ~/src/project --policy ~/.config/stockade/agent.toml"
    ),
}
#: lines that run until interrupted: they must still run after a while, then end cleanly
UNTIL_INTERRUPTED = {"stockade log --follow --verdict deny"}
#: lines whose exit status reports a result rather than success (README, Exit codes)
RESULT_CODES = {"stockade doctor": (0, 1)}


def commands(name: str) -> list[str]:
    """The command lines of the ``sh`` blocks of ``docs/name``, comments removed."""
    out = []
    for block in blocks(name, "sh"):
        for line in block.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line:
                out.append(line)
    return out


@pytest.mark.parametrize("name", sorted(NOT_RUN))
def test_the_docs_have_command_blocks_and_the_exceptions_exist(name: str) -> None:
    found = commands(name)
    run = [c for c in found if c not in NOT_RUN[name]]
    assert run, f"{name}: no command block found to run"
    for line in NOT_RUN[name]:
        assert line in found, f"{name}: NOT_RUN lists {line!r}, which the page no longer has"


def _doc_world(world: Any) -> tuple[Path, dict[str, str]]:
    """``~/src/project`` of the docs in the test world: a workspace with a test suite for
    ``pytest -q`` and ``npm test``, the checkout's stockade and pytest first on PATH."""
    project = world.home / "src" / "project"
    project.mkdir(parents=True)
    (project / "test_ok.py").write_text("def test_ok() -> None:\n    assert 1 + 1 == 2\n")
    (project / "package.json").write_text(
        json.dumps({"name": "doc-project", "scripts": {"test": "node -e \"console.log('ok')\""}})
    )
    config = Path(world.env["XDG_CONFIG_HOME"]) / "stockade"
    config.mkdir(parents=True, exist_ok=True)
    # `--policy ~/.config/stockade/agent.toml` in mcp.md: an agent's policy in HOME.
    (world.home / ".config" / "stockade").mkdir(parents=True, exist_ok=True)
    (world.home / ".config" / "stockade" / "agent.toml").write_text("version = 1\n")
    env = dict(world.env, PATH=f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin")
    # `stockade approvals revoke api.example.com` needs an answer to revoke.
    from stockade.egress.approval._store import ApprovedStore

    ApprovedStore(config / "approved.toml").add([("allow", "api.example.com")])
    return project, env


def _run_line(line: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    if line in UNTIL_INTERRUPTED:
        proc = subprocess.Popen(
            ["sh", "-c", f"exec {line}"],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=20)
            return proc.returncode, out
        out = proc.stdout.read() if proc.stdout else ""
        return -1000 - proc.returncode, f"ended on its own: {out}"
    proc2 = subprocess.run(
        ["sh", "-c", line],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return proc2.returncode, proc2.stdout + proc2.stderr


@pytest.mark.usefixtures("kernel")
@pytest.mark.parametrize("name", ["quickstart.md", "mcp.md"])
def test_the_command_blocks_run(world: Any, name: str) -> None:
    """Every command of the page's ``sh`` blocks, in order, in one world: each exits 0
    (or, for a result, one of its documented codes); the first that does not fails."""
    project, env = _doc_world(world)
    ran = 0
    for line in commands(name):
        if line in NOT_RUN[name]:
            continue
        if "npm" in line.split() and shutil.which("npm") is None:
            require(False, "npm is not installed (the quickstart runs npm test)")
        code, out = _run_line(SPELLED.get(line, line), project, env)
        assert code in RESULT_CODES.get(line, (0,)), f"{name}: `{line}` exited {code}:\n{out}"
        ran += 1
    assert ran >= 1
