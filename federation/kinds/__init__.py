"""Job kinds: the :class:`JobKind` protocol (``base``), one module per kind, the explicit ``registry``.

Importing this package imports only the protocol and its value types; the kinds themselves are
listed in :mod:`federation.kinds.registry`.
"""

from federation.kinds.base import Finished, JobKind, RuntimeRef

__all__ = ["Finished", "JobKind", "RuntimeRef"]
