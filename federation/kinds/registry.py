"""The explicit list of supported job kinds and the two lookups over it (no import side effects)."""

from __future__ import annotations

from federation.errors import Invalid
from federation.kinds.appwrapper import APPWRAPPER
from federation.kinds.base import JobKind
from federation.kinds.batchjob import BATCH_JOB
from federation.kinds.jax import JAXJOB
from federation.kinds.jobset import JOBSET
from federation.kinds.leaderworkerset import LEADERWORKERSET
from federation.kinds.mpijob import MPIJOB
from federation.kinds.paddle import PADDLEJOB
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
)

_BY_NAME = {kind.name: kind for kind in KINDS}
_BY_API = {(kind.api_version, kind.name): kind for kind in KINDS}


def by_name(name: str) -> JobKind:
    """The kind called ``name`` (``PyTorchJob``, ``Job``, ...); raises :class:`Invalid` for unknown names."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise Invalid(
            "kind", f"unsupported job kind {name!r}", fix=f"use one of {', '.join(sorted(_BY_NAME))}"
        ) from None


def by_api(api_version: str, kind: str) -> JobKind | None:
    """The kind for an object's apiVersion and kind, or None when mkd does not support it."""
    return _BY_API.get((api_version, kind))
