"""Credentials a sandbox presents to the gateway, and their verification by TokenReview.

The peer address names the pod (:mod:`stockade.gateway._pods`); a projected
service-account token, when ``--identity`` asks for one, must belong to that very pod:
TokenReview says which pod UID the token was issued to (the ``pod-uid`` extra the API
server adds for bound tokens), and a token of another pod is refused. The token arrives
as the password of ``Proxy-Authorization: Basic`` (HTTP, CONNECT) or of the SOCKS5
username/password method (RFC 1929, whose fields are at most 255 bytes: a projected
token is usually longer, so SOCKS5 clients that need the token identity use HTTP).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass

from stockade.gateway._kube import KubeClient, KubeError

__all__ = ["Review", "TokenReviewer", "basic_password"]

#: the extras TokenReview carries for a token bound to a pod
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"


def basic_password(value: bytes) -> str | None:
    """The password of a ``Basic`` credential (a ``Bearer`` one is taken whole)."""
    scheme, _, rest = value.strip().partition(b" ")
    rest = rest.strip()
    if scheme.lower() == b"bearer" and rest:
        return rest.decode("ascii", "replace")
    if scheme.lower() != b"basic" or not rest:
        return None
    try:
        decoded = base64.b64decode(rest, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    _, sep, password = decoded.partition(":")
    return password if sep and password else None


@dataclass(frozen=True)
class Review:
    """What TokenReview said about a token."""

    authenticated: bool
    username: str = ""
    pod_uid: str = ""
    pod_name: str = ""
    error: str = ""


class TokenReviewer:
    """TokenReview with an audience, and a small cache (the sandbox-router's shape:
    2048 entries, 30 s): a token is sent to the API server about once per TTL."""

    def __init__(
        self, client: KubeClient, audience: str, *, ttl: float = 30.0, size: int = 2048
    ) -> None:
        self.client = client
        self.audience = audience
        self.ttl = ttl
        self.size = size
        self._cache: OrderedDict[bytes, tuple[float, Review]] = OrderedDict()

    async def review(self, token: str) -> Review:
        """Verify ``token``; a review that cannot be made is not authenticated."""
        key = hashlib.sha256(token.encode()).digest()  # never the token itself as a key
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] <= self.ttl:
            self._cache.move_to_end(key)
            return hit[1]
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.audience]},
        }
        try:
            answer = await self.client.request(
                "POST", "/apis/authentication.k8s.io/v1/tokenreviews", body
            )
        except KubeError as exc:
            # Not cached: the next connection asks again.
            return Review(False, error=f"TokenReview failed: {exc}")
        status = answer.get("status") or {}
        user = status.get("user") or {}
        extra = user.get("extra") or {}
        audiences = status.get("audiences")
        if not status.get("authenticated"):
            review = Review(False, error=str(status.get("error") or "not authenticated"))
        elif not isinstance(audiences, list) or self.audience not in audiences:
            # The API server names the audiences the token is valid for among those asked;
            # without ours, the token was minted for someone else (the API server itself).
            review = Review(False, error=f"the token is not for audience {self.audience}")
        else:
            review = Review(
                True,
                username=str(user.get("username") or ""),
                pod_uid=_first(extra.get(POD_UID_EXTRA)),
                pod_name=_first(extra.get(POD_NAME_EXTRA)),
            )
        self._cache[key] = (now, review)
        while len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return review


def _first(value: object) -> str:
    if isinstance(value, list) and value:
        return str(value[0])
    return str(value) if isinstance(value, str) else ""
