"""The inspect layer: TLS interception, request rules, bound credentials, labelled data.

How the runtime and the proxy use it:

* :class:`CertificateAuthority` — ``ephemeral()`` per run or ``for_user()`` (kept in
  ``$XDG_DATA_HOME/stockade/ca``); :func:`write_trust_bundle` writes system roots plus
  the CA certificate to a file the runtime binds read-only into the sandbox, and
  :func:`trust_environment` gives the variables pointing clients at it.
* :class:`SecretStore` — ``SecretStore.resolve(policy.secrets)`` reads the real values
  on the host; ``environment()`` is what the sandbox gets instead (placeholders).
* :class:`InspectLayer` — ``InspectLayer.from_policy(policy, ca, audit, secrets=store)``;
  the proxy asks ``layer.inspects(host, port)`` after allowing a CONNECT to a TLS port and,
  when true, hands the client socket to ``await layer.serve(sock, host, port, address,
  initial)`` instead of relaying it.
* The pure pieces (:class:`Inspector`, :class:`RuleSet`, :func:`normalise_target`,
  :class:`StreamScanner`, …) can be used and tested without any I/O.
"""

from stockade.egress.inspect._ca import CertificateAuthority as CertificateAuthority
from stockade.egress.inspect._ca import Leaf as Leaf
from stockade.egress.inspect._ca import load_ca as load_ca
from stockade.egress.inspect._ca import system_roots_path as system_roots_path
from stockade.egress.inspect._ca import trust_environment as trust_environment
from stockade.egress.inspect._ca import user_ca_dir as user_ca_dir
from stockade.egress.inspect._ca import write_trust_bundle as write_trust_bundle
from stockade.egress.inspect._http import Refusal as Refusal
from stockade.egress.inspect._http import Target as Target
from stockade.egress.inspect._http import normalise_target as normalise_target
from stockade.egress.inspect._inspector import Inspector as Inspector
from stockade.egress.inspect._inspector import RequestPlan as RequestPlan
from stockade.egress.inspect._inspector import RequestRecord as RequestRecord
from stockade.egress.inspect._rules import RuleSet as RuleSet
from stockade.egress.inspect._secrets import Pattern as Pattern
from stockade.egress.inspect._secrets import PatternSet as PatternSet
from stockade.egress.inspect._secrets import SecretStore as SecretStore
from stockade.egress.inspect._secrets import StreamReplacer as StreamReplacer
from stockade.egress.inspect._secrets import StreamScanner as StreamScanner
from stockade.egress.inspect._secrets import base64_cores as base64_cores
from stockade.egress.inspect._secrets import encodings as encodings
from stockade.egress.inspect._secrets import label_patterns as label_patterns
from stockade.egress.inspect._secrets import value_tokens as value_tokens
from stockade.egress.inspect._secrets import with_encodings as with_encodings
from stockade.egress.inspect._tls import ServerContexts as ServerContexts
from stockade.egress.inspect._tls import TLSStream as TLSStream
from stockade.egress.inspect._tls import UpstreamPool as UpstreamPool
from stockade.egress.inspect._tls import upstream_context as upstream_context
from stockade.egress.inspect._tunnel import PINNING_MESSAGE as PINNING_MESSAGE
from stockade.egress.inspect._tunnel import InspectingTunnel as InspectingTunnel
from stockade.egress.inspect._tunnel import InspectLayer as InspectLayer
from stockade.egress.inspect._tunnel import TunnelStats as TunnelStats

__all__ = [
    "PINNING_MESSAGE",
    "CertificateAuthority",
    "InspectLayer",
    "InspectingTunnel",
    "Inspector",
    "Leaf",
    "Pattern",
    "PatternSet",
    "Refusal",
    "RequestPlan",
    "RequestRecord",
    "RuleSet",
    "SecretStore",
    "ServerContexts",
    "StreamReplacer",
    "StreamScanner",
    "TLSStream",
    "Target",
    "TunnelStats",
    "UpstreamPool",
    "base64_cores",
    "encodings",
    "label_patterns",
    "load_ca",
    "normalise_target",
    "system_roots_path",
    "trust_environment",
    "upstream_context",
    "user_ca_dir",
    "value_tokens",
    "with_encodings",
    "write_trust_bundle",
]
