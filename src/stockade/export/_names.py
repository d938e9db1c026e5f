"""Kubernetes name, label and annotation rules, checked before anything is written.

A manifest the API server rejects at ``kubectl apply`` time is a worse error than one
``export`` refuses with the key to fix, so every name the export derives is checked here.
"""

from __future__ import annotations

import re

from stockade._exceptions import PolicyError
from stockade._hash import sha256_hex

#: RFC 1123 label: names of namespaces, Services, and (by choice) every object we write.
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: A label value: empty, or alphanumerics at both ends with ``-_.`` between.
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
#: The name part of a qualified label or annotation key.
QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
#: A key of a ConfigMap's or Secret's data.
DATA_KEY = re.compile(r"[-._a-zA-Z0-9]+")
MAX_NAME = 63

#: Key domains that agent-sandbox (and Kubernetes) reserve for themselves: a claim's
#: ``additionalPodMetadata`` under them is rejected. stockade writes its own keys under
#: ``stockade.dev/`` only; the tests check that no key falls under one of these.
RESTRICTED_DOMAINS = ("kubernetes.io", "k8s.io", "x-k8s.io")

#: The longest suffix export appends to the name: agent-sandbox names the managed
#: NetworkPolicy of a template ``<template>-network-policy``, and it must stay a name.
LONGEST_SUFFIX = "-network-policy"
MAX_BASE_NAME = MAX_NAME - len(LONGEST_SUFFIX)


def is_dns1123_label(text: str) -> bool:
    """True when ``text`` is a DNS-1123 label of at most 63 characters."""
    return len(text) <= MAX_NAME and DNS1123_LABEL.fullmatch(text) is not None


def is_label_value(text: str) -> bool:
    """True when ``text`` is a valid label value."""
    return len(text) <= MAX_NAME and LABEL_VALUE.fullmatch(text) is not None


def is_restricted_key(key: str) -> bool:
    """True when a label or annotation key falls under a reserved domain."""
    prefix, sep, _ = key.rpartition("/")
    if not sep:
        return False
    return any(prefix == d or prefix.endswith("." + d) for d in RESTRICTED_DOMAINS)


def check_name(value: str, what: str, *, max_len: int = MAX_NAME) -> str:
    """Return ``value`` when it is a DNS-1123 label of at most ``max_len`` characters."""
    if not value:
        raise PolicyError(f"{what}: empty; give a DNS-1123 name such as 'agent'")
    if len(value) > max_len:
        raise PolicyError(
            f"{what}: {value!r} has {len(value)} characters, at most {max_len} are allowed"
            f"{' (derived names such as NAME' + LONGEST_SUFFIX + ' must stay within 63)' if max_len < MAX_NAME else ''}"
        )
    if DNS1123_LABEL.fullmatch(value) is None:
        raise PolicyError(
            f"{what}: {value!r} is not a DNS-1123 name: lower-case letters, digits and "
            "'-', starting and ending with a letter or digit"
        )
    return value


def name_from(text: str) -> str:
    """A DNS-1123 spelling of ``text`` (a file name): lower case, other characters as
    ``-``; empty when nothing is left."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


def bounded(name: str) -> str:
    """``name`` if it fits in 63 characters, else a stable shortened form of it."""
    if len(name) <= MAX_NAME:
        return name
    return f"{name[:54].rstrip('-')}-{sha256_hex(name.encode())[:8]}"
