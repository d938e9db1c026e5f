"""Three network namespaces joined by veth pairs: sbx (the pods), gw, inet (the origins).

::

    sbx  10.77.1.2, .3, .9/32 ── veth ── 10.77.1.1/24  gw  10.77.2.1/24 ── veth ── 10.77.2.2/24  inet
         only route: 10.77.1.1                         ip_forward=0                 no route back

``sbx`` holds every pod address and a single host route, to the gateway's address: the
NetworkPolicy fence, emulated. ``gw`` does not forward. Every address lives inside a
namespace made here; the veths are created inside them (never in the host's namespace),
and deleting the namespaces deletes them. Sockets are made in a namespace by switching
the calling thread into it for the ``socket()`` call (a socket stays in the namespace it
was made in): origins and clients run in this process, the gateway in its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
from collections.abc import Iterator

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

GW_POD_SIDE = "10.77.1.1"
GW_INET_SIDE = "10.77.2.1"
INET = "10.77.2.2"


def _setns(fd: int) -> None:
    if int(_libc.setns(fd, CLONE_NEWNET)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


@contextlib.contextmanager
def inside(name: str) -> Iterator[None]:
    """Run the block with this thread in network namespace ``name``."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{name}", os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield
            finally:
                _setns(own)
        finally:
            os.close(target)
    finally:
        os.close(own)


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


class Topology:
    """The namespaces, made by :meth:`create` and removed by :meth:`destroy`."""

    def __init__(self, pod_addresses: tuple[str, ...]) -> None:
        tag = f"{os.getpid()}"
        self.sbx, self.gw, self.inet = (f"stk-{r}-{tag}" for r in ("sbx", "gw", "inet"))
        self.pod_addresses = pod_addresses
        self._made: list[str] = []

    def create(self) -> None:
        for name in (self.sbx, self.gw, self.inet):
            _ip("netns", "add", name)
            self._made.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", self.gw, "link", "add", "gw-sbx", "type", "veth", "peer", "name", "sbx-gw")
        _ip("-n", self.gw, "link", "set", "sbx-gw", "netns", self.sbx)
        _ip("-n", self.gw, "link", "add", "gw-inet", "type", "veth", "peer", "name", "inet-gw")
        _ip("-n", self.gw, "link", "set", "inet-gw", "netns", self.inet)
        # sbx: the pod addresses, and one host route: to the gateway.
        for address in self.pod_addresses:
            _ip("-n", self.sbx, "addr", "add", f"{address}/32", "dev", "sbx-gw")
        _ip("-n", self.sbx, "link", "set", "sbx-gw", "up")
        _ip("-n", self.sbx, "route", "add", f"{GW_POD_SIDE}/32", "dev", "sbx-gw")
        # gw: both sides, not a router.
        _ip("-n", self.gw, "addr", "add", f"{GW_POD_SIDE}/24", "dev", "gw-sbx")
        _ip("-n", self.gw, "addr", "add", f"{GW_INET_SIDE}/24", "dev", "gw-inet")
        _ip("-n", self.gw, "link", "set", "gw-sbx", "up")
        _ip("-n", self.gw, "link", "set", "gw-inet", "up")
        subprocess.run(
            ["ip", "netns", "exec", self.gw, "sysctl", "-qw", "net.ipv4.ip_forward=0"],
            check=True,
        )
        # inet: the origins' address, and no route towards the pods.
        _ip("-n", self.inet, "addr", "add", f"{INET}/24", "dev", "inet-gw")
        _ip("-n", self.inet, "link", "set", "inet-gw", "up")

    def destroy(self) -> None:
        """Delete every namespace made (their veths go with them); errors are collected
        and raised after all were tried."""
        errors = []
        for name in reversed(self._made):
            try:
                _ip("netns", "delete", name)
            except RuntimeError as exc:
                errors.append(str(exc))
        self._made.clear()
        if errors:
            raise RuntimeError("; ".join(errors))

    def socket_in(self, namespace: str) -> socket.socket:
        with inside(namespace):
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM)

    def listen(self, namespace: str, host: str, port: int) -> socket.socket:
        sock = self.socket_in(namespace)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        return sock

    def connect(
        self, namespace: str, host: str, port: int, source: str | None = None, timeout: float = 5.0
    ) -> socket.socket:
        """A TCP connection made from ``namespace`` (from ``source``, when given)."""
        sock = self.socket_in(namespace)
        try:
            sock.settimeout(timeout)
            if source is not None:
                sock.bind((source, 0))
            sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        return sock


def existing() -> set[str]:
    """The names of the network namespaces that exist now."""
    result = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
