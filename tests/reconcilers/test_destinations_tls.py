"""HTTPS to the checked address: the probe connects to the address it resolved, and TLS
still checks the certificate against the URL's host name (sent as SNI)."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from durability.models import Effect
from durability.reconcilers.base import reconciler_for

NAME = "provider.example"


def _certificate(tmp: Path) -> tuple[Path, Path]:
    """A self-signed certificate for NAME (its own CA), and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAME)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(NAME)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
def provider(tmp_path, settings, monkeypatch) -> Iterator[tuple[int, list[str]]]:
    """An HTTPS server on 127.0.0.1 with a certificate for NAME, which resolves there; the
    probe trusts the certificate. Yields its port and the SNI names it was reached by."""
    settings.TALLYBOOK_RECONCILER_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    cert, key = _certificate(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    real = socket.getaddrinfo

    def resolving(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1" if host == NAME else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolving)
    names: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"id": "re_1"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    def heard(sock: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        names.append(name or "")

    context.sni_callback = heard
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    try:
        yield server.server_address[1], names
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def effect() -> Effect:
    return Effect(key="refund:1", kind="refund", target="stripe", request={}, attempt_count=1)


def test_https_reaches_the_checked_address_under_the_hosts_name(provider):
    port, names = provider
    config = {"url": f"https://{NAME}:{port}/refunds/{{key}}", "external_id_path": "id"}
    answer = reconciler_for("http", config).probe(effect())
    assert answer.answer == "found", answer
    assert names == [NAME]


def test_https_refuses_a_certificate_for_another_name(provider):
    port, _ = provider
    # The same server, by its address: its certificate names NAME, not 127.0.0.1.
    config = {"url": f"https://127.0.0.1:{port}/refunds/{{key}}", "external_id_path": "id"}
    answer = reconciler_for("http", config).probe(effect())
    assert answer.answer == "unknown" and "certificate" in answer.detail.lower()
