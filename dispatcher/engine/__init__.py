"""The engine: the one task that decides every change, one database transaction per batch.

``loop.py`` is the task (:class:`~dispatcher.engine.loop.Engine`: the inbox, one transaction per batch,
what it hands on after the commit); ``batch.py`` what flows through it (inbox items, the per-batch
scratchpad); ``transitions.py`` every change of a Workload's state, one function per transition (no
other module writes one); ``core.py`` the state its parts share and the decisions they all make (Commands, requeue,
reject); the parts each decide one kind of item: ``jobchanges.py`` (claims, edits, deletions),
``answers.py`` (agents' Reports), ``rounds.py`` (the placement round), ``adminactions.py`` (what an
admin asks), ``heal.py`` (conditions after a start), ``faults.py`` (outages and failing items); a
cluster's heartbeats and loss are decided in :mod:`dispatcher.clusters.health`. The engine may import
``dispatcher.states``, ``settings``, ``workload``, ``placement``, ``db``, ``queueing``, ``intake.jobcache``,
``mirror``, ``clusters`` (but ``leases``), ``wire.freshrows``, ``wire.streams`` and ``handover.safety``;
within it, ``loop`` imports the parts, the parts import ``core``, ``transitions`` and ``batch``, never each other.
"""
