"""The event loop mkd's processes run on: uvloop's where it is installed (a dependency on every platform but
Windows), else asyncio's own. The same asyncio code either way; on uvloop a request to the API server costs the
client about a fifth less CPU (bench/RESULTS.md). The services run on it (``mkctl.services``), and so
do the benchmarks' own processes, so that the floor's client (``bench/e2e_bench.py``) is no slower than the
services it is compared with."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on uvloop's event loop where it is installed."""
    try:
        import uvloop
    except ImportError:  # a platform it has no wheel for: the standard loop
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
