"""Self-signed TLS material for the local emulator.

The Service Bus SDKs always talk HTTPS to the admin endpoint (and AMQPS by default), so the
emulator needs a certificate the client can verify. One self-signed certificate serves as both
the server certificate and the CA file a client passes as ``connection_verify``.
"""

from __future__ import annotations

__all__ = ["make_self_signed_certificate", "server_ssl_context"]

import datetime
import ipaddress
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_CERT_FILE = "emulator-cert.pem"
_KEY_FILE = "emulator-key.pem"
_VALIDITY = datetime.timedelta(days=365)
# Clients whose clock runs slightly behind the host must still accept the certificate.
_BACKDATE = datetime.timedelta(days=1)


def make_self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """Write a fresh self-signed certificate and its private key into ``directory``.

    The certificate is valid for ``DNS:localhost``, ``IP:127.0.0.1`` and ``IP:::1``. It is
    marked as a CA so that it can be used directly as the trust anchor (``connection_verify``
    / ``cafile``) by clients, including OpenSSL's strict verification mode.

    Args:
        directory: Where to write the files; created if missing. Existing files are replaced.

    Returns:
        ``(cert_pem_path, key_pem_path)``. The key file is readable by the owner only.
    """
    directory.mkdir(parents=True, exist_ok=True)
    # P-256 keeps generation instant, which matters because tests create a cert per session.
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "georep emulator")])
    now = datetime.datetime.now(datetime.UTC)
    public_key = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + _VALIDITY)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(public_key), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    cert_path = directory / _CERT_FILE
    key_path = directory / _KEY_FILE
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.touch(mode=0o600, exist_ok=True)
    key_path.chmod(0o600)  # touch() leaves the mode of an existing file alone
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def server_ssl_context(cert: Path, key: Path) -> ssl.SSLContext:
    """Build a server-side TLS context from the files made by :func:`make_self_signed_certificate`.

    Args:
        cert: PEM certificate path.
        key: PEM private key path.

    Returns:
        A context for ``aiohttp``/``asyncio`` servers; TLS 1.2 or newer, no client certificates.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile=cert, keyfile=key)
    return context
