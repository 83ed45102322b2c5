"""Resource arithmetic for the simulated scheduler: quantities and a pod's effective requests.

Quantities ("500m", "2Gi", "1e3") are read with kubesim's one parser (``kubesim.quantity.parse``); this
module owns the scheduler's rule for what a pod asks of a node: max(sum of the app containers and sidecar init
containers, each init container plus the sidecars started before it) plus the pod overhead, with a
container's limits standing in for missing requests, and one unit of the ``pods`` resource.
Amounts are ``int`` in base units scaled so they compare exactly: cpu in millicores, everything
else in whole units (bytes, counts); fractional bytes round up as the API server's canonical form does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from kubesim.quantity import parse

Resources = dict[str, int]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
"""For writing amounts back out (``format_amount``); reading them is ``kubesim.quantity.parse``'s."""
_MILLI_RESOURCES = frozenset({"cpu"})
_cache: dict[tuple[str, str], int] = {}


def parse_quantity(value: str | int | float, resource: str = "") -> int:
    """A quantity in kubesim's base units for ``resource`` (millicores for cpu); ValueError if bad."""
    key = (str(value), resource)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    amount = parse(value)
    if amount < 0:
        raise ValueError(f"quantity {value!r} must be non-negative")
    if resource in _MILLI_RESOURCES:
        amount *= 1000
    result = math.ceil(amount)
    if len(_cache) < 10_000:
        _cache[key] = result
    return result


def quantities(values: Mapping[str, Any] | None) -> Resources:
    """A ResourceList (``{"cpu": "500m", ...}``) in base units; unparsable entries count as 0."""
    out: Resources = {}
    for name, value in (values or {}).items():
        try:
            out[name] = parse_quantity(value, name)
        except ValueError:
            out[name] = 0
    return out


def add_into(total: Resources, more: Mapping[str, int]) -> None:
    for name, amount in more.items():
        total[name] = total.get(name, 0) + amount


def max_into(total: Resources, other: Mapping[str, int]) -> None:
    for name, amount in other.items():
        if amount > total.get(name, 0):
            total[name] = amount


def _container_requests(container: Mapping[str, Any]) -> Resources:
    res = container.get("resources") or {}
    requests = quantities(res.get("requests"))
    # The API server defaults requests from limits when requests are absent; the scheduler sees that.
    for name, amount in quantities(res.get("limits")).items():
        requests.setdefault(name, amount)
    return requests


def pod_requests(spec: Mapping[str, Any]) -> Resources:
    """What the scheduler counts a pod as using on its node (base units, plus ``pods: 1``)."""
    total: Resources = {}
    for container in spec.get("containers") or ():
        add_into(total, _container_requests(container))
    sidecars: Resources = {}
    init_peak: Resources = {}
    for init in spec.get("initContainers") or ():
        req = _container_requests(init)
        if init.get("restartPolicy") == "Always":
            # A sidecar keeps running next to everything started after it.
            add_into(sidecars, req)
            step = dict(sidecars)
        else:
            step = dict(sidecars)
            add_into(step, req)
        max_into(init_peak, step)
    add_into(total, sidecars)
    max_into(total, init_peak)
    add_into(total, quantities(spec.get("overhead")))
    total["pods"] = total.get("pods", 0) + 1
    return {name: amount for name, amount in total.items() if amount}


def format_amount(resource: str, amount: int) -> str:
    """A base-unit amount back in Kubernetes form (for messages and node status)."""
    if resource in _MILLI_RESOURCES:
        return f"{amount // 1000}" if amount % 1000 == 0 else f"{amount}m"
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        factor = _BINARY[suffix]
        if amount and amount % factor == 0:
            return f"{amount // factor}{suffix}"
    return str(amount)


def insufficient(need: Mapping[str, int], free: Mapping[str, int]) -> list[str]:
    """Names of the resources ``need`` asks for beyond ``free``, sorted."""
    return sorted(name for name, amount in need.items() if amount > free.get(name, 0))


def sorted_items(res: Mapping[str, int]) -> Iterable[tuple[str, int]]:
    return sorted(res.items())
