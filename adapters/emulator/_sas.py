"""Shared access signatures as the service checks them: signature, expiry, scope, claims.

A token is ``SharedAccessSignature sr=<resource URI>&sig=<HMAC>&se=<expiry>&skn=<rule>``,
signed with the key of the authorization rule ``skn``. The service then checks:

- the scope: the token covers the entity its ``sr`` names and every entity below it, by
  path segment (``sb://ns/orders`` covers ``orders`` and ``orders/subscriptions/s1``, not
  ``orders2``; ``sb://ns/`` covers the whole namespace). Azure documents this as "a SAS
  token is valid for all resources prefixed with the resource URI"; the emulator reads the
  prefix by whole path segments, the stricter reading, so a token scoped to ``ord`` does
  not open ``orders``.
- the claims of the rule: ``Send`` to send and schedule, ``Listen`` to receive, peek,
  settle and renew locks (and to listen on a relay hybrid connection), ``Manage`` for the
  management API (``Manage`` implies ``Send`` and ``Listen``, as in Azure).
"""

from __future__ import annotations

__all__ = ["LISTEN", "MANAGE", "SEND", "SasGrant", "SasRule", "covers", "resource_path"]

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass
from urllib.parse import unquote, unquote_plus, urlsplit

MANAGE = "Manage"
SEND = "Send"
LISTEN = "Listen"
_ALL = frozenset({MANAGE, SEND, LISTEN})


@dataclass(frozen=True)
class SasRule:
    """A shared access authorization rule: a name, a key and its claims."""

    name: str
    key: str
    rights: frozenset[str]

    def __post_init__(self) -> None:
        unknown = self.rights - _ALL
        if unknown or not self.rights:
            raise ValueError(f"rights are a non-empty subset of {sorted(_ALL)}, got {unknown}")
        if MANAGE in self.rights and self.rights != _ALL:
            # Azure refuses a Manage rule without Send and Listen.
            raise ValueError("a Manage rule also has Send and Listen")

    def __repr__(self) -> str:  # never show the key
        return f"SasRule(name={self.name!r}, rights={sorted(self.rights)})"


@dataclass(frozen=True)
class SasGrant:
    """What a verified token allows: its scope (an entity path, '' = namespace), claims."""

    scope: str
    rights: frozenset[str]
    expiry: float
    rule: str

    def covers(self, path: str) -> bool:
        """The token's scope includes ``path``."""
        return covers(self.scope, path)

    def require(self, path: str) -> None:
        """Raise unless the token's scope includes ``path`` (the service's InvalidAudience).

        Raises:
            PermissionError: The scope does not cover ``path``.
        """
        if not self.covers(path):
            raise PermissionError(
                f"InvalidAudience: the token is scoped to '{self.scope or '/'}', which does "
                f"not cover '{path or '/'}'."
            )

    def allows(self, path: str, right: str) -> bool:
        """The token covers ``path``, is not expired and its rule has ``right``."""
        return right in self.rights and self.expiry > time.time() and self.covers(path)


def covers(scope: str, path: str) -> bool:
    """``scope`` (an entity path, '' = namespace) covers ``path``, by whole segments."""
    scope, path = scope.strip("/").lower(), path.strip("/").lower()
    return scope == "" or path == scope or path.startswith(scope + "/")


def resource_path(resource: str) -> str:
    """The entity path a token's ``sr`` names: ``sb://host:port/a/b`` -> ``a/b``."""
    text = resource if "://" in resource else f"sb://{resource}"
    return urlsplit(text).path.strip("/")


def loopback_hosts(port: int) -> set[str]:
    """The ``Host`` values that name this machine's ``port`` (the emulator binds loopback)."""
    return {f"127.0.0.1:{port}", f"localhost:{port}"}


def resource_host(resource: str) -> str:
    """The host (and port) a token's ``sr`` names, lower case."""
    text = resource if "://" in resource else f"sb://{resource}"
    return urlsplit(text).netloc.lower()


def verify(token: str, rules: dict[str, SasRule], namespace: str) -> tuple[SasRule, str, float]:
    """Check a token's form, rule, signature and expiry; return (rule, resource, expiry).

    The signer signs ``<sr>\n<se>`` where ``<sr>`` is the resource text exactly as it puts
    it in the token: the SDK and .NET URL-encode the URI first (``quote_plus``, or .NET's
    lowercase ``%2f`` escapes), the ``AzureSasCredential`` samples do not encode it at all.
    So the signature is checked over the ``sr`` text as it appears in the token, and only
    the returned resource (for the scope check) is URL-decoded.

    Raises:
        PermissionError: Malformed, unknown rule, bad signature, or expired. The message
            never contains the token or a key.
    """
    prefix = "SharedAccessSignature "
    if not token.startswith(prefix):
        raise PermissionError("The token is not a SharedAccessSignature.")
    fields: dict[str, str] = {}
    for part in token[len(prefix) :].split("&"):
        name, _, value = part.partition("=")
        fields.setdefault(unquote_plus(name), value)
    try:
        resource_text, signature, expiry_text, key_name = (
            fields["sr"],
            # unquote, not unquote_plus: a signature left unencoded keeps its '+'.
            unquote(fields["sig"]),
            unquote_plus(fields["se"]),
            unquote_plus(fields["skn"]),
        )
        expiry = float(expiry_text)
    except (KeyError, ValueError):
        raise PermissionError("The SAS token lacks sr, sig, se or skn.") from None
    rule = rules.get(key_name)
    if rule is None:
        raise PermissionError(f"Unknown SAS key name '{key_name}' for namespace '{namespace}'.")
    to_sign = f"{resource_text}\n{expiry_text}".encode()
    expected = base64.b64encode(hmac.new(rule.key.encode(), to_sign, hashlib.sha256).digest())
    if not hmac.compare_digest(expected, signature.encode()):
        raise PermissionError(
            f"The SAS signature does not match namespace '{namespace}': "
            "check the key in the connection string, and sign the sr value exactly as "
            "the token carries it."
        )
    if expiry <= time.time():
        raise PermissionError("The SAS token has expired: mint a new one.")
    return rule, unquote_plus(resource_text), expiry
