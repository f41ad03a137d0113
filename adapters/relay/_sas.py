"""Shared Access Signature tokens, minted locally from a key (SPEC §2.6), and addresses."""

from __future__ import annotations

__all__ = ["HybridConnection", "SasTokenProvider", "mint_sas_token"]

import base64
import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote, quote_plus

from georep.exceptions import ConfigurationError


def mint_sas_token(resource: str, key_name: str, key: str, expires_at: float) -> str:
    """A ``SharedAccessSignature`` token for ``resource``, valid until ``expires_at``.

    The signature is HMAC-SHA256 over ``quote_plus(resource) + "\\n" + expiry`` with the
    key's UTF-8 bytes, as Azure Service Bus and Relay verify it.

    Args:
        resource: The audience, e.g. ``http://contoso.servicebus.windows.net/svc``.
        key_name: The shared access policy name (``skn``).
        key: The policy's key. It is never logged or included in errors.
        expires_at: Expiry, in seconds since the Unix epoch.
    """
    expiry = str(int(expires_at))
    encoded = quote_plus(resource)
    signature = base64.b64encode(
        hmac.new(key.encode(), f"{encoded}\n{expiry}".encode(), hashlib.sha256).digest()
    ).decode()
    return (
        f"SharedAccessSignature sr={encoded}&sig={quote_plus(signature)}"
        f"&se={expiry}&skn={quote_plus(key_name)}"
    )


@dataclass(frozen=True, kw_only=True)
class HybridConnection:
    """Where a hybrid connection lives and the key to reach it.

    Attributes:
        namespace: Host (and port) of the Relay namespace, e.g.
            ``contoso.servicebus.windows.net`` (the emulator: ``127.0.0.1:PORT``).
        path: The hybrid connection's name (``myPrimaryService``).
        key_name: Shared access policy name (``RootManageSharedAccessKey``).
        key: The policy's key; hidden from ``repr``.
        region: Label used in results, errors and telemetry; default the namespace.
    """

    namespace: str
    path: str
    key_name: str
    key: str = field(repr=False)
    region: str = ""

    def __post_init__(self) -> None:
        if not self.namespace or "/" in self.namespace:
            raise ConfigurationError(
                f"namespace {self.namespace!r} must be a host name such as "
                "'contoso.servicebus.windows.net' (no scheme, no path)"
            )
        path = self.path.strip("/")
        if not path:
            raise ConfigurationError("a hybrid connection needs a path (its name)")
        object.__setattr__(self, "path", path)
        if not self.key_name or not self.key:
            raise ConfigurationError(
                f"hybrid connection {self.namespace}/{path} needs key_name and key "
                "(a shared access policy with Send or Listen rights)"
            )
        if not self.region:
            object.__setattr__(self, "region", self.namespace)

    @property
    def audience(self) -> str:
        """The token audience: ``http://{namespace}/{path}``."""
        return f"http://{self.namespace}/{self.path}"

    def websocket_url(self, action: str, **query: str) -> str:
        """``wss://{namespace}/$hc/{path}?sb-hc-action=...`` (no token)."""
        extra = "".join(f"&{name}={quote(value, safe='')}" for name, value in query.items())
        return f"wss://{self.namespace}/$hc/{quote(self.path)}?sb-hc-action={action}{extra}"

    @property
    def https_url(self) -> str:
        """``https://{namespace}/{path}``, the HTTP-mode address."""
        return f"https://{self.namespace}/{quote(self.path)}"


class SasTokenProvider:
    """Mints SAS tokens for one audience and reuses each until shortly before it expires.

    Args:
        key_name: Shared access policy name.
        key: The policy's key (never logged).
        ttl: Lifetime of each token in seconds. Default 3600.
        renew_before: A new token is minted once the current one has less than this many
            seconds left. Default: a fifth of ``ttl``, at most 300.
        time_source: Wall clock (seconds since the epoch); tests inject their own.
    """

    def __init__(
        self,
        key_name: str,
        key: str,
        *,
        ttl: float = 3600.0,
        renew_before: float | None = None,
        time_source: Callable[[], float] = time.time,
    ) -> None:
        if ttl < 1:
            raise ConfigurationError(f"token ttl must be at least 1 second, got {ttl!r}")
        self._key_name = key_name
        self._key = key
        self.ttl = float(ttl)
        self.renew_before = min(300.0, ttl / 5) if renew_before is None else float(renew_before)
        if not 0 <= self.renew_before < self.ttl:
            raise ConfigurationError("renew_before must be at least 0 and less than ttl")
        self._time = time_source
        self._cache: dict[str, tuple[str, float]] = {}

    def __repr__(self) -> str:  # never show the key
        return f"SasTokenProvider(key_name={self._key_name!r}, ttl={self.ttl:g})"

    def token(self, audience: str) -> tuple[str, float]:
        """A valid token for ``audience`` and its expiry (epoch seconds)."""
        cached = self._cache.get(audience)
        now = self._time()
        if cached is not None and cached[1] - now > self.renew_before:
            return cached
        expires_at = float(int(now + self.ttl))
        minted = (mint_sas_token(audience, self._key_name, self._key, expires_at), expires_at)
        self._cache[audience] = minted
        return minted

    def renew_at(self, expires_at: float) -> float:
        """When a token expiring at ``expires_at`` should be replaced (epoch seconds)."""
        return expires_at - self.renew_before
