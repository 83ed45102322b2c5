"""What mkd says of a LeaderWorkerSet it did not claim: LWS has no managedBy, so the answer is about its queue label."""

from __future__ import annotations

import asyncio
from typing import Any

from dispatcher.intake.unclaimed import explain, queued_but_unmanaged
from federation import labels
from federation.errors import NotFound
from federation.kinds.leaderworkerset import LEADERWORKERSET


class OneLws:
    """A manager cluster holding one LWS (every other kind answers 404)."""

    def __init__(self, lws: dict[str, Any]) -> None:
        self.lws = lws

    async def get(self, res: Any, name: str, namespace: str) -> dict[str, Any]:
        if res.plural == "leaderworkersets" and name == self.lws["metadata"]["name"]:
            return self.lws
        raise NotFound(f"{res.plural} {name}")


def lws(queue: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "serve", "namespace": "team-a"}
    if queue:
        meta["labels"] = {labels.QUEUE_NAME: queue}
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": meta, "spec": {}}


def test_an_lws_without_a_queue_is_left_to_lws_and_the_answer_names_the_label() -> None:
    said = asyncio.run(explain(OneLws(lws(None)), "team-a", "serve"))
    assert said is not None and "names no queue" in said and labels.QUEUE_NAME in said
    assert labels.MULTIKUEUE not in said  # there is no managedBy to set
    assert queued_but_unmanaged(LEADERWORKERSET, lws("default")) is None  # a queue label is the hand-over


def test_an_lws_naming_a_queue_but_unclaimed_says_the_dispatcher_has_not_taken_it() -> None:
    said = asyncio.run(explain(OneLws(lws("default")), "team-a", "serve"))
    assert said is not None and "has not claimed it" in said and "names a queue" in said
