"""Output formats for the admin commands, as kubectl has them: ``-o table|wide|json|yaml``.

A command hands over rows (plain dicts of JSON-able values) and the columns to show; ``table``
shows the narrow set, ``wide`` adds the extra columns, ``json`` and ``yaml`` print every field of
every row so scripts never depend on what fits on a screen. Tables are plain text with aligned
columns (no box drawing) so they read the same in a terminal, a pipe and CI logs.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import yaml


class OutputFormat(enum.StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"


@dataclass(frozen=True)
class Column:
    """One table column: its header and the row key it shows; ``wide`` columns only in ``-o wide``."""

    header: str
    key: str
    wide: bool = False


def to_jsonable(value: Any) -> Any:
    """Rows may hold datetimes, Decimals, enums and tuples; json/yaml get strings and lists."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value.tzinfo else value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    return value


def age(since: datetime | None, now: datetime | None = None) -> str:
    """kubectl's compact age: ``45s``, ``12m``, ``3h4m``, ``2d``; ``-`` when unknown."""
    if since is None:
        return "-"
    if since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    delta = (now or datetime.now(UTC)) - since
    return duration(delta.total_seconds())


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    return f"{timedelta(seconds=seconds).days}d"


def cell(value: Any) -> str:
    """How one value reads in a table cell: ``-`` for nothing, ages for datetimes, ``k=v`` for maps."""
    if value is None or value == "" or value == [] or value == {}:
        return "-"
    if isinstance(value, datetime):
        return age(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return ",".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ",".join(cell(v) for v in value)
    text = str(to_jsonable(value))
    return " ".join(text.split())  # a cell is one line, whatever the message held


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], *, wide: bool = False,
          max_width: int = 80) -> str:
    """Aligned plain-text table, kubectl style; a cell longer than ``max_width`` is cut with '…'."""
    shown = [c for c in columns if wide or not c.wide]
    cells = [[_cut(cell(row.get(c.key)), max_width if not wide else 10 * max_width) for c in shown]
             for row in rows]
    widths = [max([len(c.header)] + [len(r[i]) for r in cells]) for i, c in enumerate(shown)]
    lines = ["   ".join(c.header.upper().ljust(w) for c, w in zip(shown, widths, strict=True)).rstrip()]
    lines += ["   ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def render(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], fmt: OutputFormat,
           *, kind: str = "List", empty: str = "No resources found.") -> str:
    """The whole output of a list command in the chosen format."""
    if fmt is OutputFormat.json:
        return json.dumps({"kind": kind, "items": to_jsonable(list(rows))}, indent=2, sort_keys=False)
    if fmt is OutputFormat.yaml:
        return yaml.safe_dump({"kind": kind, "items": to_jsonable(list(rows))}, sort_keys=False,
                              allow_unicode=True).rstrip()
    if not rows:
        return empty
    return table(rows, columns, wide=fmt is OutputFormat.wide)


def render_one(obj: Mapping[str, Any], fmt: OutputFormat, *, sections: Sequence[tuple[str, Sequence[
        Mapping[str, Any]], Sequence[Column]]] = ()) -> str:
    """One object: json/yaml print it whole; table/wide print ``key: value`` lines, then sub-tables."""
    if fmt is OutputFormat.json:
        return json.dumps(to_jsonable(obj), indent=2)
    if fmt is OutputFormat.yaml:
        return yaml.safe_dump(to_jsonable(obj), sort_keys=False, allow_unicode=True).rstrip()
    scalars = {k: v for k, v in obj.items() if not isinstance(v, list | tuple)}
    width = max((len(k) for k in scalars), default=0) + 1
    out = [f"{(k + ':').ljust(width)} {_scalar(v)}" for k, v in scalars.items()]
    for title, rows, columns in sections:
        out.append("")
        out.append(f"{title}:")
        body = table(rows, columns, wide=fmt is OutputFormat.wide) if rows else "<none>"
        out.extend("  " + line for line in body.splitlines())
    return "\n".join(out)


def _scalar(value: Any) -> str:
    if isinstance(value, datetime):
        return f"{to_jsonable(value)} ({age(value)} ago)"
    if isinstance(value, Mapping):
        return json.dumps(to_jsonable(value), sort_keys=True) if value else "-"
    return cell(value)
