"""Command-line flags generated from a service's pydantic-settings class, so flags and env vars never drift.

Each field of the settings class (nested groups such as ``mqtt`` and ``kube`` flattened) becomes one
``--flag``; its help is the field's docstring, its env var the one pydantic-settings reads. Flags
default to "not given": the command builds the settings object from the flags that *were* given as
init arguments, and pydantic-settings fills the rest from the environment and the defaults, so a
flag beats an env var and an env var beats a default. The same walk produces the configuration
reference in docs/CONFIGURATION.md (``mkctl settings``).
"""

from __future__ import annotations

import ast
import enum
import inspect
import itertools
import json
import textwrap
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from rich.markup import escape

from mkctl.errors import EXIT_USAGE, CommandFailed, flag_namer

S = TypeVar("S", bound=BaseModel)

# kubectl's spelling for the two settings every Kubernetes tool has.
_ALIASES = {("kube", "kubeconfig"): "--kubeconfig", ("kube", "context"): "--context"}


@dataclass(frozen=True)
class Setting:
    """One leaf of a settings class: where it sits, how it is spelled on the CLI and in the env."""

    path: tuple[str, ...]
    flag: str
    env: str
    annotation: Any
    default: Any
    doc: str
    shape: Literal["scalar", "bool", "structured"]
    secret: bool

    @property
    def param(self) -> str:
        return "__".join(self.path)

    @property
    def group(self) -> str:
        return self.path[0] if len(self.path) > 1 else "general"

    def default_text(self) -> str:
        if self.secret:
            return "-"
        if self.default is None or self.default is PydanticUndefined:
            return "-" if self.default is None else "(required)"
        if isinstance(self.default, enum.Enum):
            return str(self.default.value)
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        if isinstance(self.default, dict | list | tuple):
            return json.dumps(self.default) if self.default else "-"
        return str(self.default)


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal under a field), through the MRO, as pydantic reads them."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass in (object, BaseModel) or klass.__module__.startswith(("pydantic", "pydantic_settings")):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, nxt in itertools.pairwise(body):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def _doc(cls: type, name: str, info: FieldInfo) -> str:
    text = info.description or field_docs(cls).get(name, "")
    return " ".join(text.split())


def _env_names(cls: type[BaseModel]) -> tuple[str, str | None]:
    config = getattr(cls, "model_config", {})
    return str(config.get("env_prefix", "") or ""), config.get("env_nested_delimiter") or None


def settings_of(cls: type[BaseModel]) -> list[Setting]:
    """Every leaf setting of ``cls``, nested groups flattened, in declaration order."""
    prefix, delimiter = _env_names(cls)
    out: list[Setting] = []
    for name, info in cls.model_fields.items():
        inner = _unwrap_optional(info.annotation)
        env_top = (info.alias if isinstance(info.alias, str) else prefix + name).upper()
        if _is_model(inner):
            for sub, sub_info in inner.model_fields.items():
                if sub in cls.model_fields and not _is_model(_unwrap_optional(cls.model_fields[sub].annotation)):
                    continue  # the top-level setting of that name is the flag (--kubeconfig, not --kube-kubeconfig)
                env = f"{env_top}{delimiter}{sub.upper()}" if delimiter else f"{env_top} (JSON: {{\"{sub}\": ...}})"
                out.append(_leaf(inner, (name, sub), sub_info, env, _group_default(info, sub, sub_info)))
        else:
            out.append(_leaf(cls, (name,), info, env_top, info.get_default(call_default_factory=True)))
    _make_flags_unique(out)
    return out


def _group_default(group: FieldInfo, sub: str, sub_info: FieldInfo) -> Any:
    default = group.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        return getattr(default, sub, None)
    return sub_info.get_default(call_default_factory=True)


def _leaf(owner: type, path: tuple[str, ...], info: FieldInfo, env: str, default: Any) -> Setting:
    inner = _unwrap_optional(info.annotation)
    if inner is bool:
        shape: Literal["scalar", "bool", "structured"] = "bool"
    elif inner in (str, int, float, Path) or typing.get_origin(inner) is Literal or (
            isinstance(inner, type) and issubclass(inner, enum.Enum)):
        shape = "scalar"
    else:
        shape = "structured"
    if len(path) == 1:
        flag = "--" + path[0].replace("_", "-")
    elif path in _ALIASES:
        flag = _ALIASES[path]
    elif path[1].startswith(path[0]):
        flag = "--" + path[1].replace("_", "-")
    else:
        flag = "--" + "-".join(path).replace("_", "-")
    secret = any(word in path[-1] for word in ("password", "secret", "token"))
    return Setting(path, flag, env, info.annotation, default, _doc(owner, path[-1], info), shape, secret)


def _make_flags_unique(settings: list[Setting]) -> None:
    seen: set[str] = set()
    for i, s in enumerate(settings):
        if s.flag in seen:
            s = Setting(s.path, "--" + "-".join(s.path).replace("_", "-"), s.env, s.annotation, s.default,
                        s.doc, s.shape, s.secret)
            settings[i] = s
        seen.add(s.flag)


def _option_type(s: Setting) -> Any:
    inner = _unwrap_optional(s.annotation)
    if s.shape == "bool":
        return bool
    if inner in (int, float, Path):
        return inner
    return str


def _help(s: Setting) -> str:
    first = s.doc.split(". ")[0].rstrip(".") if s.doc else ""
    text = f"{first}. [env: {s.env}; default: {s.default_text()}]" if first else \
        f"[env: {s.env}; default: {s.default_text()}]"
    return escape(text.replace("``", "'"))  # typer renders help as rich markup


def parameters(settings: list[Setting]) -> list[inspect.Parameter]:
    """One keyword parameter per setting, typed and annotated the way typer reads options."""
    params = []
    for s in settings:
        names = [f"{s.flag}/--no-{s.flag[2:]}"] if s.shape == "bool" else [s.flag]
        option = typer.Option(*names, help=_help(s), rich_help_panel="Settings" if s.group == "general" else f"Settings: {s.group}",
                              show_default=False)
        params.append(inspect.Parameter(s.param, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Annotated[_option_type(s) | None, option]))
    return params


def parse_structured(s: Setting, text: str) -> Any:
    """``{...}``/``[...]`` is JSON; otherwise ``k=v,k2=v2`` for maps and ``a,b`` for lists."""
    text = text.strip()
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise CommandFailed(f"{s.flag}: not valid JSON ({exc.msg})", code=EXIT_USAGE) from None
    inner = _unwrap_optional(s.annotation)
    origin = typing.get_origin(inner) or inner
    if origin is dict or (isinstance(origin, type) and issubclass(origin, dict)):
        pairs = [p for p in text.split(",") if p.strip()]
        if not all("=" in p for p in pairs):
            raise CommandFailed(f"{s.flag}: expected key=value[,key=value...] or JSON, got {text!r}",
                                code=EXIT_USAGE)
        return dict(p.strip().split("=", 1) for p in pairs)
    if origin in (list, tuple, set, frozenset):
        return [p.strip() for p in text.split(",") if p.strip()]
    return text


def build(cls: type[S], given: dict[str, Any], settings: list[Setting] | None = None) -> S:
    """The settings object from the flags given (by parameter name); env and defaults fill the rest."""
    settings = settings if settings is not None else settings_of(cls)
    values: dict[str, Any] = {}
    for s in settings:
        value = given.get(s.param)
        if value is None:
            continue
        if s.shape == "structured" and isinstance(value, str):
            value = parse_structured(s, value)
        node = values
        for part in s.path[:-1]:
            node = node.setdefault(part, {})
        node[s.path[-1]] = value
    try:
        return cls(**values)
    except ValidationError as exc:
        names = {s.path: f"{s.flag} / {s.env}" for s in settings}
        names.update({s.path[:1]: f"{s.path[0]} settings" for s in settings if len(s.path) > 1 and
                      s.path[:1] not in names})
        from mkctl.errors import describe

        message, _ = describe(exc, flag_for=flag_namer(names))
        raise CommandFailed(message, code=EXIT_USAGE) from None


def settings_command(cls: type[S], run: Callable[..., None], *, extra: Sequence[inspect.Parameter] = (),
                     name: str, doc: str) -> Callable[..., None]:
    """A function typer turns into a command: the extra parameters, then one flag per setting.

    ``run(settings, **extra_values)`` is called with the built settings object.
    """
    settings = settings_of(cls)
    params = list(extra) + parameters(settings)
    extra_names = {p.name for p in extra}

    def command(**kwargs: Any) -> None:
        extras = {k: kwargs.pop(k) for k in list(kwargs) if k in extra_names}
        run(build(cls, kwargs, settings), **extras)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    command.__name__ = name
    command.__doc__ = doc
    return command


def reference_rows(cls: type[BaseModel]) -> Iterator[tuple[str, str, str, str]]:
    """(flag, env var, default, meaning) per setting: the configuration reference (docs/CONFIGURATION.md)."""
    for s in settings_of(cls):
        yield s.flag, s.env, s.default_text(), s.doc


def reference_markdown(cls: type[BaseModel]) -> str:
    lines = ["| flag | env var | default | meaning |", "|---|---|---|---|"]
    for flag, env, default, doc in reference_rows(cls):
        lines.append(f"| `{flag}` | `{env}` | `{default}` | {doc.replace('|', '/')} |")
    return "\n".join(lines)
