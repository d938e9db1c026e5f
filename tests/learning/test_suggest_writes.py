"""The suggestion's write rules for what a learning run wrote in its throwaway views
(pure: observations in, lines out; the host's file system is a given set of paths)."""

from __future__ import annotations

from stockade.learning import suggest

HOST = {"/srv/app", "/srv/app/app.conf", "/srv/app/sub", "/srv/app/sub/k", "/srv/other"}
DIRS = {"/srv/app", "/srv/app/sub", "/srv/other"}


def _write(path: str, change: str = "written") -> dict[str, object]:
    return {"kind": "write", "path": path, "change": change, "run": 1}


def _lines(*observations: dict[str, object]) -> dict[str, tuple[str, tuple[str, ...]]]:
    s = suggest(observations, exists=HOST.__contains__, isdir=DIRS.__contains__)
    return {line.value: (line.widening, line.needs) for line in s.section("write")}


def test_an_existing_file_written_is_granted_exactly() -> None:
    assert _lines(_write("/srv/app/app.conf")) == {
        "/srv/app/app.conf": ("", ("run 1: write /srv/app/app.conf",))
    }


def test_a_deletion_grants_its_directory_named_as_a_widening() -> None:
    lines = _lines(_write("/srv/app/sub/k", "deleted"))
    assert list(lines) == ["/srv/app/sub"]
    widening, needs = lines["/srv/app/sub"]
    assert "to delete /srv/app/sub/k needs its directory" in widening
    assert needs == ("run 1: delete /srv/app/sub/k",)


def test_a_directory_replaced_grants_the_directory_holding_it() -> None:
    lines = _lines(_write("/srv/app/sub", "replaced"))
    assert list(lines) == ["/srv/app"]
    assert lines["/srv/app"][1] == ("run 1: replace /srv/app/sub",)


def test_what_was_made_grants_the_nearest_existing_directory_and_folds_the_rest() -> None:
    lines = _lines(
        _write("/srv/app/made", "made"),
        _write("/srv/app/made/deep/f"),
        _write("/srv/app/app.conf"),
        _write("/srv/other/x"),
    )
    # one line per directory; the file inside the granted directory folds into it
    assert sorted(lines) == ["/srv/app", "/srv/other"]
    widening, needs = lines["/srv/app"]
    assert widening
    assert set(needs) == {
        "run 1: write /srv/app/made",
        "run 1: write /srv/app/made/deep/f",
        "run 1: write /srv/app/app.conf",
    }
    assert lines["/srv/other"][1] == ("run 1: write /srv/other/x",)


def test_a_write_under_a_system_path_is_never_suggested_but_listed() -> None:
    s = suggest([_write("/usr/local/lib/x")], exists=lambda p: True, isdir=lambda p: False)
    assert s.section("write") == []
    assert any("/usr/local/lib/x" in line and "system path" in line for line in s.skipped)
