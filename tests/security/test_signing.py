"""The seal itself (federation/signing.py): what it binds, what it refuses, and the reason counted."""

from __future__ import annotations

import pytest

from federation import messages, signing
from federation.errors import Invalid
from federation.refusals import count
from federation.signing import Opener, Refused, Sealer

TOPIC = "mkd/v1/worker-1/reports"


class Clock:
    def __init__(self) -> None:
        self.ms = 1_800_000_000_000

    def __call__(self) -> int:
        return self.ms


BODY = messages.encode(messages.Heartbeat(cluster="worker-1"))


def body() -> bytes:
    return BODY


def setup() -> tuple[Sealer, Opener, list[object], Clock]:
    clock = Clock()
    private, public = signing.generate()
    sealer = Sealer(signing.parse_private_key(private), now_ms=clock)
    return sealer, Opener(max_age_seconds=60, now_ms=clock), [signing.parse_public_key(public)], clock


def refused_as(why: str, fn: object) -> None:
    before = count(why)
    with pytest.raises(Refused) as exc:
        fn()  # type: ignore[operator]
    assert exc.value.why == why and count(why) == before + 1


def test_a_sealed_message_opens_to_its_own_bytes_and_decodes_as_before() -> None:
    sealer, opener, keys, _ = setup()
    wire = sealer.seal(TOPIC, body(), stream="s1", n=1)
    opened = opener.open(TOPIC, wire, keys)  # type: ignore[arg-type]
    assert opened.body == body() and (opened.stream, opened.n) == ("s1", 1)
    assert messages.decode_report(opened.body).cluster == "worker-1"


def test_every_kind_of_forgery_is_refused_with_its_reason() -> None:
    sealer, opener, keys, clock = setup()
    wire = sealer.seal(TOPIC, body(), stream="s1", n=7)
    refused_as("unsigned", lambda: opener.open(TOPIC, body(), keys))
    refused_as("malformed", lambda: opener.open(TOPIC, wire[:-3] + b"!}}", keys))
    other = Sealer(signing.parse_private_key(signing.generate()[0]))
    refused_as("unknown_key", lambda: opener.open(TOPIC, other.seal(TOPIC, body(), stream="s1", n=1), keys))
    tampered = wire.replace(b'"online":true', b'"online":false')
    refused_as("bad_signature", lambda: opener.open(TOPIC, tampered, keys))
    # moved to another cluster's topic: the topic is signed too
    refused_as("bad_signature", lambda: opener.open("mkd/v1/worker-2/reports", wire, keys))
    opener.open(TOPIC, wire, keys)  # type: ignore[arg-type]
    refused_as("replay", lambda: opener.open(TOPIC, wire, keys))
    late = sealer.seal(TOPIC, body(), stream="s1", n=8)
    clock.ms += 61_000
    refused_as("expired", lambda: opener.open(TOPIC, late, keys))
    fresh = sealer.seal(TOPIC, body(), stream="s1", n=9)
    refused_as("expired", lambda: opener.open(TOPIC, fresh, keys, not_before_ms=clock.ms + 1))
    clock.ms -= 200_000  # a message from the future is as suspect as one from the past
    refused_as("expired", lambda: opener.open(TOPIC, fresh, keys))


def test_keys_in_bad_shape_name_the_setting() -> None:
    with pytest.raises(Invalid) as exc:
        signing.parse_public_key("not base64!", "--public-key")
    assert exc.value.field == "--public-key"
    with pytest.raises(Invalid) as exc:
        signing.load_private_key(None, None, "signing")
    assert exc.value.field == "signing.private_key_file"
    private, public = signing.generate()
    key = signing.parse_private_key(private)
    assert signing.public_text(key.public_key()) == public


def test_refusals_are_exported_as_mkd_messages_refused_total() -> None:
    """Both services' /metrics carry the default registry, where the counter lives."""
    from prometheus_client import REGISTRY, generate_latest

    _, opener, keys, _ = setup()
    with pytest.raises(Refused):
        opener.open(TOPIC, body(), keys)  # type: ignore[arg-type]
    text = generate_latest(REGISTRY).decode()
    assert f'mkd_messages_refused_total{{reason="unsigned"}} {count("unsigned")}' in text
