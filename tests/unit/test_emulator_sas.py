"""SAS verification in the emulator (the same rules the service applies)."""

from __future__ import annotations

import base64
import hashlib
import hmac
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
