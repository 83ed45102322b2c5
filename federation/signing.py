"""Identity on the wire: every Command and every Report is sealed with its sender's Ed25519 key.

:class:`Opener` checks a seal: a key the receiver trusts, a valid signature, a time within ``max_age_seconds``
of the receiver's clock (either way), and a (key, stream, n) not seen before inside that window (a replay, or
a QoS 1 duplicate, which carries nothing new). Every refusal names its reason (``unsigned``, ``malformed``,
``unknown_key``, ``bad_signature``, ``expired``, ``replay``) and is counted in
``mkd_messages_refused_total{reason}``. Keys are text: a private key is the base64 of its 32 raw bytes (or a
PKCS#8 PEM), a public key the base64 of its 32 raw bytes, what ``mkctl keys generate`` prints and ``mkctl
clusters register NAME --public-key`` takes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from federation.errors import Invalid
from federation.messages import MessageRefused
from federation.refusals import refused

DOMAIN = b"mkd-seal-v1"
_SEAL = re.compile(
    rb',"seal":\{"k":"([0-9a-f]{16})","s":"([A-Za-z0-9_.-]{0,64})","n":(0|[1-9][0-9]{0,18}),'
    rb'"t":(0|[1-9][0-9]{0,15}),"sig":"([A-Za-z0-9_-]{86})"\}\}$')
SEAL_MAX_BYTES = 200
"""What a seal adds to a message, at most."""


class Refused(MessageRefused):
    """A sealed message that is not accepted; ``why`` is the metric label, the message says more."""

    def __init__(self, why: str, message: str) -> None:
        super().__init__(message)
        self.why = why


# --- keys -------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def generate() -> tuple[str, str]:
    """A new key pair as text: (private, public)."""
    key = Ed25519PrivateKey.generate()
    return private_text(key), public_text(key.public_key())


def private_text(key: Ed25519PrivateKey) -> str:
    return _b64(key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                  serialization.NoEncryption()))


def public_text(key: Ed25519PublicKey) -> str:
    return _b64(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def key_id(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def parse_private_key(text: str, field: str = "signing.private_key") -> Ed25519PrivateKey:
    """Base64 of 32 raw bytes, or an unencrypted PKCS#8 PEM; Invalid naming ``field`` otherwise."""
    text = text.strip()
    try:
        if text.startswith("-----BEGIN"):
            key = serialization.load_pem_private_key(text.encode(), password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise ValueError("not an Ed25519 key")
            return key
        return Ed25519PrivateKey.from_private_bytes(base64.b64decode(text, validate=True))
    except (ValueError, TypeError, binascii.Error) as exc:
        raise Invalid(field, f"not an Ed25519 private key ({exc})",
                      fix="use `mkctl keys generate` and give the private line (base64 of 32 bytes) or a PKCS#8 PEM") \
            from None


def parse_public_key(text: str, field: str = "public_key") -> Ed25519PublicKey:
    """Base64 of 32 raw bytes (or a SubjectPublicKeyInfo PEM); Invalid naming ``field`` otherwise."""
    text = text.strip()
    try:
        if text.startswith("-----BEGIN"):
            key = serialization.load_pem_public_key(text.encode())
            if not isinstance(key, Ed25519PublicKey):
                raise ValueError("not an Ed25519 key")
            return key
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(text, validate=True))
    except (ValueError, TypeError, binascii.Error) as exc:
        raise Invalid(field, f"not an Ed25519 public key ({exc})",
                      fix="give the public line `mkctl keys generate` printed (base64 of 32 bytes)") from None


def load_private_key(inline: str | None, path: Path | None, field: str) -> Ed25519PrivateKey:
    """The private key from settings: inline text wins over a file (a mounted Secret)."""
    if inline:
        return parse_private_key(inline, f"{field}.private_key")
    if path is not None:
        try:
            return parse_private_key(path.read_text(), f"{field}.private_key_file")
        except OSError as exc:
            raise Invalid(f"{field}.private_key_file", f"cannot read {path}: {exc}",
                          fix="mount the Secret holding the key there, or set the key inline") from None
    raise Invalid(f"{field}.private_key_file",
                  "no signing key: every message on the wire is signed and unsigned ones are refused",
                  fix="create one with `mkctl keys generate` and set private_key_file (a mounted Secret) "
                      "or private_key")


# --- sealing ----------------------------------------------------------------------------------


def _signed(topic: str, k: str, stream: str, n: int, t: int, body: bytes) -> bytes:
    return b"\n".join((DOMAIN, topic.encode(), f"{k}|{stream}|{n}|{t}".encode(), body))


class Sealer:
    """Signs outgoing messages with one private key.

    A sealed message is the message's JSON with one more member appended at the end::

        {...the message...,"seal":{"k":"<key id>","s":"<stream>","n":<n>,"t":<unix ms>,"sig":"<signature>"}}

    ``k`` is the signer's key id (the first 16 hex digits of SHA-256 over the raw public key), ``s`` and
    ``n`` place the message on its sender's stream (the dispatcher: ``e<epoch>`` and the outbox row id;
    an agent: its link's stream and report number), ``t`` is when it was sealed. The signature covers
    a domain tag, the topic the message is published on, the header and the exact JSON bytes, so a
    sealed message cannot be moved to another cluster's topic, re-timed or altered. Stripping the
    seal gives back the bytes the sender encoded, which ``federation.messages`` decodes as before.
    """

    def __init__(self, key: Ed25519PrivateKey, *, now_ms: Callable[[], int] | None = None) -> None:
        self.key = key
        self.key_id = key_id(key.public_key())
        self._now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)

    def seal(self, topic: str, body: bytes, *, stream: str, n: int) -> bytes:
        if not body.endswith(b"}"):
            raise ValueError("only a JSON object can be sealed")
        t = self._now_ms()
        sig = self.key.sign(_signed(topic, self.key_id, stream, n, t, body))
        tail = (f',"seal":{{"k":"{self.key_id}","s":"{stream}","n":{n},"t":{t},'
                f'"sig":"{base64.urlsafe_b64encode(sig).rstrip(b"=").decode()}"}}}}')
        return body[:-1] + tail.encode()


@dataclass(frozen=True)
class Opened:
    body: bytes
    key_id: str
    stream: str
    n: int
    t: int
    """Unix milliseconds when it was sealed (the sender's clock)."""


class Opener:
    """Checks seals: trusted key, signature, clock window, no repeat inside the window."""

    def __init__(self, *, max_age_seconds: float = 300.0, now_ms: Callable[[], int] | None = None) -> None:
        self.max_age_ms = int(max_age_seconds * 1000)
        self._now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)
        self._seen: dict[tuple[str, str], dict[int, int]] = {}
        self._added = 0

    def open(self, topic: str, payload: bytes, keys: Mapping[str, Ed25519PublicKey] | Iterable[Ed25519PublicKey],
             *, not_before_ms: int | None = None, check_age: bool = True) -> Opened:
        """The message's own bytes, once its seal checks out; raises :class:`Refused` otherwise.

        ``keys``: the keys that may have signed it (by key id, or a list). ``not_before_ms``: refuse
        anything sealed earlier (the agent: before its link came up, minus the allowed skew).
        ``check_age`` False skips the clock window: a will message is sealed when its link opens and
        published by the broker whenever the link dies (the caller ties it to the live stream instead).
        """
        try:
            return self._open(topic, payload, keys, not_before_ms, check_age)
        except Refused as exc:
            refused(exc.why)
            raise

    def _open(self, topic: str, payload: bytes, keys: Mapping[str, Ed25519PublicKey] | Iterable[Ed25519PublicKey],
              not_before_ms: int | None, check_age: bool) -> Opened:
        if not isinstance(payload, bytes | bytearray):
            raise Refused("malformed", "payload is not bytes")
        payload = bytes(payload)
        tail = payload.rfind(b',"seal":')
        if tail < 0:
            raise Refused("unsigned", "the message carries no seal (every message must be signed by its sender)")
        match = _SEAL.fullmatch(payload, tail)
        if match is None:
            raise Refused("malformed", "the message's seal is malformed")
        k, stream, n, t, sig = (match.group(i) for i in range(1, 6))
        kid = k.decode()
        by_id = keys if isinstance(keys, Mapping) else {key_id(key): key for key in keys}
        public = by_id.get(kid)
        if public is None:
            raise Refused("unknown_key", f"signed with key {kid}, which this side does not trust")
        body = payload[:tail] + b"}"
        stamp = int(t)
        try:
            public.verify(base64.urlsafe_b64decode(sig + b"=="), _signed(topic, kid, stream.decode(), int(n), stamp,
                                                                         body))
        except (InvalidSignature, binascii.Error, ValueError):
            raise Refused("bad_signature", f"the signature by key {kid} does not match the message") from None
        now = self._now_ms()
        if check_age and abs(now - stamp) > self.max_age_ms:
            raise Refused("expired", f"sealed {abs(now - stamp) / 1000:.0f}s from this side's clock, outside the "
                                     f"{self.max_age_ms / 1000:.0f}s window")
        if not_before_ms is not None and stamp < not_before_ms:
            raise Refused("expired", "sealed before this link came up (a replay, or a Command the sender "
                                     "repeats on its own)")
        seen = self._seen.setdefault((kid, stream.decode()), {})
        number = int(n)
        if number in seen:
            raise Refused("replay", f"message {stream.decode()}/{number} by key {kid} was seen already")
        seen[number] = stamp
        self._added += 1
        if self._added >= 10_000:
            self._prune(now)
        return Opened(body, kid, stream.decode(), number, stamp)

    def _prune(self, now: int) -> None:
        """Forget what the clock window refuses anyway."""
        self._added = 0
        horizon = now - self.max_age_ms
        for key in list(self._seen):
            kept = {n: t for n, t in self._seen[key].items() if t >= horizon}
            if kept:
                self._seen[key] = kept
            else:
                del self._seen[key]


def peek(payload: bytes) -> tuple[str, int] | None:
    """The (stream, n) a seal claims, unchecked: lets a receiver pick the rules before :meth:`Opener.open`."""
    tail = payload.rfind(b',"seal":')
    match = _SEAL.fullmatch(payload, tail) if tail >= 0 else None
    return (match.group(2).decode(), int(match.group(3))) if match else None
