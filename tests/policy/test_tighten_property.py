"""A workspace policy admits nothing the user policy alone does not (issue 22).

For generated pairs (user policy, workspace policy), whenever the loader accepts the pair,
the effective policy is no wider than the user policy on its own in files, network, env,
limits, layers, backend and the MCP and asking switches. A refused pair is fine: refusing
is how a workspace file is told it cannot widen.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stockade import PolicyError
from stockade.policy import Policy, load_policy

HOSTS = ["a.test", "b.test", "*.c.test", "d.test:8443"]
NAMES = ["CI", "NODE_ENV", "LD_PRELOAD", "PYTHONPATH"]
VALUES = ["1", "/tmp/x.so"]
LAYERS = ["files", "container", "syscalls", "secrets", "egress", "inspect", "limits", "overlay"]
DIRS = ["r1", "r2", "w1", "w1/sub", "w2"]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


def _render(tables: dict[str, dict[str, Any]]) -> str:
    out = []
    for table, keys in tables.items():
        if keys:
            out.append(f"[{table}]")
            out += [f"{k} = {_toml(v)}" for k, v in keys.items()]
    return "\n".join(out) + "\n"


def _tables(root: str) -> st.SearchStrategy[dict[str, dict[str, Any]]]:
    paths = st.lists(st.sampled_from(DIRS), max_size=3, unique=True).map(
        lambda ds: [f"{root}/{d}" for d in ds]
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "filesystem": st.fixed_dictionaries({}, optional={"read": paths, "write": paths}),
            "env": st.fixed_dictionaries(
                {},
                optional={
                    "pass": st.lists(st.sampled_from(["CI", "NODE_ENV"]), unique=True),
                    "set": st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VALUES)),
                },
            ),
            "network": st.fixed_dictionaries(
                {},
                optional={
                    "allow": st.lists(st.sampled_from(HOSTS), unique=True),
                    "hosts": st.dictionaries(
                        st.sampled_from(["a.test", "b.test"]),
                        st.sampled_from(["127.0.0.1", "127.0.0.2"]),
                    ),
                    "strict": st.booleans(),
                    "transparent": st.booleans(),
                },
            ),
            "limits": st.fixed_dictionaries(
                {},
                optional={
                    "pids": st.integers(1, 512),
                    "cpu_seconds": st.integers(0, 100),
                    "wall_seconds": st.integers(0, 100),
                },
            ),
            "layers": st.dictionaries(st.sampled_from(LAYERS), st.booleans()),
            "container": st.fixed_dictionaries(
                {}, optional={"backend": st.sampled_from(["bubblewrap", "gvisor"])}
            ),
            "mcp": st.fixed_dictionaries({}, optional={"allow_always": st.booleans()}),
        },
    )


@contextlib.contextmanager
def _world() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="stockade-prop-"))
    old_env, old_cwd = dict(os.environ), os.getcwd()
    try:
        for d in DIRS:
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "ws").mkdir()
        os.environ["XDG_CONFIG_HOME"] = str(root / "config")
        os.environ["XDG_STATE_HOME"] = str(root / "state")
        os.chdir(root / "ws")
        yield root
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
        shutil.rmtree(root, ignore_errors=True)


def _covered(path: Path, grants: tuple[Path, ...]) -> bool:
    return any(path == g or g in path.parents for g in grants)


def _limit_le(ws: float, base: float) -> bool:
    # 0 means unlimited: tighter is any positive value, or equal.
    return base == 0 or (ws != 0 and ws <= base)


def _assert_no_wider(eff: Policy, user: Policy) -> None:
    ufs, efs = user.filesystem, eff.filesystem
    assert _covered(efs.workspace, (ufs.workspace,))
    for p in efs.read:
        assert _covered(p, (*ufs.read, *ufs.write, ufs.workspace)), p
    for p in efs.write:
        assert _covered(p, (*ufs.write, ufs.workspace)), p
    upass = {e.name: e for e in user.env.pass_}
    for e in eff.env.pass_:
        assert e.name in upass
        assert not e.allow_secret or upass[e.name].allow_secret
    for name, value in eff.env.set.items():
        assert user.env.set.get(name) == value, name
    assert set(eff.network.allow) <= set(user.network.allow)
    assert set(user.network.deny) <= set(eff.network.deny)
    assert eff.network.hosts.items() <= user.network.hosts.items()
    assert eff.network.strict or not user.network.strict
    assert user.network.transparent or not eff.network.transparent
    assert eff.network.upstream == user.network.upstream
    assert eff.secrets == user.secrets
    el, ul = eff.limits, user.limits
    assert el.pids <= ul.pids
    assert el.memory <= ul.memory
    assert el.file_size <= ul.file_size
    assert _limit_le(el.cpu_seconds, ul.cpu_seconds)
    assert _limit_le(el.wall_seconds, ul.wall_seconds)
    assert set(user.layers.active()) <= set(eff.layers.active())
    if user.container.backend == "gvisor":
        assert eff.container.backend == "gvisor"
    else:
        assert eff.container.backend in (user.container.backend, "gvisor")
    assert eff.mcp.allow_always <= user.mcp.allow_always


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_workspace_policy_never_widens_the_user_policy(data: st.DataObject) -> None:
    with _world() as root:
        user_raw = data.draw(_tables(str(root)), label="user")
        ws_raw = data.draw(_tables(str(root)), label="workspace")
        (root / "config" / "stockade").mkdir(parents=True)
        (root / "config" / "stockade" / "policy.toml").write_text(_render(user_raw))
        try:
            user = load_policy()
        except PolicyError:
            return  # the user policy itself is invalid: nothing to compare
        (root / "ws" / "stockade.toml").write_text(_render(ws_raw))
        try:
            effective = load_policy()
        except PolicyError:
            return  # refused: the workspace file asked for more
        _assert_no_wider(effective, user)


def test_twin_a_narrowing_workspace_policy_is_accepted_and_applied() -> None:
    with _world() as root:
        (root / "config" / "stockade").mkdir(parents=True)
        (root / "config" / "stockade" / "policy.toml").write_text(
            '[network]\nallow = ["a.test", "b.test"]\n[env]\nset = { CI = "1" }\n'
        )
        (root / "ws" / "stockade.toml").write_text(
            '[network]\nallow = ["a.test"]\n[env]\nset = { CI = "1" }\n[limits]\npids = 8\n'
        )
        eff = load_policy()
        assert eff.network.allow == ("a.test",)
        assert eff.limits.pids == 8
        assert eff.env.set == {"CI": "1"}
