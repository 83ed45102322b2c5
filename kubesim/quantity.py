"""resource.Quantity as the API server stores and returns it: parsed, then written in canonical form.

A real server decodes ``resources.requests/limits`` (and other Quantity fields) into resource.Quantity and
encodes them back canonically, always as JSON strings: ``1`` -> ``"1"``, ``0.5`` -> ``"500m"``, ``"1000m"``
-> ``"1"``, ``"2048Ki"`` -> ``"2Mi"``, ``"1.5Gi"`` -> ``"1536Mi"``, ``"1e3"`` -> ``"1e3"``. Precision
beyond nano is rounded up. A value that is not a quantity fails decoding: 400 ``... cannot be handled
as a Pod: quantities must match the regular expression ...``.
Upstream: staging/src/k8s.io/apimachinery/pkg/api/resource/quantity.go (ParseQuantity, CanonicalizeBytes).
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, localcontext
from typing import Any

from kubesim.errors import ApiError

SPLIT_RE = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
_SPLIT = re.compile(SPLIT_RE)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {v: k for k, v in _DECIMAL.items()}
_BINARY_SUFFIX = {v: k for k, v in _BINARY.items()}
_CACHE: dict[str, str] = {}


class QuantityError(ValueError):
    pass


def _text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise QuantityError("quantities must match the regular expression '" + SPLIT_RE + "'")
    return value if isinstance(value, str) else (str(value) if isinstance(value, int) else repr(value))


def canonical(value: Any) -> str:
    """The canonical string form of a quantity given as a JSON string or number."""
    text = _text(value)
    hit = _CACHE.get(text)
    if hit is not None:
        return hit
    out = _canonical(text.strip())
    if len(_CACHE) < 4096:
        _CACHE[text] = out
    return out


def parse(value: Any) -> Decimal:
    """The exact amount of a quantity given as a JSON string or number, in base units (cores, bytes,
    counts), before any rounding; :class:`QuantityError` when it is not one."""
    with localcontext() as ctx:
        ctx.prec = 80
        return _parse(_text(value).strip())[1]


def _parse(text: str) -> tuple[str, Decimal]:
    """(format, amount) of ``text``: the grammar of ParseQuantity; the caller sets the precision."""
    m = _SPLIT.match(text)
    if not m or m.group(1).count(".") > 1 or m.group(1) in (".", "+.", "-."):
        raise QuantityError("quantities must match the regular expression '" + SPLIT_RE + "'")
    number, suffix = m.group(1), m.group(2)
    num = Decimal(number)
    if suffix in _BINARY:
        return "BinarySI", num * (Decimal(2) ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return "DecimalSI", num.scaleb(_DECIMAL[suffix])
    if suffix[:1] in ("e", "E") and re.fullmatch(r"[eE][-+]?[0-9]+", suffix):
        return "DecimalExponent", num.scaleb(int(suffix[1:]))
    raise QuantityError("unable to parse quantity's suffix")


def _canonical(text: str) -> str:
    with localcontext() as ctx:
        ctx.prec = 80
        fmt, val = _parse(text)
        # Quantities keep at most nano precision, rounding up.
        val = val.quantize(Decimal("1e-9"), rounding=ROUND_CEILING) if val != val.to_integral_value() else val
        if val == 0:
            return "0"
        if fmt == "BinarySI" and (-1024 < val < 1024 or val != val.to_integral_value()):
            fmt = "DecimalSI"
        if fmt == "BinarySI":
            n, exp = int(val), 0
            while n % 1024 == 0 and exp < 60:
                n //= 1024
                exp += 10
            return f"{n}{_BINARY_SUFFIX[exp]}" if exp else str(n)
        # Decimal: an integer mantissa without trailing zeros, its exponent moved down to a multiple of 3.
        sign, digits, exponent = val.normalize().as_tuple()
        mantissa = int("".join(map(str, digits))) * (-1 if sign else 1)
        exp = int(exponent)
        while exp % 3 != 0:
            mantissa *= 10
            exp -= 1
        if fmt == "DecimalSI" and exp in _DECIMAL_SUFFIX:
            return f"{mantissa}{_DECIMAL_SUFFIX[exp]}"
        if fmt == "DecimalSI" and exp > 18:
            return f"{mantissa * 10 ** (exp - 18)}E"
        return f"{mantissa}e{exp}" if exp else str(mantissa)


def normalize_map(resources: Any, path: str) -> None:
    """Canonicalize a ``{name: quantity}`` map in place; a bad value is the decode error a real server gives."""
    if not isinstance(resources, dict):
        return
    for k, v in resources.items():
        try:
            resources[k] = canonical(v)
        except QuantityError as e:
            raise ApiError(400, "BadRequest", f"{path}: {e}") from None
