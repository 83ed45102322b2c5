"""``mkd_messages_refused_total{reason}``: every message either side refuses, by reason.

Reasons come from the seal check (``unsigned``, ``malformed``, ``unknown_key``, ``bad_signature``,
``expired``, ``replay``, see ``federation.signing``), from the sender checks (``unregistered``: a
cluster nobody registered; ``wrong_cluster``: a Report naming another cluster than its topic;
``epoch``: an epoch the dispatcher never issued) and from decoding (``invalid``). The counter lives
in the default prometheus-client registry, so whichever metrics endpoint a service serves shows it.
"""

from __future__ import annotations

from prometheus_client import Counter

REFUSED = Counter("mkd_messages_refused", "Messages refused on receipt, by reason", ["reason"])


def refused(reason: str) -> None:
    REFUSED.labels(reason=reason).inc()


def count(reason: str) -> float:
    """The current value for one reason (tests and logs)."""
    return float(REFUSED.labels(reason=reason)._value.get())
