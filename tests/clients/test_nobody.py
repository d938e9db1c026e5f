"""The compatibility cases as an unprivileged user (uid 65534), in both modes (issue 13).

curl, wget and Python's ``urllib`` and ``http.client`` (the system interpreter: the
venv's may live where uid 65534 cannot go) fetch an allowed name and a name not in the
policy, with the proxy variables and without them.
"""

from __future__ import annotations

import shutil

import pytest

from tests.clients.conftest import (
    Servers,
    check_allowed,
    check_denied,
    install_programs,
    make_job,
    parse_run,
    policy_text,
    run_env,
    script_for,
    write_run,
)
from tests.conftest import World, _nobody_python, as_nobody, require

pytestmark = pytest.mark.usefixtures("kernel")

CLIENTS = ("curl", "wget", "urllib", "httpclient")


def test_clients_as_an_unprivileged_user(world: World, servers: Servers) -> None:
    require(shutil.which("curl") is not None, "curl is not installed")
    require(shutil.which("wget") is not None, "wget is not installed")
    python = _nobody_python(from_any_process=True)
    require(python is not None, "no Python >= 3.11 that uid 65534 can execute")
    assert python is not None
    install_programs(world, servers, None)
    jobs = {}
    for mode in ("proxy", "transparent"):
        for client in CLIENTS:
            for scheme, port in (("http", servers.http.port), ("https", servers.https.port)):
                label = f"nobody-{mode}"
                jobs[(mode, client, scheme, "ok")] = make_job(
                    client, scheme, "ok", port, label=label
                )
                jobs[(mode, client, scheme, "no")] = make_job(
                    client, scheme, "no", port, label=label
                )
    allowed = [j for key, j in jobs.items() if key[3] == "ok"]
    policy = policy_text(
        allow=[j.endpoint for j in allowed],
        pins=[j.host for j in allowed],
        tls_ports=[servers.https.port],
        read=(),
    )
    script, files = "", {}
    for mode in ("proxy", "transparent"):
        part, part_files = script_for(
            [j for key, j in jobs.items() if key[0] == mode], mode, mode, python=python
        )
        script += part
        files.update(part_files)
    policy_path, audit = write_run(world, "nobody", policy, files)
    world.env.update(run_env(world))
    proc = as_nobody(
        world,
        "run",
        "--policy",
        str(policy_path),
        "--audit",
        str(audit),
        "--",
        "sh",
        "-c",
        "id -u; " + script,
    )
    ran = parse_run(proc, audit)
    assert proc.returncode == 0, ran.out
    assert proc.stdout.splitlines()[0] == "65534", ran.out
    failures = []
    for (mode, _, _, case), job in jobs.items():
        try:
            (check_allowed if case == "ok" else check_denied)(ran, job, servers, mode)
        except AssertionError as exc:
            failures.append(f"{mode} {case}: {str(exc).splitlines()[0]}")
    assert not failures, "\n".join(failures)
