"""The collector's settings of the long-running services (federation/gctune.py)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from federation import gctune
from mkctl.services import run_until_signal


@pytest.fixture
def collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("collector")
def test_a_service_runs_with_its_imports_frozen_and_young_collections_spaced_out() -> None:
    seen: dict[str, object] = {}

    async def main(stop: asyncio.Event) -> None:
        seen["threshold"] = gc.get_threshold()
        seen["frozen"] = gc.get_freeze_count()

    gc.unfreeze()
    before = gc.get_threshold()
    run_until_signal(main)
    assert seen["threshold"] == (gctune.YOUNG, before[1], before[2])  # the older generations as CPython's
    assert isinstance(seen["frozen"], int) and seen["frozen"] > 10_000  # the imported modules and classes


@pytest.mark.usefixtures("collector")
def test_cyclic_garbage_made_after_the_freeze_is_still_collected() -> None:
    gctune.tune()

    class Node:
        def __init__(self) -> None:
            self.other: Node | None = None

    collected: list[int] = []
    gc.callbacks.append(lambda phase, info: collected.append(info["collected"]) if phase == "stop" else None)
    try:
        for _ in range(2 * gctune.YOUNG):  # cycles only the collector frees: it must run on its own
            a, b = Node(), Node()
            a.other, b.other = b, a
    finally:
        gc.callbacks.pop()
    assert sum(collected) > 0
