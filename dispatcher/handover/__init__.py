"""Gradual handover between controllers: which Jobs mkd takes from another controller, and never a started one.

``policy.py`` reads HandoverPolicy objects (pure); ``safety.py`` says a Job already started elsewhere is
never claimed (imported by the engine); ``book.py`` and ``queries.py`` keep the counts per controller and
the shadow records; ``webhook.py`` is the mutating admission webhook and ``service.py`` its tasks. The
package may import ``dispatcher.db``, ``placement``, ``workload`` and ``queueing.api``; ``service`` also
the HTTP server's helpers in ``dispatcher.api``.
"""
