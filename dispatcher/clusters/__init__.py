"""The worker Clusters as the dispatcher knows them: identity, health, leases, announced policies.

``identity.py`` holds the clusters' registered keys and checks the seal of every Report (who may speak);
``health.py`` is the engine's part for heartbeats (the ``clusters`` row, the capacity book, a cluster
lost and what becomes of its Workloads); ``leases.py`` answers each heartbeat with a fencing Lease without
waiting behind the engine; ``policycheck.py`` keeps a Job from a cluster whose announced policies would
refuse it. ``identity`` may import ``dispatcher.db`` and ``settings``; ``policycheck`` only
``intake.jobcache``; ``health`` the engine's ``core`` and ``batch``; ``leases`` the engine's loop.
"""
