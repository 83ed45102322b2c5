"""The garbage collector's settings for mkd's long-running processes (dispatcher, agent, fencer, kubesim).

CPython's defaults (a young collection every 700 net allocations, an old one every 100 young ones) suit
short scripts. A service that decodes thousands of JSON messages a second allocates far more than that,
and each of the old ("full") collections walks every object alive, the imported modules and the
pydantic and Kubernetes client models included. Measured on ``bench/e2e_bench.py -n 1000`` (2026-11-24,
quiet machine): the dispatcher ran 503 collections (0.33 CPU-s), each agent ~345 (0.21 CPU-s), about 15 %
of the federation's CPU. :func:`tune` does two things once the process has imported what it runs:

- ``gc.freeze()``: what exists now (modules, classes, settings) is moved out of the collector's sight
  for good; it lives as long as the process anyway.
- ``gc.set_threshold(YOUNG, 20, 50)``: a young collection every ``YOUNG`` net allocations, fewer old
  ones. Reference counting still frees everything not in a cycle at once; only cyclic garbage waits a
  little longer (a few MB at most).
"""

from __future__ import annotations

import gc

YOUNG = 10_000
"""Net allocations between two young collections (CPython: 700)."""
MIDDLE = 20
"""Young collections between two middle ones (CPython: 10)."""
OLD = 50
"""Middle collections between two full ones (CPython: 10)."""


def tune() -> None:
    """Freeze what is alive now and space the collections out (see the module's text)."""
    gc.collect()  # what import-time code left as garbage is not frozen with the rest
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE, OLD)
