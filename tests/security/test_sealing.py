"""Places sealed to the agent's key (federation/sealing.py): what a subscriber sees, what is refused, rotation."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.clusters.identity import Identity
from dispatcher.db import models as m
from dispatcher.settings import DispatcherSettings
from federation import messages, sealing, signing, topics
from federation.kube import Kube
from federation.refusals import count
from federation.sealing import (
    NoKey,
    PlaceOpener,
    PlaceSealer,
    agreement_private,
    agreement_public,
    recipients,
)
from federation.settings import SigningSettings
from federation.signing import Refused
from tests import keys
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings
from tests.dispatcher.test_flow import rows
from tests.security.conftest import sniffing
from worker_agent.identity import AgentIdentity
from worker_agent.settings import AgentSettings

TOPIC = "mkd/v1/worker-1/commands"
SECRET = "hunter2-not-for-the-broker"


def place() -> messages.Place:
    manifest = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "team-a"},
                "spec": {"template": {"spec": {"containers": [
                    {"name": "c", "image": "busybox", "env": [{"name": "API_TOKEN", "value": SECRET}]}]}}}}
    return messages.Place(placement=messages.PlacementKey(workload_uid="uid-1", attempt=1, epoch=1), spec_version=1,
                          job=messages.JobRef(kind="Job", api_version="batch/v1", namespace="team-a", name="train"),
                          manifest=manifest)


def key(name: str) -> Ed25519PrivateKey:
    return signing.parse_private_key(keys.private(name))


def to(*names: str) -> dict[str, Ed25519PublicKey]:
    return recipients(signing.parse_public_key(keys.public(n)) for n in names)


def refused_as(why: str, fn: object) -> Refused:
    """Refused with reason ``why`` (PlaceOpener only raises: the agent's identity counts, tested below)."""
    with pytest.raises(Refused) as exc:
        fn()  # type: ignore[operator]
    assert exc.value.why == why
    return exc.value


def test_the_derived_agreement_keys_are_one_pair() -> None:
    """The X25519 public key the dispatcher derives from a registered key is the one the agent's private
    key makes: the conversion is the standard Edwards-to-Montgomery map, checked on many keys."""
    raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
    for _ in range(50):
        private, public = signing.generate()
        mine = agreement_private(signing.parse_private_key(private)).public_key().public_bytes(*raw)
        assert agreement_public(signing.parse_public_key(public)).public_bytes(*raw) == mine


def test_a_sealed_place_hides_manifest_and_env_and_opens_to_the_same_bytes() -> None:
    body = messages.encode(place())
    wire = PlaceSealer().seal(TOPIC, body, to("worker-1"))
    assert sealing.is_sealed(wire)
    for visible in (SECRET.encode(), b"API_TOKEN", b"busybox", b"team-a", b"train", b"uid-1"):
        assert visible not in wire
    assert PlaceOpener(key("worker-1")).open(TOPIC, wire) == body
    # the ephemeral key is kept a while, yet every message has its own content key and wrap nonce
    sealer = PlaceSealer()
    one, two = sealer.seal(TOPIC, body, to("worker-1")), sealer.seal(TOPIC, body, to("worker-1"))
    assert json.loads(one)["e"] == json.loads(two)["e"] and json.loads(one)["ct"] != json.loads(two)["ct"]
    assert PlaceOpener(key("worker-1")).open(TOPIC, two) == body


def test_the_ephemeral_key_is_renewed_after_its_time() -> None:
    now = [0.0]
    sealer = PlaceSealer(monotonic=lambda: now[0])
    first = json.loads(sealer.seal(TOPIC, b"{}", to("worker-1")))["e"]
    now[0] += sealing.EPHEMERAL_SECONDS
    assert json.loads(sealer.seal(TOPIC, b"{}", to("worker-1")))["e"] != first


def test_a_tampered_or_misdirected_sealed_place_is_refused_with_its_reason() -> None:
    body = messages.encode(place())
    wire = PlaceSealer().seal(TOPIC, body, to("worker-1"))
    mine = PlaceOpener(key("worker-1"))
    envelope = json.loads(wire)
    ct = bytearray(base64.b64decode(envelope["ct"]))
    ct[10] ^= 1
    flipped = json.dumps({**envelope, "ct": base64.b64encode(bytes(ct)).decode()}).encode()
    refused_as("bad_ciphertext", lambda: mine.open(TOPIC, flipped))
    refused_as("bad_ciphertext", lambda: mine.open("mkd/v1/worker-2/commands", wire))  # the topic is bound
    refused_as("bad_ciphertext", lambda: mine.open(TOPIC, wire[:-20] + b'"}'))
    refused_as("bad_ciphertext", lambda: mine.open(TOPIC, sealing.PREFIX + b'"alg":"rot13"}'))
    other = refused_as("not_for_us", lambda: PlaceOpener(key("worker-2")).open(TOPIC, wire))
    assert "mkctl clusters register" in other.message and mine.key_id in other.message


def test_during_a_key_rotation_a_place_is_sealed_to_both_keys_and_either_opens_it() -> None:
    body = messages.encode(place())
    wire = PlaceSealer().seal(TOPIC, body, to("worker-1", "worker-1-next"))
    assert PlaceOpener(key("worker-1")).open(TOPIC, wire) == body
    assert PlaceOpener(key("worker-1-next")).open(TOPIC, wire) == body
    refused_as("not_for_us", lambda: PlaceOpener(key("worker-3")).open(TOPIC, wire))


def agent_identity() -> AgentIdentity:
    return AgentIdentity(AgentSettings(cluster_name="worker-1",
                                       signing=SigningSettings(private_key=keys.private("worker-1")),
                                       dispatcher_public_keys=[keys.public(keys.DISPATCHER)]))


def test_the_agent_opens_a_signed_sealed_place_and_refuses_and_counts_a_ciphertext_the_dispatcher_altered() -> None:
    """An altered ciphertext on the wire fails the signature; one altered before signing (what a holder of
    the dispatcher's key, or a bug, could produce) fails decryption: refused, counted, never applied."""
    agent = agent_identity()
    dispatcher = keys.Signer(keys.DISPATCHER, stream="e1")
    body = messages.encode(place())
    sealed = PlaceSealer().seal(TOPIC, body, to("worker-1"))
    assert agent.open_command(TOPIC, dispatcher.seal(TOPIC, sealed), 0) == body
    on_the_wire = dispatcher.seal(TOPIC, sealed).replace(b'"ct":"', b'"ct":"AAAA')
    before = count("bad_signature")
    assert agent.open_command(TOPIC, on_the_wire, 0) is None and count("bad_signature") == before + 1
    envelope = json.loads(sealed)
    altered = json.dumps({**envelope, "ct": "AAAA" + envelope["ct"][4:]}, separators=(",", ":")).encode()
    before, refused = count("bad_ciphertext"), agent.refused
    assert agent.open_command(TOPIC, dispatcher.seal(TOPIC, altered), 0) is None
    assert count("bad_ciphertext") == before + 1 and agent.refused == refused + 1
    before = count("not_for_us")
    assert agent.open_command(TOPIC, dispatcher.seal(TOPIC, PlaceSealer().seal(TOPIC, body, to("worker-2"))), 0) \
        is None
    assert count("not_for_us") == before + 1


# --- the dispatcher's side: a real dispatcher (kubesim manager, database, broker) and a fake agent ------


def with_secret_env(job: dict[str, Any]) -> dict[str, Any]:
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        spec["template"]["spec"]["containers"][0]["env"] = [{"name": "API_TOKEN", "value": SECRET}]
    return job


async def test_a_broker_subscriber_sees_no_manifest_nor_env_of_a_place_its_agent_reads_it(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    # a subscriber the ACL let through, or the broker itself
    async with sniffing(mqtt_url, f"{topic_root}/+/commands") as seen:
        async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
            await kube.create(PYTORCHJOBS, with_secret_env(pytorchjob("private")), "default")
            place = (await eventually(lambda: agent.places(), what="a Place"))[0]
            env = place.manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
            assert env["env"] == [{"name": "API_TOKEN", "value": SECRET}]  # the agent reads it whole
            await eventually(lambda: any(sealing.is_sealed(p[:p.rfind(b',"seal":')] + b"}") for p in seen),
                             what="the sealed Place seen on the broker")
    for payload in seen:
        for visible in (SECRET.encode(), b"API_TOKEN", b"example/train", b"pytorchReplicaSpecs", b"private"):
            assert visible not in payload


async def test_a_cluster_without_a_key_gets_no_place_and_sealing_to_one_names_the_fix(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, cluster_keys_refresh_seconds=3600,
                 placement_retry_seconds=0.3)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
        assert d.engine is not None
        identity = d.engine.identity
        await eventually(lambda: "worker-1" in d.engine.book.heartbeats, what="worker-1 heard")  # type: ignore[union-attr]
        with pytest.raises(NoKey) as exc:
            identity.seal_place("worker-1-gone", topics.commands("worker-1-gone", topic_root), b"{}")
        assert "mkctl clusters register worker-1-gone --public-key" in exc.value.message
        kept = identity.keys.pop("worker-1")  # unregistered: heard a moment ago, no key any more
        await kube.create(PYTORCHJOBS, pytorchjob("waits"), "default")
        await eventually(lambda: _state(db_url, "waits", "pending"), what="the Job claimed and pending")
        await asyncio.sleep(1.0)  # a few placement rounds
        assert agent.places() == [] and await _state(db_url, "waits", "pending")
        identity.keys["worker-1"] = kept  # registered again
        await eventually(lambda: agent.places(), what="placed once the cluster has a key")


async def _state(db_url: str, name: str, state: str) -> bool:
    found = await rows(db_url, m.workloads, name=name)
    return bool(found) and found[0].state == state


PLACE = messages.encode(place())  # once: a Place carries the time it was made
GENUINE = PlaceSealer().seal(TOPIC, PLACE, to("worker-1"))


@hypothesis.settings(max_examples=80, deadline=None)
@given(at=st.integers(min_value=0, max_value=len(GENUINE) - 1), byte=st.integers(min_value=0, max_value=255),
       junk=st.binary(max_size=200))
def test_an_altered_or_random_envelope_is_only_ever_refused(at: int, byte: int, junk: bytes) -> None:
    """What a holder of the dispatcher's key (or a bug) could sign: one byte changed, or random bytes after
    the prefix. The opener never raises anything but Refused, and never returns other bytes than the Place."""
    opener = PlaceOpener(key("worker-1"))
    for body in (GENUINE[:at] + bytes([byte]) + GENUINE[at + 1:], sealing.PREFIX + junk):
        try:
            assert opener.open(TOPIC, body) == PLACE
        except Refused as exc:
            assert exc.why in ("bad_ciphertext", "not_for_us")


def test_the_dispatcher_seals_to_every_key_it_knows_for_the_cluster_during_a_rotation() -> None:
    """The new key listed in cluster_public_keys while the old one is still registered (or the reverse):
    the agent opens the Place whichever of the two it holds; with one key left, only its holder does."""
    identity = Identity(DispatcherSettings(signing=SigningSettings(private_key=keys.private(keys.DISPATCHER)),
                                           cluster_public_keys={"worker-1": keys.public("worker-1-next")}))
    identity.registered({"worker-1": keys.public("worker-1")})
    wire = identity.seal_place("worker-1", TOPIC, PLACE)
    assert PlaceOpener(key("worker-1")).open(TOPIC, wire) == PLACE
    assert PlaceOpener(key("worker-1-next")).open(TOPIC, wire) == PLACE
    identity.registered({})  # the old key unregistered: the rotation is over
    wire = identity.seal_place("worker-1", TOPIC, PLACE)
    assert PlaceOpener(key("worker-1-next")).open(TOPIC, wire) == PLACE
    refused_as("not_for_us", lambda: PlaceOpener(key("worker-1")).open(TOPIC, wire))
