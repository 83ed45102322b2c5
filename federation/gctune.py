"""The garbage collector's settings for mkd's long-running processes (dispatcher, agent, fencer;
kubesim, a distribution of its own, freezes alone: kubesim/cli.py). A service imports far more than it
allocates per request, and every full collection walks all of it again, so :func:`tune`, called once the
process has imported what it runs, moves what exists then out of the collector's sight for good
(``gc.freeze()``) and runs young collections every ``YOUNG`` (50,000) net allocations instead of
CPython's 700; the middle and old generations keep CPython's thresholds (10, 10). A larger young
generation frees cyclic garbage later, so nothing may depend on the collector to give a resource back:
database sessions and connections are released by their context managers (``async with``), not by a
finalizer. The collections and their CPU per job at each threshold are in bench/RESULTS.md.
"""

from __future__ import annotations

import gc

YOUNG = 50_000
"""Net allocations between young collections (CPython: 700)."""


def tune() -> None:
    """Collect what import-time code left, freeze what is alive, and space the young collections out
    (see the module's text)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)
