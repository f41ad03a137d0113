"""The relay adapter's offline parts: SAS minting and renewal, addresses, error kinds."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosedError
from websockets.frames import Close

from georep import ConfigurationError, ErrorKind
from georep.adapters.emulator._server import NamespaceServer, NamespaceSpec
from georep.adapters.relay import (
    HybridConnection,
    HybridConnectionListener,
    SasTokenProvider,
    _listener,
    mint_sas_token,
)
from georep.adapters.relay._errors import closed_error, http_status_kind, is_relay_refusal
from georep.testing import settle

KEY = base64.b64encode(b"k" * 32).decode()
KEY_NAME = "RootManageSharedAccessKey"


def hybrid_connection(**overrides: str) -> HybridConnection:
    values = {
        "namespace": "127.0.0.1:6001",
        "path": "svc",
        "key_name": KEY_NAME,
        "key": KEY,
        "region": "primary",
    }
    values.update(overrides)
    return HybridConnection(**values)


def test_minted_token_is_accepted_by_the_emulators_verifier() -> None:
    server = NamespaceServer(
        NamespaceSpec(name="p", port=5999, key=KEY), ssl_context=None, admin_handler=None
    )
    hc = hybrid_connection()
    now = 1_900_000_000.0
    token = mint_sas_token(hc.audience, KEY_NAME, KEY, now)
    assert token.startswith("SharedAccessSignature sr=http%3A%2F%2F127.0.0.1%3A6001%2Fsvc&sig=")
    assert server.verify_sas(token, port=6001) == now
    with pytest.raises(PermissionError, match="signature"):
        server.verify_sas(mint_sas_token(hc.audience, KEY_NAME, "b3RoZXI=", now), port=6001)
    with pytest.raises(PermissionError, match="expired"):
        server.verify_sas(mint_sas_token(hc.audience, KEY_NAME, KEY, 1000.0), port=6001)


def test_token_provider_reuses_a_token_then_renews_it_before_expiry() -> None:
    now = [1_000.0]
    tokens = SasTokenProvider(KEY_NAME, KEY, ttl=100, renew_before=20, time_source=lambda: now[0])
    first, expires = tokens.token("http://ns/svc")
    assert expires == 1_100.0
    now[0] = 1_079.0
    assert tokens.token("http://ns/svc") == (first, expires)
    now[0] = 1_081.0
    renewed, renewed_expiry = tokens.token("http://ns/svc")
    assert renewed != first and renewed_expiry == 1_181.0
    assert tokens.renew_at(renewed_expiry) == 1_161.0
    assert KEY not in repr(tokens)


def test_hybrid_connection_addresses_and_hidden_key() -> None:
    hc = hybrid_connection(path="/svc/")
    assert hc.path == "svc"
    assert hc.https_url == "https://127.0.0.1:6001/svc"
    assert hc.websocket_url("listen", **{"sb-hc-id": "a b"}) == (
        "wss://127.0.0.1:6001/$hc/svc?sb-hc-action=listen&sb-hc-id=a%20b"
    )
    assert KEY not in repr(hc)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"namespace": "https://ns.servicebus.windows.net"}, "host name"),
        ({"path": "/"}, "needs a path"),
        ({"key": ""}, "key_name and key"),
    ],
)
def test_hybrid_connection_refuses_bad_settings(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        hybrid_connection(**overrides)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (401, ErrorKind.AUTHENTICATION),
        (403, ErrorKind.AUTHENTICATION),
        (404, ErrorKind.ENTITY_NOT_FOUND),
        (500, ErrorKind.SERVICE_ERROR),
        (503, ErrorKind.SERVICE_ERROR),
        (400, ErrorKind.UNKNOWN),
    ],
)
def test_handshake_statuses_map_to_kinds(status: int, kind: ErrorKind) -> None:
    assert http_status_kind(status) == kind


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (1001, ErrorKind.CONNECTION),
        (1008, ErrorKind.AUTHENTICATION),
        (1011, ErrorKind.SERVICE_ERROR),
        (1006, ErrorKind.CONNECTION),
    ],
)
def test_close_codes_are_unavailability(code: int, kind: ErrorKind) -> None:
    error = closed_error("primary", ConnectionClosedError(Close(code, "bye"), None))
    assert error.kind == kind
    assert str(code) in str(error)


def test_relay_refusals_are_told_from_listener_answers_by_the_via_header() -> None:
    # The relay adds Via to every answer it forwards from a listener.
    assert is_relay_refusal(503, {"Content-Type": "text/plain"})
    assert is_relay_refusal(401, {})
    assert not is_relay_refusal(404, {"Via": "1.1 contoso.servicebus.windows.net"})
    assert not is_relay_refusal(200, {})


async def test_closing_the_listener_is_bounded_by_a_handler_that_swallows_cancellation(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """aclose() cancelled its tasks and gathered them without a bound: one handler that
    swallows cancellation hung the listener's close for ever."""
    monkeypatch.setattr(_listener, "_STOP_SECONDS", 0.0, raising=False)  # no real waiting
    let_go = asyncio.Event()

    async def stubborn() -> None:
        while not let_go.is_set():
            try:
                await let_go.wait()
            except asyncio.CancelledError:
                continue

    async def handler(request: Any) -> Any:
        raise AssertionError("not called")

    listener = HybridConnectionListener([hybrid_connection()], handler)
    listener._spawn(stubborn())  # a handler's answer, never ending
    await settle()
    closing = asyncio.ensure_future(listener.aclose())
    await settle()
    assert closing.done()
    assert "did not end within" in caplog.text
    let_go.set()
    await settle()
