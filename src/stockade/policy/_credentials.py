"""Which environment variable names look like credentials.

Used twice: the loader refuses such a name in ``env.pass`` unless the entry says
``allow_secret = true``, and the secrets layer reports the credential-like variables of
the caller that it kept out of the sandbox.
"""

from __future__ import annotations

import re

from stockade.policy._tables import TRUST_ENV_NAMES

# Substrings and shapes that mark a credential in the names real tools use
# (GH_TOKEN, NPM_TOKEN, AWS_SECRET_ACCESS_KEY, ANTHROPIC_API_KEY, DATABASE_URL, ...).
_CREDENTIAL = re.compile(
    r"TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|CREDENTIAL|PRIVATE|_KEY$|_KEYS$|^KEY$|APIKEY|API_KEY"
    r"|^AWS_|^AZURE_|^GOOGLE_APPLICATION_CREDENTIALS$|^GCP_|AUTH|COOKIE|SESSION"
    r"|^DATABASE_URL$|_DSN$|^SSH_AUTH_SOCK$|^GPG_AGENT_INFO$|^KUBECONFIG$|WEBHOOK",
    re.IGNORECASE,
)


def looks_like_credential(name: str) -> bool:
    """True when ``name`` looks like it holds a credential.

    >>> looks_like_credential("GH_TOKEN"), looks_like_credential("LANG")
    (True, False)
    """
    # Trust stores name public certificates (AWS_CA_BUNDLE matched ^AWS_).
    return name not in _TRUST and bool(_CREDENTIAL.search(name))


_TRUST = frozenset(TRUST_ENV_NAMES)
