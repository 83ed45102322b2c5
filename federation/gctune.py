"""The garbage collector's settings for mkd's long-running processes (dispatcher, agent, fencer;
kubesim, a distribution of its own, freezes alone: kubesim/cli.py).

A service imports far more than it allocates per request: the pydantic and Kubernetes client models,
SQLAlchemy, FastAPI, its own modules. Every full ("old generation") collection walks all of it again,
and a service that decodes thousands of JSON messages a second runs one every few seconds. Measured on
``bench/e2e_bench.py -n 1000`` (2026-11-24, quiet machine): the dispatcher ran 503 collections (0.33
CPU-s), each agent ~345 (0.21 CPU-s). :func:`tune`, called once the process has imported what it runs,
moves what exists then out of the collector's sight for good (``gc.freeze()``); it lives as long as the
process anyway.

Young collections then run every ``YOUNG`` (50,000) net allocations instead of CPython's 700. What a
young collection walks is what is alive and not frozen: jobs in flight, caches, batches. Measured with
``gc.callbacks`` from ``tune`` on, in ``bench/e2e_bench.py -n 1000`` (2026-11-24, sixth session, two runs
each): at 700 each agent ran ~73 collections (0.03 CPU-s) and the dispatcher ~230 (0.08 CPU-s), about
0.17 CPU-ms per job over the dispatcher and three agents; at 10,000, 2–9 collections and ~0.05 CPU-ms per
job. (Counted from process start instead, the imports' own collections add ~0.1 CPU-s per process at
700: that is start-up, not per job.) At N = 6,000 (2026-11-25, twelfth session, one run each, the
end-to-end phase only) 10,000 still cost each agent ~10 young and one middle collection, 0.09 CPU-s
(3.6 % of its CPU), and the dispatcher ~22 young and two middle, 0.07 CPU-s; at 50,000 each agent ran 2
young collections (0.04 CPU-s, ~20 ms each) and the dispatcher 2 (0.03 CPU-s): ~0.03 CPU-ms per job less
over the four. The middle and old generations keep CPython's thresholds (10, 10).

A larger young generation frees cyclic garbage later, so nothing may depend on the collector to give a
resource back: database sessions and connections are released by their context managers (``async with``),
not by a finalizer. (An earlier session withdrew the raised threshold
after a postgres-outage run stuck once; the cause was found later and was not the collector: a batch held
through the outage set its claims aside for good, fixed with ``tests/dispatcher/test_held_batch.py``.)
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
