"""The documentation stays true: the policy reference is generated, examples parse."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from stockade.cli import VERBS
from stockade.policy import parse_policy_text
from stockade.policy._schema import reference_markdown

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
    "name", ["quickstart.md", "api.md", "mcp.md", "recipes.md", "srt.md", "dependencies.md"]
)
def test_page_exists_and_links_resolve(name: str) -> None:
    text = (DOCS / name).read_text(encoding="utf-8")
    assert text.startswith("# ")
    for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", text):
        if target == "security-model.md":
            continue  # written by another part of the project
        assert (DOCS / target).is_file(), f"{name} links to missing {target}"


@pytest.mark.parametrize("name", ["mcp.md", "recipes.md"])
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


@pytest.mark.parametrize("name", ["api.md", "recipes.md", "quickstart.md"])
def test_python_examples_compile(name: str) -> None:
    for i, block in enumerate(blocks(name, "python")):
        compile(block, f"{name}[{i}]", "exec")


def test_every_verb_is_in_the_quickstart() -> None:
    text = (DOCS / "quickstart.md").read_text(encoding="utf-8")
    for verb in VERBS:
        assert f"stockade {verb}" in text, verb
