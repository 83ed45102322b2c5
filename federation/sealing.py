"""Places sealed to the agent's key: a broker subscriber reads no manifest and no env value.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Final

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from federation.messages import MAX_PAYLOAD_BYTES, MessageRefused
from federation.signing import Refused, key_id

ALG: Final = "x25519-hkdf-sha256-chacha20poly1305"
PREFIX: Final = b'{"v":1,"type":"sealed",'
"""How every sealed Command begins: receivers tell it from a plain one without parsing."""
MAX_SEALED_BYTES: Final = MAX_PAYLOAD_BYTES * 4 // 3 + 4096
"""A sealed Place of the largest allowed Place: base64 adds a third, the envelope a little."""
EPHEMERAL_SECONDS: Final = 60.0
EPHEMERAL_USES: Final = 10_000
_WRAP_INFO: Final = b"mkd-place-v1 wrap"
_ZERO_NONCE: Final = bytes(12)
_P: Final = 2**255 - 19


class NoKey(MessageRefused):
    """The dispatcher has no key for the cluster a Place is for: it cannot be sealed, so it is not sent."""

    def __init__(self, cluster: str) -> None:
        super().__init__(f"cluster {cluster!r} has no registered key to seal the Place to; register it with "
                         f"`mkctl clusters register {cluster} --public-key ...` (the agent's public key)")
        self.cluster = cluster


# --- keys -------------------------------------------------------------------------------------


def _raw(key: X25519PublicKey | Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def agreement_public(key: Ed25519PublicKey) -> X25519PublicKey:
    """The X25519 key of a cluster's Ed25519 key: the Montgomery u of its Edwards point, u = (1+y)/(1-y).

    **The recipient's key is its signing key.** A cluster is known by the Ed25519 public key registered
    for it (``mkctl clusters register NAME --public-key``); its X25519 key is derived from that one, the
    way libsodium's ``crypto_sign_ed25519_pk_to_curve25519`` / ``_sk_to_curve25519`` do (and age for
    ssh-ed25519 recipients): the public half is the Montgomery form of the Edwards point, the private
    half the clamped first half of SHA-512 over the Ed25519 seed. So there is no second key to
    generate, mount, register or rotate: a cluster that can be heard can be sealed to, and rotating
    the cluster's key rotates both. The two uses stay apart: signatures are made over ``mkd-seal-v1``
    -tagged bytes, agreement outputs are only ever fed to HKDF with ``mkd-place-v1`` labels. ``k`` is
    the key id the seals already use (``signing.key_id``).
    """
    y = int.from_bytes(_raw(key), "little") & ((1 << 255) - 1)
    if y >= _P or y == 1:  # not a canonical encoding, or the identity point
        raise ValueError("not a usable Ed25519 public key for sealing")
    u = (1 + y) * pow(1 - y, _P - 2, _P) % _P
    return X25519PublicKey.from_public_bytes(u.to_bytes(32, "little"))


def agreement_private(key: Ed25519PrivateKey) -> X25519PrivateKey:
    """The X25519 half of an agent's Ed25519 key (its scalar; X25519 clamps it as Ed25519 does)."""
    seed = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())
    return X25519PrivateKey.from_private_bytes(hashlib.sha512(seed).digest()[:32])


def _wrapping_key(shared: bytes, sender: bytes, recipient: bytes) -> ChaCha20Poly1305:
    if shared == bytes(32):
        raise ValueError("the key agreement gave zero (a low-order key)")
    kdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=sender + recipient, info=_WRAP_INFO)
    return ChaCha20Poly1305(kdf.derive(shared))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise TypeError("not a base64 string")
    return binascii.a2b_base64(text, strict_mode=True)  # C, strict: no characters outside the alphabet


def _aad(topic: str, sender: bytes) -> bytes:
    return b"mkd-place-v1\n" + topic.encode() + b"\n" + sender


# --- sending ------------------------------------------------------------------------------------


class PlaceSealer:
    """Encrypts Places to their cluster's keys (the dispatcher's side).

    Every Place the dispatcher sends is encrypted to the cluster it goes to, then signed like any
    Command (``federation.signing``: the signature covers the sealed bytes, so an altered ciphertext is
    refused before anything is decrypted). On the wire a sealed Place is::

        {"v":1,"type":"sealed","alg":"x25519-hkdf-sha256-chacha20poly1305","e":"<sender's X25519 key>",
         "to":[{"k":"<recipient key id>","w":"<nonce + wrapped content key>"}],"ct":"<the Place, encrypted>"}

    followed by the seal. The content key is random per message; the Place's JSON is encrypted with it
    (ChaCha20-Poly1305, the topic as associated data); for each recipient the content key is wrapped
    with a key derived (HKDF-SHA256) from an X25519 agreement between ``e`` and the recipient's key.

    **Cost.** One X25519 agreement is about one Ed25519 signature. The sender keeps its ephemeral
    X25519 key for ``EPHEMERAL_SECONDS`` or ``EPHEMERAL_USES`` messages, and both sides memoise the
    wrapping key per (ephemeral, recipient) pair, so a Place costs one agreement per cluster and minute,
    not per message, plus two AEAD operations; every wrap carries its own random nonce. What the reuse
    gives up is small: the dispatcher's memory, which holds the ephemeral key for a minute, holds the
    plaintext Places anyway.
    """

    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._ephemeral: X25519PrivateKey | None = None
        self._ephemeral_raw = b""
        self._born = 0.0
        self._uses = 0
        self._recipients: dict[str, tuple[bytes, X25519PublicKey]] = {}
        """Ed25519 key id -> the raw X25519 key and the key (the conversion costs a modular inverse)."""
        self._wraps: dict[str, ChaCha20Poly1305] = {}
        """Recipient key id -> wrapping key under the current ephemeral key."""

    def _rotate(self) -> None:
        self._ephemeral = X25519PrivateKey.generate()
        self._ephemeral_raw = _raw(self._ephemeral.public_key())
        self._born = self._monotonic()
        self._uses = 0
        self._wraps = {}

    def _wrap_for(self, kid: str, key: Ed25519PublicKey) -> ChaCha20Poly1305:
        wrap = self._wraps.get(kid)
        if wrap is None:
            assert self._ephemeral is not None
            recipient = self._recipients.get(kid)
            if recipient is None:
                x = agreement_public(key)
                recipient = self._recipients[kid] = (_raw(x), x)
                if len(self._recipients) > 10_000:
                    self._recipients.clear()
            wrap = self._wraps[kid] = _wrapping_key(self._ephemeral.exchange(recipient[1]), self._ephemeral_raw,
                                                    recipient[0])
        return wrap

    def seal(self, topic: str, body: bytes, keys: Mapping[str, Ed25519PublicKey]) -> bytes:
        """``body`` (a Place's JSON) encrypted to every key in ``keys`` (key id -> the cluster's key)."""
        if not keys:
            raise ValueError("no recipient key")
        if (self._ephemeral is None or self._uses >= EPHEMERAL_USES
                or self._monotonic() - self._born >= EPHEMERAL_SECONDS):
            self._rotate()
        self._uses += 1
        content = ChaCha20Poly1305.generate_key()
        ciphertext = ChaCha20Poly1305(content).encrypt(_ZERO_NONCE, body, _aad(topic, self._ephemeral_raw))
        to = []
        for kid, key in sorted(keys.items()):
            nonce = os.urandom(12)
            to.append(f'{{"k":"{kid}","w":"{_b64(nonce + self._wrap_for(kid, key).encrypt(nonce, content, None))}"}}')
        return (PREFIX + f'"alg":"{ALG}","e":"{_b64(self._ephemeral_raw)}","to":[{",".join(to)}],'
                         f'"ct":"{_b64(ciphertext)}"}}'.encode())


# --- receiving ----------------------------------------------------------------------------------


def is_sealed(body: bytes) -> bool:
    return body.startswith(PREFIX)


class PlaceOpener:
    """Decrypts sealed Places with the agent's key (the agent's side).

    Refusals (counted in ``mkd_messages_refused_total{reason}``): ``not_for_us`` (sealed to other keys
    than this agent's: the dispatcher has another key registered for the cluster) and
    ``bad_ciphertext`` (a malformed envelope, or one that does not decrypt).
    """

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._private = agreement_private(key)
        self._public_raw = _raw(self._private.public_key())
        self.key_id = key_id(key.public_key())
        self._wraps: OrderedDict[bytes, ChaCha20Poly1305] = OrderedDict()
        """Sender's ephemeral key -> wrapping key (the sender keeps one for a minute)."""

    def _wrap_for(self, sender: bytes) -> ChaCha20Poly1305:
        wrap = self._wraps.get(sender)
        if wrap is None:
            wrap = self._wraps[sender] = _wrapping_key(
                self._private.exchange(X25519PublicKey.from_public_bytes(sender)), sender, self._public_raw)
            if len(self._wraps) > 64:
                self._wraps.popitem(last=False)
        return wrap

    def open(self, topic: str, body: bytes) -> bytes:
        """The Place's JSON inside a sealed Command; raises :class:`~federation.signing.Refused`."""
        if len(body) > MAX_SEALED_BYTES:
            raise Refused("bad_ciphertext", f"sealed Place of {len(body)} bytes, above {MAX_SEALED_BYTES}")
        try:
            envelope = orjson.loads(body)
            if envelope.get("alg") != ALG:
                raise Refused("bad_ciphertext", f"sealed with {envelope.get('alg')!r}; this agent opens {ALG}")
            if set(envelope) != {"v", "type", "alg", "e", "to", "ct"} or not isinstance(envelope["to"], list):
                raise Refused("bad_ciphertext", "the sealed Place's envelope is malformed")
            sender = _unb64(envelope["e"])
            ciphertext = _unb64(envelope["ct"])
            mine = [r for r in envelope["to"] if isinstance(r, dict) and r.get("k") == self.key_id]
            if not mine:
                theirs = sorted(str(r.get("k")) for r in envelope["to"] if isinstance(r, dict))
                raise Refused("not_for_us", f"sealed to key(s) {', '.join(theirs) or 'none'}, not to this agent's "
                                            f"key {self.key_id}: register this agent's public key for the cluster "
                                            "(`mkctl clusters register NAME --public-key ...`) or give the agent "
                                            "the private key registered")
            wrapped = _unb64(mine[0]["w"])
            content = self._wrap_for(sender).decrypt(wrapped[:12], wrapped[12:], None)
            return ChaCha20Poly1305(content).decrypt(_ZERO_NONCE, ciphertext, _aad(topic, sender))
        except Refused:
            raise
        except InvalidTag:
            raise Refused("bad_ciphertext", "the sealed Place does not decrypt with this agent's key "
                                            "(altered before it was signed, or sealed to another key)") from None
        except (ValueError, TypeError, KeyError, AttributeError, binascii.Error, RecursionError,
                orjson.JSONDecodeError) as exc:
            raise Refused("bad_ciphertext", f"the sealed Place's envelope is malformed ({exc})") from None


def recipients(keys: Iterable[Ed25519PublicKey]) -> dict[str, Ed25519PublicKey]:
    """Key id -> key, as :meth:`PlaceSealer.seal` takes them."""
    return {key_id(k): k for k in keys}
