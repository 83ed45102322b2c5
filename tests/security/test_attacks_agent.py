"""Attacks on an agent through the broker: forged and replayed Commands.

The agent under test is the real one (kubesim over HTTP, a real broker). The harness's own link
plays the dispatcher; the attacker is another client on the same broker without its key.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from federation.kube import Resource
from federation.messages import Delete, PlacementKey, Resync, encode
from federation.refusals import count
from federation.sealing import recipients
from federation.signing import parse_public_key
from tests import keys
from tests.agent.conftest import CLUSTER, AgentHarness, place
from tests.security.attacks import BIG, harmless_job, hostile_job
from tests.security.conftest import attacker
from tests.waiting import eventually

JOBS = Resource("batch", "v1", "jobs", "Job")


def commands_topic(h: AgentHarness) -> str:
    return f"{h.settings.mqtt.topic_root}/{CLUSTER}/commands"


async def settle(h: AgentHarness, marker: str) -> None:
    """Send a genuine Place after the attack and wait for its answer: everything before it was handled."""
    cmd = place(harmless_job(marker), uid=f"wl-{marker}")
    await h.send(cmd)
    await h.wait_report(lambda r: r.type in ("accepted", "rejected")
                        and r.placement.workload_uid == f"wl-{marker}")
    assert h.agent is not None and h.agent.inbox is not None
    await h.agent.inbox.drain()


async def running_job(h: AgentHarness, name: str) -> Any:
    cmd = place(harmless_job(name), uid=f"wl-{name}")
    await h.send(cmd)
    await h.wait_report(lambda r: r.type == "accepted" and r.placement.workload_uid == f"wl-{name}")
    return cmd


async def test_forged_place_of_a_privileged_job_in_kube_system_creates_nothing(
        harness: AgentHarness, mqtt_url: str) -> None:
    forged = place(hostile_job(), uid="wl-evil", namespace="kube-system")
    unsigned, unknown = count("unsigned"), count("unknown_key")
    topic = commands_topic(harness)
    async with attacker(mqtt_url) as evil:
        await evil.publish(topic, encode(forged))
        # signed, but with a key of the attacker's own: as good as unsigned
        await evil.publish(topic, keys.Signer("attacker").seal(topic, encode(forged)))
    await settle(harness, "after-forged-place")
    assert count("unsigned") == unsigned + 1 and count("unknown_key") == unknown + 1
    assert await harness.get(JOBS, "evil", "kube-system") is None
    assert not [r for r in harness.reports if getattr(r, "placement", None) == forged.placement]


async def test_forged_delete_kills_nothing(harness: AgentHarness, mqtt_url: str) -> None:
    cmd = await running_job(harness, "victim")
    async with attacker(mqtt_url) as evil:
        await evil.publish(commands_topic(harness), encode(Delete(placement=cmd.placement, job=cmd.job)))
    await settle(harness, "after-forged-delete")
    assert await harness.get(JOBS, "victim", "team-a") is not None


async def test_forged_resync_with_a_huge_epoch_wipes_nothing_and_is_not_adopted(
        harness: AgentHarness, mqtt_url: str) -> None:
    await running_job(harness, "victim")
    async with attacker(mqtt_url) as evil:
        await evil.publish(commands_topic(harness), encode(Resync(cluster=CLUSTER, epoch=BIG, expected=[])))
    await settle(harness, "after-forged-resync")
    assert await harness.get(JOBS, "victim", "team-a") is not None
    assert harness.agent is not None and harness.agent.inbox is not None
    assert harness.agent.inbox.highest_epoch < BIG
    # the real dispatcher's Resync (epoch 1) is still obeyed: it lists the marker job only
    marker = PlacementKey(workload_uid="wl-after-forged-resync", attempt=1, epoch=1)
    await harness.send(Resync(cluster=CLUSTER, epoch=1, expected=[marker]))
    async def victim_gone() -> bool:
        return await harness.get(JOBS, "victim", "team-a") is None
    await eventually(victim_gone, what="the job the real Resync does not list to be deleted")


async def test_replayed_place_after_delete_and_restart_recreates_nothing(
        harness: AgentHarness, mqtt_url: str) -> None:
    """The attacker recorded a genuine Place off the wire and sends it again after the job was deleted."""
    recorded: list[bytes] = []
    async with attacker(mqtt_url) as evil:
        await evil.subscribe(commands_topic(harness))
        messages = evil.messages()
        cmd = await running_job(harness, "deleted-once")
        recorded.append((await asyncio.wait_for(anext(messages), 5)).payload)
    await harness.send(Delete(placement=cmd.placement, job=cmd.job, reason="user deleted it"))
    await harness.wait_report(lambda r: r.type == "status" and r.gone
                              and r.placement.workload_uid == "wl-deleted-once")
    await harness.stop_agent()  # what the agent remembered about deletions goes with it
    # The Place was sealed ~0.1 s before the new link came up: no clock skew allowed here, so that it
    # counts as older than the link (the default allows 2 s between the two sides' clocks).
    await harness.start_agent(signing=harness.settings.signing.model_copy(update={"clock_skew_seconds": 0}))
    replays = count("expired") + count("replay")
    async with attacker(mqtt_url) as evil:
        await evil.publish(commands_topic(harness), recorded[0])
    await settle(harness, "after-replay")
    assert count("expired") + count("replay") == replays + 1
    assert await harness.get(JOBS, "deleted-once", "team-a") is None


async def test_a_manager_users_privileged_job_in_the_agents_namespace_is_rejected_naming_why(
        harness: AgentHarness) -> None:
    """Genuine traffic, hostile content: a manager user may create any Job in any namespace up there."""
    cmd = place(hostile_job("sneaky", "mkd-system"), uid="wl-sneaky", namespace="mkd-system")
    await harness.send(cmd)
    refused = await harness.wait_report(lambda r: getattr(r, "placement", None) is not None and r.placement.workload_uid == "wl-sneaky"
                                        and r.type in ("accepted", "rejected"))
    assert refused.type == "rejected" and refused.reason == "PolicyViolation"
    assert "mkd-system" in refused.message
    assert await harness.get(JOBS, "sneaky", "mkd-system") is None

    cmd = place(hostile_job("sneaky", "team-a"), uid="wl-sneaky-2", namespace="team-a")
    await harness.send(cmd)
    refused = await harness.wait_report(lambda r: getattr(r, "placement", None) is not None and r.placement.workload_uid == "wl-sneaky-2"
                                        and r.type in ("accepted", "rejected"))
    assert refused.type == "rejected" and refused.reason == "PolicyViolation"
    for field in ("spec.template.spec.hostPID", "spec.template.spec.hostNetwork",
                  "spec.template.spec.volumes[0].hostPath",
                  "spec.template.spec.containers[0].securityContext.privileged",
                  "spec.template.spec.serviceAccountName"):
        assert field in refused.message, field
    assert await harness.get(JOBS, "sneaky", "team-a") is None


async def test_a_delete_queued_while_the_agent_was_away_still_applies(harness: AgentHarness) -> None:
    """Commands sealed before the link came up are refused, Deletes excepted: the dispatcher's fencing
    Deletes wait in the broker for a cut-off agent and must land when it returns."""
    cmd = await running_job(harness, "fenced")
    await harness.stop_agent()
    await harness.send(Delete(placement=cmd.placement, job=cmd.job, reason="moved elsewhere"))
    await asyncio.sleep(0.1)  # sealed well before the new link, whatever the skew setting
    await harness.start_agent(signing=harness.settings.signing.model_copy(update={"clock_skew_seconds": 0}))
    async def fenced_gone() -> bool:
        return await harness.get(JOBS, "fenced", "team-a") is None
    await eventually(fenced_gone, what="the Delete that waited in the broker to land")


async def test_a_sealed_place_with_an_altered_ciphertext_or_for_another_key_creates_nothing(
        harness: AgentHarness) -> None:
    """Signed by the dispatcher's key (what only its holder, or a bug, can send): the Place does not
    decrypt, or is sealed to another cluster's key. Refused, counted, nothing created; then the same
    Place sealed to this agent applies (``federation.sealing``)."""
    cmd = place(harmless_job("sealed-victim"), uid="wl-sealed-victim")
    topic = commands_topic(harness)
    envelope = json.loads(harness.places.seal(topic, encode(cmd), recipients(harness.agent_keys)))
    envelope["ct"] = base64.b64encode(bytes(b ^ 1 for b in base64.b64decode(envelope["ct"]))).decode()
    altered = json.dumps(envelope, separators=(",", ":")).encode()
    elsewhere = harness.places.seal(topic, encode(cmd), recipients([parse_public_key(keys.public("worker-2"))]))
    bad, other = count("bad_ciphertext"), count("not_for_us")
    assert harness.link is not None
    for body in (altered, elsewhere):
        await harness.link.publish(topic, harness.signer.seal(topic, body))
    await settle(harness, "after-sealed")
    assert count("bad_ciphertext") == bad + 1 and count("not_for_us") == other + 1
    assert await harness.get(JOBS, "sealed-victim", "team-a") is None
    assert not [r for r in harness.reports if getattr(r, "placement", None) == cmd.placement]
    await harness.send(cmd)
    await harness.wait_report(lambda r: r.type == "accepted" and r.placement == cmd.placement)
