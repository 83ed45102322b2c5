"""The explicit list of supported job kinds, the kinds declared in configuration, and the lookups over both.

:data:`KINDS` is mkd's own kinds (no import side effects). A service that reads a declarations file
(:mod:`federation.kinds.declared`) adds its kinds for as long as it runs (:func:`declared`), so every lookup in the
process (:func:`kinds`, :func:`by_name`, :func:`by_api`) finds them; services in one process (the demo, tests)
declaring the same kinds share them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from federation.errors import Invalid
from federation.kinds.appwrapper import APPWRAPPER
from federation.kinds.base import JobKind
from federation.kinds.batchjob import BATCH_JOB
from federation.kinds.jax import JAXJOB
from federation.kinds.jobset import JOBSET
from federation.kinds.leaderworkerset import LEADERWORKERSET
from federation.kinds.mpijob import MPIJOB
from federation.kinds.paddle import PADDLEJOB
from federation.kinds.pod import POD
from federation.kinds.pytorch import PYTORCHJOB
from federation.kinds.raycluster import RAYCLUSTER
from federation.kinds.rayjob import RAYJOB
from federation.kinds.rayservice import RAYSERVICE
from federation.kinds.tfjob import TFJOB
from federation.kinds.trainjob import TRAINJOB
from federation.kinds.xgboost import XGBOOSTJOB

KINDS: tuple[JobKind, ...] = (
    PYTORCHJOB,
    TFJOB,
    XGBOOSTJOB,
    PADDLEJOB,
    JAXJOB,
    MPIJOB,
    TRAINJOB,
    BATCH_JOB,
    JOBSET,
    RAYJOB,
    RAYCLUSTER,
    RAYSERVICE,
    APPWRAPPER,
    LEADERWORKERSET,
    POD,
)

_BY_NAME = {kind.name: kind for kind in KINDS}
_BY_API = {(kind.api_version, kind.name): kind for kind in KINDS}
_DECLARED: dict[str, tuple[JobKind, int]] = {}
"""Declared kinds in use: name -> (kind, how many services declared it)."""


def kinds() -> tuple[JobKind, ...]:
    """mkd's kinds, then those declared by the services running in this process."""
    return (*KINDS, *(kind for kind, _ in _DECLARED.values()))


@contextlib.contextmanager
def declared(more: Sequence[JobKind]) -> Iterator[None]:
    """``more`` (declared kinds) are known to every lookup until the block ends. A kind another running service
    declared differently is refused (two services of one process must read the same declarations)."""
    for kind in more:
        if kind.name in _BY_NAME:
            raise Invalid("kind", f"{kind.name} is one of mkd's own kinds", fix="do not declare it")
        held = _DECLARED.get(kind.name)
        if held is not None and held[0] != kind:
            raise Invalid("kind", f"{kind.name} is declared differently by another service of this process",
                          fix="give every service the same declarations file")
    for kind in more:
        held = _DECLARED.get(kind.name)
        _DECLARED[kind.name] = (kind, (held[1] if held else 0) + 1)
    try:
        yield
    finally:
        for kind in more:
            held = _DECLARED.get(kind.name)
            if held is None:
                continue
            if held[1] <= 1:
                del _DECLARED[kind.name]
            else:
                _DECLARED[kind.name] = (held[0], held[1] - 1)


def by_name(name: str) -> JobKind:
    """The kind called ``name`` (``PyTorchJob``, ``Job``, a declared one); raises :class:`Invalid` for unknown
    names."""
    found = _BY_NAME.get(name)
    if found is None:
        held = _DECLARED.get(name)
        if held is None:
            known = sorted([*_BY_NAME, *_DECLARED])
            raise Invalid("kind", f"unsupported job kind {name!r}",
                          fix=f"use one of {', '.join(known)}, or declare it (kinds_file)")
        found = held[0]
    return found


def by_api(api_version: str, kind: str) -> JobKind | None:
    """The kind for an object's apiVersion and kind, or None when mkd does not support it."""
    found = _BY_API.get((api_version, kind))
    if found is None:
        held = _DECLARED.get(kind)
        if held is not None and held[0].api_version == api_version:
            return held[0]
    return found
