"""The dispatcher's queries, one module per table: each takes an ``AsyncSession`` and never commits.

The caller owns the transaction, so one batch of Job changes and Reports is one commit. ``workloads``,
``placements``, ``events``, ``outbox``, ``clusters`` (with the refused senders) and ``epochs`` hold the queries of
their table; ``listing`` what mkctl and the HTTP API list; ``sql`` the helpers they share (statements built once
per dialect, IN lists as one array on PostgreSQL). State changes two replicas could race on are compare-and-set, so
the loser of a race sees no row and does nothing.
"""
