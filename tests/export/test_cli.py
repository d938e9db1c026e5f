"""``stockade export kubernetes``: output, files, errors and exit codes."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from stockade.cli import dispatch
from tests.export._helpers import BASIC

GOLDEN = Path(__file__).parent / "data" / "agent-with-gateway.yaml"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(BASIC, encoding="utf-8")
    return path


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = dispatch(["export", "kubernetes", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_golden(policy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        [
            str(policy),
            "--namespace",
            "agents",
            "--with-gateway",
            "--identity",
            "tokenreview",
            "--warm-pool",
            "2",
        ],
        capsys,
    )
    assert code == 0
    # The digest follows the policy model (a new field changes it); the rest is golden.
    normal = DIGEST.sub("sha256:<digest>", out)
    if os.environ.get("STOCKADE_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(normal, encoding="utf-8")
    assert normal == GOLDEN.read_text(encoding="utf-8"), (
        "the export changed: review it, then STOCKADE_UPDATE_GOLDEN=1 pytest tests/export/test_cli.py"
    )


def test_output_file_equals_stdout(
    policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run([str(policy), "--namespace", "agents"], capsys)
    target = tmp_path / "out.yaml"
    code, printed, _ = run([str(policy), "--namespace", "agents", "-o", str(target)], capsys)
    assert code == 0
    assert printed == ""
    assert target.read_text(encoding="utf-8") == out
    # the name comes from the file name
    assert yaml.safe_load_all(out).__next__()["metadata"]["namespace"] == "agents"
    assert "name: agent\n" in out


def test_dir_writes_one_file_per_object_in_apply_order(
    policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run([str(policy), "--namespace", "agents", "--with-gateway"], capsys)
    directory = tmp_path / "manifests"
    code, printed, _ = run(
        [str(policy), "--namespace", "agents", "--with-gateway", "--dir", str(directory)], capsys
    )
    assert code == 0
    assert printed == ""
    files = sorted(directory.iterdir())
    assert files[0].name == "01-serviceaccount-stockade-gateway.yaml"
    assert files[-1].name.endswith("-sandboxclaim-agent-example.yaml")
    assert "".join(f.read_text(encoding="utf-8") for f in files) == out


def test_other_targets(policy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for target, kind in (("pod", "Pod"), ("deployment", "Deployment")):
        code, out, _ = run(
            [str(policy), "--namespace", "agents", "--target", target, "--name", "builder"], capsys
        )
        assert code == 0
        kinds = [d["kind"] for d in yaml.safe_load_all(out)]
        assert kinds == ["ConfigMap", kind, "NetworkPolicy"]


def test_missing_policy_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([str(tmp_path / "nope.toml")], capsys)
    assert code == 125
    assert out == ""
    assert "nope.toml: no such policy file" in err


def test_invalid_policy_names_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('version = 1\n[network]\nallow = ["*"]\n', encoding="utf-8")
    code, out, err = run([str(bad)], capsys)
    assert code == 125
    assert out == ""
    assert "network.allow" in err


def test_inexpressible_policy_names_the_key(
    policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # BASIC admits only the namespace "agents"
    code, out, err = run([str(policy), "--namespace", "other"], capsys)
    assert code == 125
    assert out == ""
    assert err.startswith("stockade: kubernetes.namespaces:")


def test_bad_name_names_the_flag(policy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([str(policy), "--namespace", "agents", "--name", "My_Agent"], capsys)
    assert code == 125
    assert out == ""
    assert "--name: 'My_Agent' is not a DNS-1123 name" in err


def test_file_name_that_gives_no_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = tmp_path / "___.toml"
    odd.write_text(BASIC, encoding="utf-8")
    code, _, err = run([str(odd), "--namespace", "agents"], capsys)
    assert code == 125
    assert "give --name" in err
    code, _, _ = run([str(odd), "--namespace", "agents", "--name", "odd"], capsys)
    assert code == 0


def test_unknown_choice_is_an_argparse_error(
    policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        run([str(policy), "--target", "podman"], capsys)
    assert exc.value.code == 125
    assert "--target" in capsys.readouterr().err


def test_output_and_dir_exclude_each_other(
    policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        run([str(policy), "-o", str(tmp_path / "a"), "--dir", str(tmp_path / "b")], capsys)
    assert exc.value.code == 125


def test_unwritable_output(
    policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        [str(policy), "--namespace", "agents", "-o", str(tmp_path / "no" / "such" / "x.yaml")],
        capsys,
    )
    assert code == 125
    assert "cannot write" in err


def test_an_existing_output_needs_force(
    policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # As init and import: an existing file is not overwritten without --force (exit 125).
    target = tmp_path / "out.yaml"
    target.write_text("kept\n")
    code, _, err = run([str(policy), "--namespace", "agents", "-o", str(target)], capsys)
    assert code == 125
    assert "pass --force" in err
    assert target.read_text() == "kept\n"
    directory = tmp_path / "manifests"
    assert run([str(policy), "--namespace", "agents", "--dir", str(directory)], capsys)[0] == 0
    code, _, err = run([str(policy), "--namespace", "agents", "--dir", str(directory)], capsys)
    assert code == 125
    assert "pass --force" in err
    # The twin: with --force both are written.
    args = [str(policy), "--namespace", "agents", "--force"]
    assert run([*args, "-o", str(target)], capsys)[0] == 0
    assert target.read_text() != "kept\n"
    assert run([*args, "--dir", str(directory)], capsys)[0] == 0
