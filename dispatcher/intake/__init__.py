"""Intake: the manager cluster's Jobs coming in, and the cache of the Jobs mkd claimed.

``watch.py`` lists and watches each JobKind (one task per kind, per namespace when set) and hands the
engine only what matters (a claim, a new generation, a managedBy change, a deletion); ``jobcache.py``
holds every claimed Job compactly (what a Place carries, what the mirror wrote last); ``unclaimed.py``
says who manages a Job mkd did not claim. ``jobcache`` and ``unclaimed`` import nothing of the dispatcher;
``watch`` may import ``dispatcher.workload``, the engine's loop and inbox items, and ``unclaimed``.
"""
