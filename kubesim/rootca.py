"""The ``kube-root-ca.crt`` ConfigMap kube-controller-manager's root-ca-cert-publisher keeps in every namespace.

Each simulated cluster has its own self-signed CA certificate (ECDSA P-256, CN ``kubernetes``) made once
when the cluster starts; kubesim serves plain HTTP, so nothing verifies against it, but the ConfigMap is
there, shaped as on a real cluster, for workloads and tools that mount or read it.
"""

from __future__ import annotations

import datetime
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

NAME = "kube-root-ca.crt"
DESCRIPTION = ("Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints "
               "such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across "
               "distributions of Kubernetes clusters.")


def make_ca_pem() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def configmap(namespace: str, pem: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": NAME, "namespace": namespace,
                         "annotations": {"kubernetes.io/description": DESCRIPTION}},
            "data": {"ca.crt": pem}}
