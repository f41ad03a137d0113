"""The clients georep opens share one TLS context per CA bundle (issue 30): the SDK would
otherwise load the bundle on every connection attempt. No network: a client connects only
when first used."""

from __future__ import annotations

import ssl
from pathlib import Path

import certifi

from georep.adapters.servicebus._sender import open_client, shared_ssl_context

CONN = "Endpoint=sb://east.example/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0"


def _context(**options: object) -> object:
    client = open_client(
        CONN, region="primary", retry_total=1, retry_backoff_factor=0.01, **options
    )
    return client._ssl_context


def test_clients_share_one_context_that_verifies_like_the_sdks() -> None:
    first, second = _context(), _context()

    assert first is second is shared_ssl_context(certifi.where())
    assert isinstance(first, ssl.SSLContext)
    assert first.verify_mode is ssl.CERT_REQUIRED and first.check_hostname
    assert first.cert_store_stats()["x509_ca"] > 0


def test_a_ca_file_given_as_connection_verify_is_the_one_loaded(tmp_path: Path) -> None:
    own_bundle = tmp_path / "ca.pem"
    own_bundle.write_text(Path(certifi.where()).read_text())
    context = _context(connection_verify=str(own_bundle))

    assert context is shared_ssl_context(str(own_bundle))
    assert context is not shared_ssl_context(certifi.where())


def test_a_callers_context_is_kept() -> None:
    own = ssl.create_default_context()

    assert _context(ssl_context=own) is own
