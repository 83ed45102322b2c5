"""``json_copy``: a deep copy of JSON data (what the API server, MQTT and the caches hand around).

``copy.deepcopy`` walks a Kubernetes object one Python call per node: about 44 µs for a
two-replica PyTorchJob. A round trip through orjson makes the same copy in about 7 µs, and the
agent and the dispatcher copy manifests, pod templates and statuses several times per job. For JSON
values (dicts with str keys, lists, str, int, float, bool, None) the copy is exact. A value JSON cannot hold (a non-str key, an integer beyond 64 bits, a dict or list subclass,
any other object) is copied by ``copy.deepcopy`` instead. A tuple comes back as a list and a float that
JSON cannot write (NaN, infinity) as None: use this for data decoded from JSON (which holds neither),
not for arbitrary Python structures.
"""

from __future__ import annotations

import copy
from typing import TypeVar

import orjson

T = TypeVar("T")


def json_copy(value: T) -> T:
    """A deep copy of the JSON data ``value`` (see the module docstring)."""
    try:
        data = orjson.dumps(value, option=orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME)
    except TypeError:
        return copy.deepcopy(value)
    out: T = orjson.loads(data)
    return out
