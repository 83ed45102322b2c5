"""Helpers for scenario tests that drive kubesim (or a real cluster) through the official client: bodies,
bounded polling for asynchronous controllers, Status bodies out of ApiException, and certificates for
admission webhooks that kubesim (or a real API server) calls over HTTPS."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kubernetes import client

T = TypeVar("T")


def pod_body(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "command": ["true"]}],
                     "restartPolicy": "Never", **spec}}


def eventually(fn: Callable[[], T | None], timeout: float = 10.0, what: str = "condition") -> T:
    """Poll ``fn`` until it returns something truthy; real controllers (GC, namespaces) act asynchronously."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        out = fn()
        if out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last value: {out!r}")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def gone(read: Callable[[], Any]) -> Callable[[], bool]:
    def check() -> bool:
        try:
            read()
        except client.ApiException as e:
            return bool(e.status == 404)
        return False
    return check


def status_of(e: client.ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(e.body or "{}")
    return body


@dataclass(frozen=True)
class WebhookPKI:
    """A throw-away CA and a server certificate signed by it (PEM bytes); ``ca_bundle`` is what a
    webhook configuration's ``clientConfig.caBundle`` takes."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca_pem).decode()


def webhook_pki(dns_names: list[str], ips: tuple[str, ...] = ("127.0.0.1",), days: int = 1) -> WebhookPKI:
    """A server certificate for ``dns_names`` (e.g. ``["mkd-webhook.mkd-system.svc"]``, the name a service
    reference is verified against) and ``ips``, valid for ``days``, with its CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("kubesim-webhook-ca")).issuer_name(name("kubesim-webhook-ca"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (x509.CertificateBuilder().subject_name(name(dns_names[0] if dns_names else ips[0]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return WebhookPKI(ca.public_bytes(pem), cert.public_bytes(pem),
                      key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
