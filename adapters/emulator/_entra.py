"""Microsoft Entra ID tokens for the emulator: a signing key, a test credential, verification.

Azure Service Bus takes an Entra ID access token (a JWT, audience
``https://servicebus.azure.net``) wherever it takes a SAS token: put on ``$cbs`` with type
``jwt`` by the AMQP client, or as ``Authorization: Bearer`` by the admin client. What the
caller may do comes from its Azure RBAC role on the namespace: *Azure Service Bus Data
Owner* (everything), *Data Sender* (send), *Data Receiver* (receive).

The emulator cannot reach Entra ID, so it is its own issuer: it writes an ECDSA P-256 key to
its state directory at start, and :class:`EmulatorTokenCredential` (sync) and
:class:`AsyncEmulatorTokenCredential` (async) sign ES256 tokens with it, carrying the role
in the ``roles`` claim (Entra's app-role claim; Azure looks role assignments up instead).
The emulator checks the signature, ``exp``/``nbf`` and the audience, as the service does.
"""

from __future__ import annotations

__all__ = [
    "AUDIENCE",
    "ROLES",
    "AsyncEmulatorTokenCredential",
    "EmulatorTokenCredential",
    "make_signing_key",
    "verify_token",
]

import base64
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from azure.core.credentials import AccessToken
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import (
    decode_dss_signature,
    encode_dss_signature,
)

from ._sas import LISTEN, MANAGE, SEND

AUDIENCE = "https://servicebus.azure.net"
ISSUER = "https://georep-emulator.invalid/"
KEY_FILE = "entra-signing-key.pem"
# The built-in Azure roles for Service Bus data, and the claims each grants.
ROLES: dict[str, frozenset[str]] = {
    "Azure Service Bus Data Owner": frozenset({MANAGE, SEND, LISTEN}),
    "Azure Service Bus Data Sender": frozenset({SEND}),
    "Azure Service Bus Data Receiver": frozenset({LISTEN}),
}
_SHORT = {"owner": "Azure Service Bus Data Owner", "sender": "Azure Service Bus Data Sender",
          "receiver": "Azure Service Bus Data Receiver"}  # fmt: skip
_HEADER = {"alg": "ES256", "typ": "JWT", "kid": "georep-emulator"}
_CLOCK_SKEW = 300  # seconds of nbf/exp leeway, as Entra ID allows


def make_signing_key(directory: Path) -> Path:
    """Write a fresh P-256 private key (mode 0600) into ``directory``; return its path."""
    key = ec.generate_private_key(ec.SECP256R1())
    path = directory / KEY_FILE
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return path


def load_signing_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path} does not hold an EC private key")
    return key


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def mint_token(
    key: ec.EllipticCurvePrivateKey,
    *,
    role: str,
    lifetime: float = 3600.0,
    audience: str = AUDIENCE,
    now: float | None = None,
) -> AccessToken:
    """A signed token for ``role`` (a role name from :data:`ROLES`, or owner/sender/receiver)."""
    role = _SHORT.get(role, role)
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {sorted(_SHORT)} or {sorted(ROLES)}")
    issued = int(time.time() if now is None else now)
    expires = int(issued + lifetime)
    claims = {
        "aud": audience,
        "iss": ISSUER,
        "iat": issued,
        "nbf": issued,
        "exp": expires,
        "oid": str(uuid.uuid4()),
        "roles": [role],
    }
    signing_input = f"{_b64(json.dumps(_HEADER).encode())}.{_b64(json.dumps(claims).encode())}"
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    # An expired token is reported valid for an hour, as a client with a skewed clock
    # would believe it: the SDK then presents it, and the service refuses it.
    reported = expires if lifetime > 0 else issued + 3600
    return AccessToken(f"{signing_input}.{_b64(signature)}", reported)


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and not token.startswith("SharedAccessSignature")


def verify_token(
    token: str, public_key: ec.EllipticCurvePublicKey, *, now: float | None = None
) -> tuple[frozenset[str], float, str]:
    """Check an emulator-issued token; return its claims' rights, expiry and role.

    Raises:
        PermissionError: malformed, not signed by this emulator, expired or not yet valid,
            for another audience, or without a Service Bus data role.
    """
    try:
        header_b64, claims_b64, signature_b64 = token.split(".")
        header = json.loads(_unb64(header_b64))
        claims: dict[str, Any] = json.loads(_unb64(claims_b64))
        signature = _unb64(signature_b64)
    except ValueError:
        raise PermissionError("MalformedToken: the token is not a JWT.") from None
    if header.get("alg") != "ES256" or len(signature) != 64:
        raise PermissionError("InvalidSignature: the token was not issued by this emulator.")
    der = encode_dss_signature(
        int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
    )
    try:
        public_key.verify(der, f"{header_b64}.{claims_b64}".encode(), ec.ECDSA(hashes.SHA256()))
    except Exception:
        raise PermissionError(
            "InvalidSignature: the token was not issued by this emulator."
        ) from None
    moment = time.time() if now is None else now
    if float(claims.get("exp", 0)) + _CLOCK_SKEW <= moment:
        raise PermissionError("ExpiredToken: the token has expired.")
    if float(claims.get("nbf", 0)) - _CLOCK_SKEW > moment:
        raise PermissionError("InvalidToken: the token is not valid yet (nbf).")
    audience = str(claims.get("aud", "")).rstrip("/")
    if audience != AUDIENCE:
        raise PermissionError(f"InvalidAudience: the token is for '{audience}', not '{AUDIENCE}'.")
    roles = [r for r in claims.get("roles", []) if r in ROLES]
    if not roles:
        raise PermissionError(
            "Unauthorized: the principal has no Azure Service Bus data role on this namespace."
        )
    rights = frozenset().union(*(ROLES[r] for r in roles))
    return rights, float(claims["exp"]), roles[0]


class EmulatorTokenCredential:
    """A sync ``TokenCredential`` whose tokens the emulator accepts, as Entra ID's would be.

    Args:
        key_file: The emulator's signing key (``Emulator.entra_key_file``).
        role: ``"owner"``, ``"sender"``, ``"receiver"`` or a full role name.
        lifetime: Seconds each token is valid. Negative makes tokens that expired that long
            ago but that the credential reports valid (a skewed clock), so the SDK presents
            them and the emulator refuses them.
        audience: The token's audience (another one makes the emulator refuse it).
    """

    def __init__(
        self, key_file: Path, *, role: str = "owner", lifetime: float = 3600.0,
        audience: str = AUDIENCE,
    ) -> None:  # fmt: skip
        self._key = load_signing_key(Path(key_file))
        self._role, self._lifetime, self._audience = role, lifetime, audience
        mint_token(self._key, role=role)  # an unknown role fails here, not at connect

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return mint_token(
            self._key, role=self._role, lifetime=self._lifetime, audience=self._audience
        )

    def close(self) -> None:
        return None

    def __enter__(self) -> EmulatorTokenCredential:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __repr__(self) -> str:  # never show the key
        return f"{type(self).__name__}(role={self._role!r})"


class AsyncEmulatorTokenCredential(EmulatorTokenCredential):
    """The ``AsyncTokenCredential`` form of :class:`EmulatorTokenCredential`."""

    async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:  # type: ignore[override]
        return super().get_token(*scopes, **kwargs)

    async def close(self) -> None:  # type: ignore[override]
        return None

    async def __aenter__(self) -> AsyncEmulatorTokenCredential:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None
