"""The garbage collector's settings for mkd's long-running processes (dispatcher, agent, fencer, kubesim).

A service imports far more than it allocates per request: the pydantic and Kubernetes client models,
SQLAlchemy, FastAPI, its own modules. Every full ("old generation") collection walks all of it again,
and a service that decodes thousands of JSON messages a second runs one every few seconds. Measured on
``bench/e2e_bench.py -n 1000`` (2026-11-24, quiet machine): the dispatcher ran 503 collections (0.33
CPU-s), each agent ~345 (0.21 CPU-s). :func:`tune`, called once the process has imported what it runs,
moves what exists then out of the collector's sight for good (``gc.freeze()``); it lives as long as the
process anyway.

The thresholds stay CPython's: spacing the collections out (a young one every 10,000 net allocations
instead of 700) saved a little more CPU, but it also delays the finalisation of cyclic garbage that holds
a resource (a database connection abandoned in a reference cycle after an outage returns to its pool
only when the collector frees it), so it is not done.
"""

from __future__ import annotations

import gc


def tune() -> None:
    """Collect what import-time code left, then freeze what is alive (see the module's text)."""
    gc.collect()
    gc.freeze()
