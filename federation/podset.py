"""Resource quantities, their exact arithmetic, per-pod requests and PodSets.

A quantity is parsed by the Kubernetes ``resource.Quantity`` rules (an optionally signed decimal
number followed by a binary suffix ``Ki Mi Gi Ti Pi Ei``, a decimal suffix ``n u m k M G T P E``
or a decimal exponent ``e3`` / ``E-2``) into a :class:`~decimal.Decimal` in base units: cores for
cpu, bytes for memory, plain counts for everything else. Like the API server, amounts are rounded
up (away from zero) to the nano unit and capped at 2^63-1. ``pod_requests`` adds a pod up the way
the scheduler does (``k8s.io/component-helpers/resource.PodRequests``): regular containers and
sidecars (init containers with ``restartPolicy: Always``) are summed, each regular init container
counts together with the sidecars started before it, the larger of the two wins per resource,
then ``spec.overhead`` is added. A :class:`PodSet` is a named group of identical pods.
"""

from __future__ import annotations

import decimal
import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from federation.errors import Invalid

Resources = dict[str, Decimal]
"""Resource name -> amount in base units (cores, bytes, counts)."""

# Exact decimal arithmetic: 60 digits hold 2^63 with nine fractional digits and room to spare.
_CTX = decimal.Context(prec=60, rounding=decimal.ROUND_HALF_EVEN, Emax=10**6, Emin=-(10**6))

_NANO = Decimal("1e-9")
MAX_QUANTITY = Decimal(2**63 - 1)
"""The API server caps every quantity at this many base units."""

_BINARY = {"Ki": 10, "Mi": 20, "Ti": 40, "Gi": 30, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_DESC = sorted(_BINARY.items(), key=lambda item: -item[1])
_DECIMAL_DESC = sorted(_DECIMAL.items(), key=lambda item: -item[1])
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_FIX = "write a Kubernetes quantity such as 500m, 2, 1.5, 2Gi, 512Mi or 1e3"

# Resources whose natural unit is the byte: formatted with a binary suffix when that is shorter.
_BYTE_RESOURCES = ("memory", "ephemeral-storage", "storage")


def parse_quantity(value: str | int | float | Decimal, field: str) -> Decimal:
    """Parse a Kubernetes quantity into base units; raise :class:`Invalid` naming ``field`` if malformed."""
    if isinstance(value, bool):
        raise Invalid(field, f"{value!r} is not a quantity", fix=_FIX)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise Invalid(field, f"{value!r} is not a finite quantity", fix=_FIX)
        return _bound(value, field)
    if isinstance(value, int):
        return _bound(Decimal(value), field)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Invalid(field, f"{value!r} is not a finite quantity", fix=_FIX)
        return _bound(_CTX.create_decimal(repr(value)), field)
    if not isinstance(value, str):
        raise Invalid(field, f"expected a quantity string, got {type(value).__name__}", fix=_FIX)
    text = value.strip()
    match = _QUANTITY.fullmatch(text)
    if match is None or text != value:
        raise Invalid(field, f"{value!r} is not a valid quantity", fix=_FIX)
    number = _CTX.create_decimal(match["number"])
    if match["sign"] == "-":
        number = -number
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        amount = _CTX.multiply(number, Decimal(2 ** _BINARY[suffix]))
    elif suffix in _DECIMAL:
        amount = number.scaleb(_DECIMAL[suffix], _CTX)
    else:
        exponent = int(suffix[1:])
        if abs(exponent) > 2**31 - 1:  # upstream parses the exponent as an int32
            raise Invalid(field, f"{value!r}: exponent out of range", fix=_FIX)
        if number.is_zero():
            return Decimal(0)
        # decide far-out exponents before scaling so "1e999999999" cannot exhaust the context
        magnitude = number.adjusted() + exponent
        if magnitude > 19:
            return MAX_QUANTITY.copy_sign(number)
        if magnitude < -10:
            return _NANO.copy_sign(number)
        amount = number.scaleb(exponent, _CTX)
    return _bound(amount, field)


def _bound(amount: Decimal, field: str) -> Decimal:
    """Round away from zero to the nano unit and cap at 2^63-1, as the API server does."""
    del field
    if amount.is_zero():
        return Decimal(0)
    if abs(amount) > MAX_QUANTITY:
        return MAX_QUANTITY.copy_sign(amount)
    rounded = amount.quantize(_NANO, rounding=decimal.ROUND_UP, context=_CTX)
    return _normal(rounded)


def _normal(amount: Decimal) -> Decimal:
    """Drop trailing zeros without scientific notation surprises (``Decimal('2E+3')`` -> ``2000``)."""
    if amount.is_zero():
        return Decimal(0)
    reduced = amount.normalize(_CTX)
    if reduced.as_tuple().exponent > 0:  # type: ignore[operator]
        return reduced.quantize(Decimal(1), context=_CTX)
    return reduced


@functools.lru_cache(maxsize=4096)
def format_quantity(amount: Decimal, resource: str = "") -> str:
    """Canonical quantity text: ``500m``, ``4``, ``2k``; ``2Gi`` for byte resources when shorter.
    Remembered: reasons name the same few amounts over and over (equal Decimals format alike)."""
    amount = _normal(_CTX.create_decimal(amount))
    if amount.is_zero():
        return "0"
    sign = "-" if amount < 0 else ""
    magnitude = abs(amount)
    decimal_text = sign + _format_decimal_si(magnitude)
    if _is_byte_resource(resource) and magnitude == magnitude.to_integral_value():
        binary_text = sign + _format_binary_si(int(magnitude))
        if len(binary_text) <= len(decimal_text):
            return binary_text
    return decimal_text


def _is_byte_resource(resource: str) -> bool:
    name = resource.rsplit("/", 1)[-1]
    return name in _BYTE_RESOURCES or name.startswith("hugepages-")


def _format_decimal_si(magnitude: Decimal) -> str:
    # the largest exponent (a multiple of 3) that still leaves an integer mantissa
    for suffix, exponent in _DECIMAL_DESC:
        mantissa = magnitude.scaleb(-exponent, _CTX)
        if mantissa == mantissa.to_integral_value() and mantissa >= 1:
            return f"{int(mantissa)}{suffix}"
    # unreachable for nano-rounded amounts; kept so an odd Decimal still formats as a plain number
    return format(magnitude, "f")


def _format_binary_si(magnitude: int) -> str:
    for suffix, power in _BINARY_DESC:
        if magnitude % (1 << power) == 0:
            return f"{magnitude >> power}{suffix}"
    return str(magnitude)


# --- arithmetic ------------------------------------------------------------------------------


def add(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> Resources:
    """Per-resource sum over the union of names."""
    out = dict(a)
    for name, amount in b.items():
        out[name] = out.get(name, Decimal(0)) + amount
    return out


def sub(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> Resources:
    """Per-resource difference ``a - b`` over the union of names (may go negative)."""
    out = dict(a)
    for name, amount in b.items():
        out[name] = out.get(name, Decimal(0)) - amount
    return out


def scale(a: Mapping[str, Decimal], n: int) -> Resources:
    """Every amount times ``n`` (a pod count)."""
    return {name: amount * n for name, amount in a.items()}


def max_of(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> Resources:
    """Per-resource maximum over the union of names."""
    out = dict(a)
    for name, amount in b.items():
        out[name] = max(out.get(name, Decimal(0)), amount)
    return out


def fits(need: Mapping[str, Decimal], free: Mapping[str, Decimal]) -> bool:
    """True when every needed amount is at most what is free (a missing resource is zero free)."""
    return all(amount <= free.get(name, Decimal(0)) for name, amount in need.items())


def shortfall(need: Mapping[str, Decimal], free: Mapping[str, Decimal]) -> Resources:
    """What is missing per resource; empty when ``need`` fits."""
    out: Resources = {}
    for name, amount in need.items():
        missing = amount - free.get(name, Decimal(0))
        if missing > 0:
            out[name] = missing
    return out


def format_resources(resources: Mapping[str, Decimal]) -> dict[str, str]:
    """Quantity strings per resource, names sorted: for messages, status and logs."""
    return {name: format_quantity(resources[name], name) for name in sorted(resources)}


def parse_resources(values: Mapping[str, Any] | None, field: str) -> Resources:
    """Parse a ``ResourceList`` (``{"cpu": "500m", ...}``); ``field`` is its path."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise Invalid(field, "must be a map of resource name to quantity", fix="write e.g. {cpu: 500m}")
    return {str(name): parse_quantity(amount, f"{field}.{name}") for name, amount in values.items()}


# --- per-pod requests ------------------------------------------------------------------------


def container_requests(container: Mapping[str, Any], field: str) -> Resources:
    """A container's requests; a limit stands in for a missing request (API server defaulting)."""
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise Invalid(f"{field}.resources", "must be a map", fix="write resources: {requests: {...}}")
    limits = parse_resources(resources.get("limits"), f"{field}.resources.limits")
    requests = parse_resources(resources.get("requests"), f"{field}.resources.requests")
    merged = {**limits, **requests}
    for name, amount in merged.items():
        if amount < 0:
            where = "requests" if name in requests else "limits"
            raise Invalid(
                f"{field}.resources.{where}.{name}",
                "must be greater than or equal to 0",
                fix="use a non-negative quantity",
            )
    return merged


def _containers(pod_spec: Mapping[str, Any], key: str, field: str) -> Iterable[tuple[str, Mapping[str, Any]]]:
    items = pod_spec.get(key) or []
    if not isinstance(items, list):
        raise Invalid(f"{field}.{key}", "must be a list of containers", fix=f"write {key}: [{{name, image}}]")
    for index, item in enumerate(items):
        path = f"{field}.{key}[{index}]"
        if not isinstance(item, Mapping):
            raise Invalid(path, "must be a container object", fix="write {name: ..., image: ...}")
        yield path, item


def pod_requests(pod_spec: Mapping[str, Any], field: str = "spec") -> Resources:
    """Per-pod requests as the scheduler counts them, always with ``pods: 1``; raises :class:`Invalid`."""
    regular: Resources = {}
    for path, container in _containers(pod_spec, "containers", field):
        regular = add(regular, container_requests(container, path))
    sidecars: Resources = {}
    init_peak: Resources = {}
    for path, container in _containers(pod_spec, "initContainers", field):
        own = container_requests(container, path)
        if container.get("restartPolicy") == "Always":
            # a sidecar keeps running next to everything started after it
            regular = add(regular, own)
            sidecars = add(sidecars, own)
            init_peak = max_of(init_peak, sidecars)
        else:
            init_peak = max_of(init_peak, add(own, sidecars))
    total = max_of(regular, init_peak)
    # pod-level resources (PodLevelResources) replace the container aggregate for what they name
    pod_level = pod_spec.get("resources")
    if isinstance(pod_level, Mapping) and pod_level:
        total = {**total, **container_requests(pod_spec, field)}
    total = add(total, parse_resources(pod_spec.get("overhead"), f"{field}.overhead"))
    total["pods"] = Decimal(1)
    return total


# --- PodSets ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodSet:
    """A named group of ``count`` identical pods built from ``template`` (a PodTemplateSpec)."""

    name: str
    count: int
    template: dict[str, Any]
    requests: Resources

    def total(self) -> Resources:
        """Requests of the whole group: per-pod requests times count."""
        return scale(self.requests, self.count)


def total_requests(podsets: Sequence[PodSet]) -> Resources:
    """What a Workload needs in one Cluster: the sum of every PodSet's total."""
    out: Resources = {}
    for podset in podsets:
        out = add(out, podset.total())
    return out
