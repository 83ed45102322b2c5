"""The mirror: what mkd writes to the manager Jobs (conditions, the worker's status, Events).

``conditions.py`` says which conditions a Job gets at each step of its Workload's life (pure);
``jobevents.py`` turns each batch's history rows into Kubernetes Events; ``kubewriter.py`` carries the
writes out after the engine committed them, serial per Job, coalesced. The mirror decides nothing: it may
import ``dispatcher.workload``, ``intake.jobcache`` and the engine's ``batch`` (a Job's key), never the
engine's parts, the database or the wire.
"""
