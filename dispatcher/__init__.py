"""Manager-cluster service: intake, engine, placement, the wire, the status mirror and the admin surfaces.

Each room says what it holds: ``intake/`` (manager Jobs in, the Job cache), ``engine/`` (the one task that
decides, its parts), ``clusters/`` (identity, health, leases, announced policies), ``wire/`` (Commands
out, Reports in over MQTT), ``mirror/`` (what mkd writes to the manager Jobs), ``queueing/`` (Kueue's
queues, quota and scheduling pass), ``db/`` (tables, queries, migrations), ``handover/`` (taking Jobs from
another controller), ``replica/`` (start-up, active / standby), ``api/`` (HTTP: admin API, dashboard,
metrics, probes); the modules at this level are shared by them: ``states`` (the two state vocabularies
and their transitions), ``workload`` (Job to Workload), ``placement`` (choosing a Cluster, pure),
``settings``, ``readmodel`` (what every admin surface reads) and ``app`` (wires the service together).
The layers between them are checked by ``tests/federation/test_boundaries.py``.
"""
