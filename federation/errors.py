"""The error tree every layer of mkd speaks; Kubernetes and MQTT exceptions are mapped onto it once.

``federation.kube`` maps ``kubernetes.client.ApiException`` and urllib3 errors onto this tree;
``federation.mqtt`` maps aiomqtt errors; ``dispatcher.db`` (``database_error``, ``mapped``) maps SQLAlchemy's
and the drivers'; nothing else catches library exceptions.
"""

from __future__ import annotations


class FederationError(Exception):
    """Base of every error mkd raises on purpose.

    ::

        FederationError
        ├── Permanent            retrying cannot help: surface a condition and an Event naming the cause
        │   ├── Invalid          user input is wrong: carries the field path and the fix
        │   └── Forbidden        RBAC refused a call (HTTP 403): carries the rule that would allow it
        ├── Temporary(delay)     retry after ``delay`` seconds
        │   ├── Conflict         the object changed under us (stale resourceVersion): re-read, then retry
        │   │   └── AlreadyExists   a create found the name taken
        │   └── Transport        the network, the API server (5xx, 429) or the broker failed
        │       └── DatabaseUnavailable   the database is unreachable or busy (an outage, a restart, a failover)
        └── NotFound             the object is gone (often fine: a delete already happened)
    """


class Permanent(FederationError):
    """Retrying will not help; the message says why in words a user can act on."""

    def __init__(self, message: str, *, reason: str = "Permanent") -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


class Invalid(Permanent):
    """User input is wrong. ``field`` is the JSON path (``spec.pytorchReplicaSpecs.Master.replicas``)."""

    def __init__(self, field: str, message: str, *, fix: str = "") -> None:
        text = f"{field}: {message}" + (f"; {fix}" if fix else "")
        super().__init__(text, reason="Invalid")
        self.field = field
        self.detail = message
        self.fix = fix


class Forbidden(Permanent):
    """The API server refused a call (HTTP 403): ``verb`` on ``resource`` (``plural`` or ``plural/subresource``)
    in API group ``group``; ``fix`` names the RBAC rule that would allow it."""

    def __init__(self, message: str, *, verb: str, group: str, resource: str) -> None:
        super().__init__(message, reason="Forbidden")
        self.verb = verb
        self.group = group
        self.resource = resource

    @property
    def rule(self) -> str:
        """The missing rule as a Role's rules list holds it."""
        return f'{{apiGroups: ["{self.group}"], resources: ["{self.resource}"], verbs: ["{self.verb}"]}}'

    @property
    def fix(self) -> str:
        return f"add the rule {self.rule} to the service's ClusterRole (deploy/) and apply it"


class Temporary(FederationError):
    """Retry after ``delay`` seconds; callers back off with their own cap."""

    def __init__(self, message: str, *, delay: float = 1.0) -> None:
        super().__init__(message)
        self.message = message
        self.delay = delay


class Conflict(Temporary):
    """The object changed since it was read (HTTP 409 Conflict): re-read and retry."""

    def __init__(self, message: str, *, delay: float = 0.0) -> None:
        super().__init__(message, delay=delay)


class AlreadyExists(Conflict):
    """A create found the name taken (HTTP 409 AlreadyExists)."""


class Transport(Temporary):
    """The network, the API server (5xx, 429) or the broker failed; the operation may be retried."""


class DatabaseUnavailable(Transport):
    """The database is unreachable or busy (an outage, a restart, a failover, a lock timeout): the same
    work succeeds once it is back, however long that takes. ``delay`` 0: the caller's backoff decides."""

    def __init__(self, message: str, *, delay: float = 0.0) -> None:
        super().__init__(message, delay=delay)


class NotFound(FederationError):
    """The object does not exist (HTTP 404)."""
