"""A learning run: the task under a policy that refuses nothing it needs, and records it.

What a learning run changes in the policy it starts from (:func:`learning_policy`):

* **network**: ``network.learning`` (:class:`stockade.policy._network.EgressRules`): every
  name no ``deny`` entry matches is allowed and resolved; each address is still decided
  as always, so metadata endpoints, private ranges and this host's own addresses stay
  refused in learning too (a name pinned by ``network.hosts`` reaches its pin, as in any
  run). The proxy audits each decision (``dns_query``, ``net_connect``, and for plain
  HTTP and inspected TLS each ``net_request`` with its method and path).
* **files**: the host's system and data directories (:data:`LEARN_VISIBLE`) and any
  ``see`` directory are readable, so a read outside the workspace succeeds and is seen
  by the seccomp observer (:mod:`stockade.enforce.observe`). The sandbox keeps its own
  HOME, /tmp, /proc and /dev, and ``filesystem.deny`` (the secret files) stays masked.
  Those directories are shown through throwaway copy-on-write views
  (``filesystem.scratch``, :mod:`stockade.runtime._learnscratch`): the task's writes
  there succeed and are recorded (``scratch_write``), and the host's files stay as they
  were.
* nothing else: the container, syscalls, secrets and limits layers stay as the policy
  has them (a limit reached is recorded as an observation).

A run directory holds ``learn.json`` (the task, each run's exit status and digests of its
outputs) and ``observations.jsonl`` (one distinct observation per line, per run).
Learning again into the same directory adds runs; ``stockade policy suggest`` merges
any number of directories.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade._exceptions import PolicyError
from stockade._record import replace
from stockade.policy import Policy

__all__ = [
    "LEARN_VISIBLE",
    "LearnResult",
    "RunDir",
    "learning_policy",
    "observations_from_events",
]

#: host directories a learning run makes readable (when they exist), besides the system
#: paths every run has (/usr, /etc, /opt, ...). HOME, /tmp, /var/tmp, /run, /proc, /sys
#: and /dev stay the sandbox's own (binding the host's would hand the task host devices,
#: sockets and processes), and so do /var/lib and /var/cache (daemons keep their unix
#: sockets there: ``connect()`` on one needs no write permission, so a read-only bind
#: would not stop it). ``see`` adds directories of the caller's; the unix sockets found
#: in any of them are masked (``filesystem.deny``), as the workspace's are.
LEARN_VISIBLE: tuple[str, ...] = ("/srv",)

OBSERVATIONS = "observations.jsonl"
SUMMARY = "learn.json"
FORMAT = 1


def learning_policy(policy: Policy, see: Sequence[Path] = (), *, scratch: bool = True) -> Policy:
    """``policy`` made to refuse nothing a task needs and to record it (module docstring);
    ``scratch``: the directories it makes readable get throwaway writable views."""
    fs = policy.filesystem
    visible = [Path(p) for p in LEARN_VISIBLE if os.path.isdir(p)]
    for extra in see:
        path = Path(os.path.abspath(os.path.expanduser(extra)))
        if not path.exists():
            raise PolicyError(f"learn: --see {extra}: no such file or directory")
        visible.append(path)
    from stockade.enforce.paths import workspace_sockets

    sockets: list[str] = []
    for directory in visible:
        if not directory.is_dir():
            continue
        found, complete = workspace_sockets(directory)
        if not complete:
            raise PolicyError(
                f"learn: {directory} is too large to search for unix sockets in time; "
                "make it visible with a narrower --see directory"
            )
        sockets += [str(p) for p in found]
    read = tuple(dict.fromkeys((*fs.read, *visible)))
    return replace(
        policy,
        filesystem=replace(
            fs,
            read=read,
            deny=(*fs.deny, *sockets),
            scratch=scratch_dirs(read, fs.workspace) if scratch else (),
        ),
        network=replace(policy.network, learning=True),
    )


def scratch_dirs(candidates: Sequence[Path], workspace: Path) -> tuple[Path, ...]:
    """The directories of ``candidates`` that get a throwaway copy-on-write view in a
    learning run (:mod:`stockade.runtime._learnscratch`): existing directories outside
    the workspace (and not holding it: it is read-write already), outermost only (a view
    inside another would be a view of a view)."""
    dirs = sorted({Path(os.path.abspath(c)) for c in candidates if os.path.isdir(c)})
    out: list[Path] = []
    ws = str(workspace)
    for d in dirs:
        text = str(d)
        if _under(text, [ws]) or _under(ws, [text]):
            continue
        if _under(text, [str(o) for o in out]):
            continue
        out.append(d)
    return tuple(out)


def _digest(data: bytes | None) -> str:
    return hashlib.sha256(data or b"").hexdigest()


def observations_from_events(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The network and limit observations in one run's audit events (distinct, counted)."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}

    def add(key: tuple[Any, ...], record: dict[str, Any]) -> None:
        if key in seen:
            seen[key]["count"] += 1
        else:
            seen[key] = {**record, "count": 1}

    for event in events:
        name = event.get("event")
        host = str(event.get("host") or "")
        port = int(event.get("port") or 0)
        verdict = str(event.get("verdict") or "")
        if name == "net_connect" and host and port:
            if event.get("detail") == "forward proxy":
                continue  # its requests are observed one by one (net_request)
            record = {
                "kind": "connect",
                "host": host,
                "port": port,
                "verdict": verdict,
                "reason": event.get("reason") or "",
                "address": event.get("address") or "",
                "address_class": event.get("address_class") or "",
            }
            add(("connect", host, port, verdict), record)
        elif name == "net_request" and host and port:
            method = str(event.get("method") or "")
            path = str(event.get("path") or "/")
            record = {
                "kind": "request",
                "protocol": event.get("protocol") or "",
                "host": host,
                "port": port,
                "method": method,
                "path": path,
                "verdict": verdict,
                "reason": event.get("reason") or "",
                "address_class": event.get("address_class") or "",
            }
            add(("request", host, port, method, path, verdict), record)
        elif verdict == "deny" and event.get("layer") == "limits":
            record = {"kind": "limit", "reason": event.get("reason"), "detail": event.get("detail")}
            add(("limit", event.get("reason")), record)
        elif name == "scratch_write" and event.get("path"):
            # written in a throwaway view (runtime/_learnscratch.py): the host's file was
            # not touched, the task needs the write all the same
            path = str(event.get("path"))
            add(
                ("write", path),
                {"kind": "write", "path": path, "change": event.get("change") or "written"},
            )
        elif name == "env_dropped":
            add(
                ("env-withheld", event.get("name")),
                {"kind": "env-withheld", "name": event.get("name")},
            )
    return list(seen.values())


@dataclass
class LearnResult:
    """What :func:`stockade.learn` returns: the run directory and each run's outcome."""

    run_dir: Path
    returncodes: list[int] = field(default_factory=list)
    stdout: bytes | None = None
    stderr: bytes | None = None
    #: distinct observations added by these runs
    observations: list[dict[str, Any]] = field(default_factory=list)
    mechanism: str = ""


class RunDir:
    """A learn run directory: ``learn.json`` and ``observations.jsonl`` (module docstring).

    Everything in it came from a sandboxed task: it is read as data, never as code or as
    a policy (``suggest`` turns it into a policy a person reviews)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def summary(self) -> dict[str, Any]:
        """``learn.json``, or an empty summary for a new directory."""
        file = self.path / SUMMARY
        if not file.exists():
            return {"format": FORMAT, "runs": []}
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PolicyError(f"{file}: not a learn run directory ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PolicyError(f"{file}: not a learn run directory of format {FORMAT}")
        return data

    def observations(self) -> list[dict[str, Any]]:
        """Every observation line, in order."""
        file = self.path / OBSERVATIONS
        if not (self.path / SUMMARY).exists():
            raise PolicyError(f"{self.path}: not a learn run directory (no {SUMMARY})")
        out: list[dict[str, Any]] = []
        if not file.exists():
            return out
        with file.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    raise PolicyError(f"{file}:{number}: not JSON") from None
                if isinstance(record, dict) and isinstance(record.get("kind"), str):
                    out.append(record)
        return out

    def append(self, run: dict[str, Any], observations: list[dict[str, Any]]) -> int:
        """Add one run and its observations; return the run's number (from 1)."""
        self.path.mkdir(parents=True, exist_ok=True)
        summary = self.summary()
        number = len(summary["runs"]) + 1
        summary["runs"].append({**run, "run": number})
        with (self.path / OBSERVATIONS).open("a", encoding="utf-8") as handle:
            for record in observations:
                handle.write(json.dumps({**record, "run": number}, sort_keys=True) + "\n")
        tmp = self.path / (SUMMARY + ".tmp")
        tmp.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(self.path / SUMMARY)
        return number


def run_record(
    argv: Sequence[str], policy: Policy, result: Any, duration: float, mechanism: str
) -> dict[str, Any]:
    """One run's entry of ``learn.json``."""
    return {
        "argv": list(argv),
        "workspace": str(policy.filesystem.workspace),
        "policy_sources": list(policy.sources),
        "hosts": dict(policy.network.hosts),
        "tls_ports": list(policy.network.tls_ports),
        "upstream_ca": str(policy.network.upstream_ca) if policy.network.upstream_ca else None,
        "returncode": result.returncode,
        "stdout_sha256": _digest(result.stdout),
        "stderr_sha256": _digest(result.stderr),
        "duration": round(duration, 6),
        "mechanism": mechanism,
        "time": time.time(),
    }


#: the sandbox's own directories in a learning run: what the task does there is not the
#: host's (a fresh tmpfs, its own /proc and /dev), so it is not an observation
PRIVATE: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev", "/proc", "/sys", "/run")


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def file_observations(
    seen: Mapping[Any, int],
    workspace: Path,
    home: str,
    see: Sequence[Path] = (),
    *,
    granted: Sequence[Path] = (),
) -> list[dict[str, Any]]:
    """The observer's records as observation lines. Left out: the workspace and
    ``granted`` (the caller's PATH tools: every run binds them) and the sandbox's own
    directories (:data:`PRIVATE` and its HOME), except what a ``see`` directory bound
    from the host."""
    private = (*PRIVATE, home)
    shown = [str(p) for p in see]
    always = [str(workspace), *map(str, granted)]
    out = []
    for item, count in sorted(seen.items(), key=lambda kv: (kv[0].kind, kv[0].path)):
        if _under(item.path, always):
            continue
        if _under(item.path, private) and not _under(item.path, shown):
            continue
        out.append({"kind": item.kind, "path": item.path, "count": count})
    return out


def env_observations(env: Mapping[str, str]) -> list[dict[str, Any]]:
    """The names the task was given (reads of the environment are not observable: a
    process reads its own memory)."""
    return [{"kind": "env", "name": name} for name in sorted(env)]
