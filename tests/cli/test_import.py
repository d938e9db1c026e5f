"""``stockade import srt``: the real CLI in a subprocess, on real files."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.policy.test_srt import README_COMPLETE


def stockade(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stockade", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_import_to_stdout_then_check(tmp_path: Path) -> None:
    src = tmp_path / "srt.json"
    src.write_text(json.dumps(README_COMPLETE))
    result = stockade("import", "srt", str(src), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert tomllib.loads(result.stdout)["network"]["deny"] == ["malicious.com"]
    out = tmp_path / "policy.toml"
    out.write_text(result.stdout)
    check = stockade("check", str(out), "--json", cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["network"]["allow"][0] == "github.com"


def test_import_writes_file_and_refuses_to_overwrite(tmp_path: Path) -> None:
    src = tmp_path / "srt.json"
    src.write_text(json.dumps({"network": {"allowedDomains": ["pypi.org"]}}))
    out = tmp_path / "stockade.toml"
    first = stockade("import", "srt", str(src), "-o", str(out), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert '"pypi.org"' in out.read_text()
    out.write_text("# mine\n")
    second = stockade("import", "srt", str(src), "-o", str(out), cwd=tmp_path)
    assert second.returncode == 125
    assert "--force" in second.stderr
    assert out.read_text() == "# mine\n"
    third = stockade("import", "srt", str(src), "-o", str(out), "--force", cwd=tmp_path)
    assert third.returncode == 0
    assert '"pypi.org"' in out.read_text()


def test_unmappable_key_is_a_one_line_error(tmp_path: Path) -> None:
    src = tmp_path / "srt.json"
    src.write_text(json.dumps({"network": {"allowedDomains": [], "httpProxyPort": 3128}}))
    result = stockade("import", "srt", str(src), cwd=tmp_path)
    assert result.returncode == 125
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "network.httpProxyPort" in lines[0]
