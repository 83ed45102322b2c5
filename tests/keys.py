"""Key pairs for the tests: one per name, made once per test process (every message is signed).

``DISPATCHER`` is the dispatcher's; cluster names are their agents'. The dispatcher harness trusts
``worker-1`` .. ``worker-9`` through ``cluster_public_keys``; a test that wants an unknown cluster
uses another name.
"""

from __future__ import annotations

import functools
import itertools
import uuid

from federation import messages, sealing, signing

DISPATCHER = "mkd-dispatcher"
KNOWN_CLUSTERS = tuple(f"worker-{i}" for i in range(1, 10))


@functools.cache
def pair(name: str) -> tuple[str, str]:
    return signing.generate()


def private(name: str) -> str:
    return pair(name)[0]


def public(name: str) -> str:
    return pair(name)[1]


def cluster_keys() -> dict[str, str]:
    return {name: public(name) for name in KNOWN_CLUSTERS}


class Signer:
    """Seals messages as ``name`` would: its own key, a stream of its own, numbers from 1."""

    def __init__(self, name: str, stream: str | None = None) -> None:
        self.sealer = signing.Sealer(signing.parse_private_key(private(name)))
        self.stream = stream or uuid.uuid4().hex[:16]
        self._n = itertools.count(1)

    def seal(self, topic: str, body: bytes) -> bytes:
        return self.sealer.seal(topic, body, stream=self.stream, n=next(self._n))


def unseal(payload: bytes, topic: str) -> bytes:
    """The message's own bytes (tests that read what a signed side sent, after the side checked it); a
    sealed Place decrypted with the key of the cluster whose ``topic`` it came on."""
    tail = payload.rfind(b',"seal":')
    body = payload[:tail] + b"}" if tail >= 0 else payload
    if not sealing.is_sealed(body):
        return body
    cluster = topic.rsplit("/", 2)[-2]
    return opener(cluster).open(topic, body)


def unseal_all(payload: bytes, topic: str) -> list[bytes]:
    """The Commands in one message (one, or a batch's items: ``messages.split_commands``), each as
    ``unseal`` gives it: sealed Places decrypted with the key of the cluster of ``topic``."""
    tail = payload.rfind(b',"seal":')
    body = payload[:tail] + b"}" if tail >= 0 else payload
    cluster = topic.rsplit("/", 2)[-2]
    return [opener(cluster).open(topic, item) if sealing.is_sealed(item) else item
            for item in messages.split_commands(body)]


@functools.cache
def opener(name: str) -> sealing.PlaceOpener:
    """Decrypts the Places sealed to ``name``'s key, as its agent does."""
    return sealing.PlaceOpener(signing.parse_private_key(private(name)))
