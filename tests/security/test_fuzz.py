"""Fuzzing every topic's receiver (hypothesis): nothing crashes, nothing unsealed or altered gets through.

The dispatcher's report subscriber takes ``<root>/<cluster>/reports`` and ``.../presence``; the agent
takes ``<root>/<cluster>/commands``. Each gets random bytes, random JSON, genuine sealed messages with
one byte changed, and genuine messages on the wrong topic. The only thing that may reach the engine
or the inbox is a genuine message, unaltered, on its own topic, once.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher.clusters.identity import Identity
from dispatcher.settings import DispatcherSettings
from dispatcher.wire.reports import ReportSubscriber
from dispatcher.wire.streams import StreamBook
from federation import messages, topics
from federation.clock import SystemClock
from federation.settings import SigningSettings
from tests import keys
from worker_agent.identity import AgentIdentity
from worker_agent.settings import AgentSettings

ROOT = "mkd/v1"
CLUSTER = "worker-1"
FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def subscriber() -> ReportSubscriber:
    s = DispatcherSettings(signing=SigningSettings(private_key=keys.private(keys.DISPATCHER)),
                           cluster_public_keys=keys.cluster_keys())
    engine: Any = SimpleNamespace(identity=Identity(s), streams=StreamBook(), inbox=asyncio.Queue())
    return ReportSubscriber(s, engine, SystemClock(), client_id="fuzz")


def agent_identity() -> AgentIdentity:
    return AgentIdentity(AgentSettings(cluster_name=CLUSTER,
                                       signing=SigningSettings(private_key=keys.private(CLUSTER)),
                                       dispatcher_public_keys=[keys.public(keys.DISPATCHER)]))


def genuine_reports() -> list[tuple[str, messages.ReportBase]]:
    key = messages.PlacementKey(workload_uid="uid-1", attempt=1, epoch=1)
    return [
        (topics.presence(CLUSTER, ROOT), messages.Heartbeat(cluster=CLUSTER)),
        (topics.reports(CLUSTER, ROOT), messages.Status(cluster=CLUSTER, placement=key, seq=1, status={})),
        (topics.reports(CLUSTER, ROOT), messages.Accepted(cluster=CLUSTER, placement=key, spec_version=1, seq=2)),
    ]


def genuine_command() -> messages.Place:
    return messages.Place(placement=messages.PlacementKey(workload_uid="uid-1", attempt=1, epoch=1), spec_version=1,
                          job=messages.JobRef(kind="Job", api_version="batch/v1", namespace="team-a", name="j"),
                          manifest={"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}})


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=4), max_leaves=20)
topic_strategy = st.one_of(
    st.sampled_from([topics.reports(CLUSTER, ROOT), topics.presence(CLUSTER, ROOT), topics.reports("worker-2", ROOT),
                     topics.presence("ghost", ROOT), f"{ROOT}/{CLUSTER}/other", "unrelated/topic"]),
    st.text(max_size=40))


@FUZZ
@given(topic=topic_strategy, payload=st.one_of(
    st.binary(max_size=400),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(["v", "type", "cluster", "seal", "n", "stream", "seq"]), json_values,
                    max_size=6).map(lambda d: json.dumps(d).encode())))
def test_random_payloads_on_report_topics_crash_nothing_and_reach_nothing(topic: str, payload: bytes) -> None:
    sub = subscriber()
    sub.accept(topic, payload)
    assert sub.engine.inbox.empty()


@FUZZ
@given(which=st.integers(0, 2), position=st.integers(0, 10_000), flip=st.integers(1, 255),
       wrong_topic=st.booleans())
def test_altered_or_moved_sealed_reports_are_refused(which: int, position: int, flip: int, wrong_topic: bool) -> None:
    sub = subscriber()
    topic, report = genuine_reports()[which]
    signer = keys.Signer(CLUSTER)
    wire = bytearray(signer.seal(topic, messages.encode(report)))
    if wrong_topic:
        moved = topic.replace(CLUSTER, "worker-2")
        sub.accept(moved, bytes(wire))
    else:
        wire[position % len(wire)] ^= flip
        sub.accept(topic, bytes(wire))
    assert sub.engine.inbox.empty()
    # the genuine message still goes through, once
    fresh = signer.seal(topic, messages.encode(report))
    sub.accept(topic, fresh)
    sub.accept(topic, fresh)
    assert sub.engine.inbox.qsize() == 1


@FUZZ
@given(topic=st.sampled_from([topics.commands(CLUSTER, ROOT), topics.commands("worker-2", ROOT), "x"]),
       payload=st.one_of(st.binary(max_size=400), json_values.map(lambda v: json.dumps(v).encode())),
       position=st.integers(0, 10_000), flip=st.integers(1, 255))
def test_the_commands_topic_takes_only_the_dispatchers_unaltered_commands(
        topic: str, payload: bytes, position: int, flip: int) -> None:
    agent = agent_identity()
    assert agent.open_command(topic, payload, 0) is None
    own = topics.commands(CLUSTER, ROOT)
    sealer = keys.Signer(keys.DISPATCHER)
    wire = bytearray(sealer.seal(own, messages.encode(genuine_command())))
    wire[position % len(wire)] ^= flip
    assert agent.open_command(own, bytes(wire), 0) is None
    genuine = sealer.seal(own, messages.encode(genuine_command()))
    assert agent.open_command(topics.commands("worker-2", ROOT), genuine, 0) is None  # not this cluster's
    body = agent.open_command(own, genuine, 0)
    assert body is not None and messages.decode_command(body).placement.workload_uid == "uid-1"
    assert agent.open_command(own, genuine, 0) is None  # once
