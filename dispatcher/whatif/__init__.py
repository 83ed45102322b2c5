"""What-if: replay a workload against another configuration (quotas, priorities, clusters) before changing it.

``trace`` reads and writes the Jobs to replay, ``config`` the Kueue objects, mkd's decision settings and the
clusters, ``sim`` replays them through the dispatcher's own scheduler and placement on a virtual clock,
``report`` sums a run up (and compares two); ``history`` builds a trace and the live configuration from the
dispatcher's database. Everything but ``history`` is pure.
"""
