"""The gVisor backend's pure parts: the OCI bundle from a ContainerPlan, the runsc argv,
the version parser and gate (a fake ``--version`` script stands in for an old runsc: it
is only ever asked its version, never used as a sandbox)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stockade import Unavailable
from stockade._record import replace
from stockade.enforce import gvisor
from stockade.enforce.bubblewrap import ContainerPlan


def plan(tmp_path: Path) -> ContainerPlan:
    ws = tmp_path / "ws"
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "hooks" / "pre-commit.sample").write_text("#!/bin/sh\n")
    extra = tmp_path / "extra"
    extra.mkdir()
    return ContainerPlan(
        workspace=ws,
        home=Path("/home/u"),
        read=(extra,),
        write=(extra,),
        toolchains=(Path("/opt"),),
        masked_files=(ws / ".env",),
        masked_dirs=(ws / "secrets",),
        protected=(ws / ".git" / "hooks",),
        files=((tmp_path / "resolv.conf", "/etc/resolv.conf"),),
        cwd=ws,
    )


def mounts_by_destination(doc: dict[str, object]) -> dict[str, list[dict[str, object]]]:
    out: dict[str, list[dict[str, object]]] = {}
    for m in doc["mounts"]:  # type: ignore[attr-defined]
        out.setdefault(m["destination"], []).append(m)
    return out


def test_each_plan_field_becomes_its_mount(tmp_path: Path) -> None:
    p = plan(tmp_path)
    doc = gvisor.build_bundle(p, ["/run/stockade/launcher", "x"], {"PATH": "/usr/bin"})
    by = mounts_by_destination(doc)
    ws = str(p.workspace)
    assert by[ws] == [{"destination": ws, "type": "bind", "source": ws, "options": ["rbind", "rw"]}]
    assert by["/usr"][0]["options"] == ["rbind", "ro"]
    assert by[str(p.home)][0]["type"] == "tmpfs"  # a fresh HOME, gone with the sandbox
    assert by["/tmp"][0]["type"] == "tmpfs"
    assert by[str(p.workspace / ".env")][0]["source"] == "/dev/null"
    assert by[str(p.workspace / "secrets")][0]["type"] == "tmpfs"
    assert "ro" in by[str(p.workspace / "secrets")][0]["options"]  # type: ignore[operator]
    assert by[str(p.workspace / ".git" / "hooks")][0]["options"] == ["rbind", "ro"]
    extra = str(tmp_path / "extra")
    assert [m["options"] for m in by[extra]] == [["rbind", "ro"], ["rbind", "rw"]]
    assert by["/etc/resolv.conf"][0]["source"] == str(tmp_path / "resolv.conf")
    assert by["/opt"][-1]["options"] == ["rbind", "ro"]
    if os.path.exists("/etc/shadow"):
        assert by["/etc/shadow"][0]["source"] == "/dev/null"
    # Protected paths come after the workspace bind they cover; masks after both.
    order = [m["destination"] for m in doc["mounts"]]
    assert order.index(ws) < order.index(str(p.workspace / ".git" / "hooks"))
    assert order.index("/tmp") < order.index(str(p.home))


def test_an_empty_protected_directory_is_a_read_only_tmpfs(tmp_path: Path) -> None:
    # A placeholder of a missing .vscode (paths.protect_paths(absent_dirs=True)) is an
    # empty directory: the Sentry's own read-only tmpfs holds it, not a gofer bind. What
    # has content, and what is reached through a symlink, is still bound read-only.
    ws = tmp_path / "ws"
    (ws / ".vscode").mkdir(parents=True)
    (ws / ".idea").mkdir()
    (ws / ".idea" / "workspace.xml").write_text("<x/>")
    (ws / "real").mkdir()
    (ws / ".claude").symlink_to(ws / "real")
    p = replace(plan(tmp_path), protected=(ws / ".vscode", ws / ".idea", ws / ".claude"))
    by = mounts_by_destination(gvisor.build_bundle(p, ["true"], {}))
    assert by[str(ws / ".vscode")] == [
        {
            "destination": str(ws / ".vscode"),
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "ro", "mode=755"],
        }
    ]
    assert by[str(ws / ".idea")][0]["type"] == "bind"
    assert by[str(ws / ".idea")][0]["options"] == ["rbind", "ro"]
    assert by[str(ws / ".claude")][0]["type"] == "bind"
    assert by[str(ws / ".claude")][0]["options"] == ["rbind", "ro"]


def test_no_overlay_and_no_network_namespace(tmp_path: Path) -> None:
    doc = gvisor.build_bundle(plan(tmp_path), ["true"], {})
    assert all(m["type"] != "overlay" for m in doc["mounts"])
    kinds = {n["type"] for n in doc["linux"]["namespaces"]}
    assert kinds == {"pid", "ipc", "uts", "mount"}  # the network is stockade's namespace
    assert "seccomp" not in doc["linux"]  # the launcher loads stockade's own filter
    assert doc["root"] == {"path": "rootfs", "readonly": True}


def test_the_process(tmp_path: Path) -> None:
    p = plan(tmp_path)
    doc = gvisor.build_bundle(p, ["/run/stockade/launcher", "/s", "--", "make"], {"A": "1"})
    proc = doc["process"]
    assert proc["args"] == ["/run/stockade/launcher", "/s", "--", "make"]
    assert proc["env"] == ["A=1"]
    assert proc["cwd"] == str(p.workspace)
    assert proc["noNewPrivileges"] is True
    assert all(v == [] for v in proc["capabilities"].values())
    assert proc["terminal"] is False


def test_no_secret_in_the_bundle(tmp_path: Path) -> None:
    """The child's environment is built from the allow-list: a credential of the caller
    never reaches config.json (and no secret file is bound in)."""
    from stockade.enforce import environment
    from stockade.policy import EnvPolicy

    secret = "ghp_" + "S" * 36
    env = environment.build_environment(
        {"GH_TOKEN": secret, "PATH": "/usr/bin", "HOME": "/home/u"},
        EnvPolicy(),
        home="/home/u",
        enabled=True,
    ).env
    text = json.dumps(gvisor.build_bundle(plan(tmp_path), ["true"], env))
    assert secret not in text
    assert "/.ssh" not in text
    assert "id_ed25519" not in text


def test_the_netns_only_form_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        gvisor.build_bundle(ContainerPlan(tmp_path, tmp_path, isolate=False), ["true"], {})


def test_runsc_argv_never_picks_kvm() -> None:
    new = gvisor.Runsc(Path("/x/runsc"), (20240729, 0), "")
    argv = gvisor.runsc_argv(new, "/s", "/b", "id1")
    assert argv[0] == "/x/runsc"
    assert "--platform=systrap" in argv
    assert "--network=host" in argv
    assert "--overlay2=none" in argv
    assert "--ignore-cgroups" in argv
    assert argv[-3:] == ["run", "--bundle=/b", "id1"]
    assert not any("kvm" in a for a in argv)
    old = gvisor.Runsc(Path("/x/runsc"), (20230301, 0), "")
    assert "--platform=ptrace" in gvisor.runsc_argv(old, "/s", "/b", "i")
    assert "--platform=kvm" in gvisor.runsc_argv(new, "/s", "/b", "i", platform="kvm")


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("runsc version release-20240729.0\nspec: 1.1.0\n", (20240729, 0)),
        ("runsc version 0.0~20240729.0\nspec: 1.2.0\n", (20240729, 0)),
        ("runsc version 0.0~20221219.0\n", (20221219, 0)),
        ("runsc version release-20230227.12\n", (20230227, 12)),
        ("runsc version VERSION_MISSING\n", None),
        ("", None),
    ],
)
def test_parse_version(text: str, release: tuple[int, int] | None) -> None:
    assert gvisor.parse_version(text) == release


def fake_runsc(tmp_path: Path, version: str) -> Path:
    """A script that only answers --version (the gate's parser test; never a sandbox)."""
    path = tmp_path / "runsc"
    path.write_text(f"#!/bin/sh\necho 'runsc version {version}'\necho 'spec: 1.0.2'\n")
    path.chmod(0o755)
    return path


def test_the_gate_refuses_an_old_runsc_and_says_how_to_get_one(tmp_path: Path) -> None:
    path = fake_runsc(tmp_path, "0.0~20221219.0")
    with pytest.raises(Unavailable) as info:
        gvisor.require_runsc({"STOCKADE_RUNSC": str(path)})
    text = str(info.value)
    assert "release-20221219.0" in text
    assert "release-20230227.0" in text
    assert "scripts/get-runsc" in text or "STOCKADE_GVISOR=1" in text


def test_the_gate_takes_a_new_enough_runsc(tmp_path: Path) -> None:
    path = fake_runsc(tmp_path, "release-20230227.0")
    found = gvisor.require_runsc({"STOCKADE_RUNSC": str(path)})
    assert found.release == (20230227, 0)
    assert found.platform == "ptrace"


def test_a_missing_runsc_is_unavailable(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": str(tmp_path / "nothing")}
    assert gvisor.find_runsc(env) is None
    with pytest.raises(Unavailable, match="runsc"):
        gvisor.require_runsc(env)


def test_the_cache_is_searched_first_newest_release(tmp_path: Path) -> None:
    for version in ("20230301.0", "20240729.0", "20231001.0"):
        d = tmp_path / ".cache" / "stockade" / "runsc" / version
        d.mkdir(parents=True)
        fake_runsc(d, version)
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    assert gvisor.find_runsc(env) == tmp_path / ".cache/stockade/runsc/20240729.0/runsc"


def test_inside_gvisor() -> None:
    fake = "Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016\n"
    assert gvisor.inside_gvisor(fake)
    assert gvisor.inside_gvisor("Linux version 6.1.0 (debian)", dmesg="[ 0.0] Starting gVisor...")
    assert not gvisor.inside_gvisor("Linux version 6.18.0 (gcc 12) #1 SMP\n")


def test_without_a_compiler_no_gvisor_run_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry cannot be built (no compiler, an empty cache): a clear error naming it,
    raised where the run is made (GvisorRun), before anything of the run exists. Its
    twin: with a compiler, every gVisor run builds it (runtime/test_gvisor_run.py)."""
    from stockade.runtime._gvisor import GvisorRun

    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    runsc = gvisor.Runsc(Path("/nonexistent/runsc"), (20240729, 0), "")
    with pytest.raises(Unavailable, match="the gVisor entry") as info:
        GvisorRun(runsc, tmp_path / "scratch", "r1")
    assert "gcc" in str(info.value)
    assert not (tmp_path / "scratch").exists()
    assert not list((tmp_path / "cache").glob("stockade/gvisor-entry-*"))


def test_the_entry_argv_is_the_binary_then_its_arguments_then_runsc() -> None:
    argv = gvisor.entry_argv(
        "/c/gvisor-entry-0123",
        1000,
        1001,
        42,
        5,
        6,
        ["/x/runsc", "run", "id"],
        state="/s",
        container_id="stockade-r",
        overlay=("/ws", "/layer"),
        refused="/scratch/entry.refused",
    )
    assert argv == [
        "/c/gvisor-entry-0123",
        "1000",
        "1001",
        "42",
        "5",
        "6",
        "1",
        "--root=/s",
        "stockade-r",
        "/ws",
        "/layer",
        "/scratch/entry.refused",
        "--",
        "/x/runsc",
        "run",
        "id",
    ]
    plain = gvisor.entry_argv(
        "/e", 0, 0, 1, 3, 4, ["/r"], state="/s", container_id="c", share_net=True
    )
    assert plain[6] == "0"
    assert plain[9:12] == ["", "", ""]
    with pytest.raises(ValueError):
        gvisor.entry_argv(
            "/e",
            0,
            0,
            1,
            3,
            4,
            ["/r"],
            state="/s",
            container_id="c",
            overlay=("ws", "/l"),
            refused="/f",
        )
