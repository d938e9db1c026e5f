"""HOST-04 (host sockets inside the workspace) and NET-07/23 (warnings for open channels)."""

from __future__ import annotations

from tests.attacks.conftest import Arena


def test_host_04_host_socket_inside_the_workspace_is_masked(arena: Arena) -> None:
    """A host service's unix socket inside the workspace (git's fsmonitor daemon, a dev
    server) is masked: connect() needs no write permission, so a read-only bind would not
    do, and Landlock on this kernel does not restrict connect() on pathname sockets. The
    allowed twin: a socket the sandbox makes itself works (test_wrt_13, "sock")."""
    arena.reset()
    arena._unix_sink("ws-git", arena.workspace / ".git" / "fsmonitor--daemon.ipc")
    arena._unix_sink("ws-dev", arena.workspace / "dev-server.sock")
    res = arena.py(
        'emit("git", **connect(socket.AF_UNIX, ".git/fsmonitor--daemon.ipc"))\n'
        'emit("dev", **connect(socket.AF_UNIX, "dev-server.sock"))\n'
    )
    assert res["git"]["ok"] is False
    assert res["dev"]["ok"] is False
    assert arena.rec_unix.take() == []


def test_net_07_23_doh_tunnel_and_paste_hosts_are_warned_about(arena: Arena) -> None:
    policy = arena.root / "exfil.toml"
    policy.write_text(
        'version = 1\n[network]\nallow = ["dns.google", "cloudflare-dns.com",'
        ' "*.trycloudflare.com", "*.ngrok-free.app", "webhook.site", "pastebin.com"]\n'
    )
    check = arena.stockade("check", str(policy))
    run = arena.run("true", policy=policy)
    text = (check.stdout + check.stderr + run.proc.stderr).lower()
    for host in (
        "dns.google",
        "cloudflare-dns.com",
        "trycloudflare.com",
        "ngrok-free.app",
        "webhook.site",
        "pastebin.com",
    ):
        assert f'"{host}" is' in text or f'"*.{host}" is' in text, (host, text)
    # The twin: an ordinary registry draws no warning.
    policy.write_text('version = 1\n[network]\nallow = ["registry.npmjs.org"]\n')
    quiet = arena.stockade("check", str(policy))
    assert "warning" not in (quiet.stdout + quiet.stderr).lower()
