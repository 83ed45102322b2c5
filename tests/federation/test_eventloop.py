"""``federation.eventloop.run``: uvloop's loop where it is installed, asyncio's own where it is not."""

from __future__ import annotations

import asyncio
import builtins
from typing import Any

import pytest

from federation import eventloop


async def loop_kind() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_runs_on_uvloop_where_it_is_installed() -> None:
    pytest.importorskip("uvloop")
    assert eventloop.run(loop_kind()).startswith("uvloop")


def test_runs_on_asyncios_loop_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_uvloop(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "uvloop":
            raise ImportError("no uvloop here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvloop)
    assert eventloop.run(loop_kind()).startswith("asyncio")
