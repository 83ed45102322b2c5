"""One replica's life: waiting for its database at start, then active or standby.

``startup.py`` runs every start-up step that reads the database through one backoff, saying what the
start waits for (and gives memory back to the system); ``leader.py`` is active / standby on PostgreSQL
(an advisory lock, its session checked). Both may import only ``dispatcher.db`` and ``settings``.
"""
