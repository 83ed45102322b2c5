"""Kueue mode: mkd as Kueue's AdmissionCheck controller ``mkd.dev/dispatcher``, beside a running Kueue.

``kueueview.py`` reads Kueue's objects and builds mkd's two writes to them (pure); ``controller.py`` watches
them, stands between intake and the engine (which Jobs are mkd's, and when Kueue released them) and keeps the
check's state on each Workload in line with the engine's decisions. ``kueueview`` imports nothing of the
dispatcher; ``controller`` may import ``dispatcher.workload``, ``dispatcher.db`` and the engine's loop.
"""
