"""The chaos suite: a federation of separate processes, faults injected by PID, counts from the outside.

``python -m bench.chaos`` runs the scenarios (see ``bench/chaos/README.md``); ``tests/chaos`` runs the
same scenarios at a small size in ``make test``.
"""
