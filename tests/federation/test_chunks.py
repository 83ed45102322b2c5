"""Resync and Inventory at any size: parts under the payload limit, acted on only whole."""

from __future__ import annotations

import random

import pytest

from federation import chunks
from federation.messages import (
    MAX_PAYLOAD_BYTES,
    Inventory,
    InventoryItem,
    JobRef,
    MessageRefused,
    PlacementKey,
    Resync,
    decode_command,
    decode_report,
    encode,
)


def keys(n: int) -> list[PlacementKey]:
    return [PlacementKey(workload_uid=f"{i:08d}-1111-2222-3333-444444444444", attempt=1, epoch=7) for i in range(n)]


def test_a_resync_of_thirty_thousand_placements_travels_in_parts_and_comes_back_whole() -> None:
    whole = Resync(cluster="worker-1", epoch=7, expected=keys(30_000))
    with pytest.raises(MessageRefused):
        encode(whole)  # one payload cannot hold it (it was refused at ~13,400 placements)
    parts = chunks.split(whole)
    assert len(parts) > 2 and {p.chunk.parts for p in parts} == {len(parts)}
    payloads = [encode(p) for p in parts]
    assert all(len(b) <= chunks.BUDGET for b in payloads)
    random.Random(1).shuffle(payloads)  # published concurrently: any order
    assembler = chunks.Assembler()
    results = [assembler.add(decode_command(b), 0.0) for b in payloads]  # type: ignore[type-var]
    assert results[:-1] == [None] * (len(parts) - 1)
    got = results[-1]
    assert isinstance(got, Resync) and got.expected == whole.expected and got.chunk.parts == 1


def test_an_inventory_of_twelve_thousand_jobs_travels_in_parts() -> None:
    items = [InventoryItem(placement=k, spec_version=1, last_seq=3,
                           job=JobRef(kind="PyTorchJob", api_version="kubeflow.org/v1", namespace="team-a",
                                      name=f"job-{i}")) for i, k in enumerate(keys(12_000))]
    whole = Inventory(cluster="worker-1", items=items)
    parts = chunks.split(whole)
    assert len(parts) > 1 and all(len(encode(p)) <= chunks.BUDGET for p in parts)
    assembler = chunks.Assembler()
    out = [assembler.add(decode_report(encode(p)), 0.0) for p in parts]  # type: ignore[type-var]
    assert out[-1] is not None and out[-1].items == items


def test_a_small_message_is_one_part_and_an_incomplete_one_is_never_acted_on() -> None:
    small = Resync(cluster="w", epoch=1, expected=keys(3))
    assert chunks.split(small) == [small]
    assert chunks.Assembler().add(small, 0.0) is small
    parts = chunks.split(Resync(cluster="w", epoch=1, expected=keys(400)), budget=8_000)
    assembler = chunks.Assembler(ttl=10)
    assert all(assembler.add(p, 0.0) is None for p in parts[:-1])
    assert assembler.add(parts[-1], 11.0) is None  # the first parts expired: a partial list is never used
    assert assembler.incomplete_dropped == 1
    assert len(encode(parts[0])) < MAX_PAYLOAD_BYTES
