"""SAS verification in the emulator (the same rules the service applies)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from collections.abc import Callable
from urllib.parse import quote_plus, urlencode

import pytest

from georep.adapters.emulator._server import NamespaceServer, NamespaceSpec

KEY = base64.b64encode(b"k" * 32).decode()


def token(
    audience: str,
    key: str = KEY,
    key_name: str = "RootManageSharedAccessKey",
    expiry: float | None = None,
) -> str:
    se = str(int(expiry if expiry is not None else time.time() + 600))
    sig = base64.b64encode(
        hmac.new(key.encode(), f"{quote_plus(audience)}\n{se}".encode(), hashlib.sha256).digest()
    )
    return "SharedAccessSignature " + urlencode(
        {"sr": audience, "sig": sig.decode(), "se": se, "skn": key_name}
    )


@pytest.fixture
def server() -> NamespaceServer:
    ns = NamespaceServer(
        NamespaceSpec(name="p", port=5999, key=KEY), ssl_context=None, admin_handler=None
    )
    return ns


def test_valid_token_returns_its_expiry(server: NamespaceServer) -> None:
    expiry = time.time() + 300
    assert server.verify_sas(token("sb://127.0.0.1:5999/q", expiry=expiry)) == int(expiry)


# Tokens are minted when the test runs, not at collection: a long suite would otherwise
# find the "valid" ones expired.
@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            lambda: token("sb://127.0.0.1:5999/q", key=base64.b64encode(b"other").decode()),
            "does not match",
        ),
        (lambda: token("sb://127.0.0.1:5999/q", key_name="Other"), "Unknown SAS key name"),
        (lambda: token("sb://127.0.0.1:5999/q", expiry=time.time() - 1), "expired"),
        (lambda: token("sb://127.0.0.1:6000/q"), "not this namespace"),
        (lambda: "Bearer abc", "not a SharedAccessSignature"),
        (lambda: "SharedAccessSignature sr=x", "lacks"),
    ],
)
def test_bad_tokens_are_refused_with_a_reason_and_no_secret(
    server: NamespaceServer, bad: Callable[[], str], message: str
) -> None:
    with pytest.raises(PermissionError, match=message) as info:
        server.verify_sas(bad())
    assert KEY not in str(info.value)


def _signed(sr_text: str, key: str = KEY) -> str:
    """A token carrying ``sr_text`` as is, signed over that very text (how every signer
    does it: the SDK and .NET encode first, the AzureSasCredential samples do not)."""
    se = str(int(time.time() + 600))
    digest = hmac.new(key.encode(), f"{sr_text}\n{se}".encode(), hashlib.sha256).digest()
    sig = quote_plus(base64.b64encode(digest).decode())
    return f"SharedAccessSignature sr={sr_text}&sig={sig}&se={se}&skn=RootManageSharedAccessKey"


RESOURCE = "sb://127.0.0.1:5999/orders"


@pytest.mark.parametrize(
    "sr_text",
    [
        quote_plus(RESOURCE),  # the SDK: sb%3A%2F%2F127.0.0.1%3A5999%2Forders
        re.sub("%[0-9A-F]{2}", lambda m: m.group().lower(), quote_plus(RESOURCE)),  # .NET
        RESOURCE,  # the AzureSasCredential samples: not encoded
    ],
    ids=["quote_plus", "lowercase-escapes", "unencoded"],
)
def test_signature_is_checked_over_sr_as_sent_and_scope_over_the_decoded_uri(
    server: NamespaceServer, sr_text: str
) -> None:
    granted = server.grant(_signed(sr_text))
    assert granted.scope == "orders"
    assert granted.covers("orders/$DeadLetterQueue")
    with pytest.raises(PermissionError, match="InvalidAudience"):
        server.verify_sas(_signed(sr_text), "sb://127.0.0.1:5999/other")


def test_a_signature_over_another_encoding_of_sr_is_refused(server: NamespaceServer) -> None:
    # Signed over the encoded URI but carrying it unencoded: not what was signed.
    se = str(int(time.time() + 600))
    digest = hmac.new(KEY.encode(), f"{quote_plus(RESOURCE)}\n{se}".encode(), hashlib.sha256)
    sig = quote_plus(base64.b64encode(digest.digest()).decode())
    forged = f"SharedAccessSignature sr={RESOURCE}&sig={sig}&se={se}&skn=RootManageSharedAccessKey"
    with pytest.raises(PermissionError, match="does not match"):
        server.grant(forged)


def test_an_unencoded_signature_keeps_its_plus_signs(server: NamespaceServer) -> None:
    se = str(int(time.time() + 600))
    for suffix in range(100):  # find an entity whose signature has a '+'
        text = quote_plus(f"{RESOURCE}{suffix}")
        digest = hmac.new(KEY.encode(), f"{text}\n{se}".encode(), hashlib.sha256).digest()
        sig = base64.b64encode(digest).decode()
        if "+" in sig:
            break
    assert "+" in sig
    raw = f"SharedAccessSignature sr={text}&sig={sig}&se={se}&skn=RootManageSharedAccessKey"
    assert server.grant(raw).scope == f"orders{suffix}"
