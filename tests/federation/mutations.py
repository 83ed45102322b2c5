"""Mutations for the broken-variant tests: each returns a function that breaks one field of a manifest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Manifest = dict[str, Any]


def set_at(path: list[Any], value: Any) -> Callable[[Manifest], None]:
    """Set the field at ``path`` (keys and list indexes) to ``value``."""
    def mutate(obj: Manifest) -> None:
        node = obj
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


def delete_at(path: list[Any]) -> Callable[[Manifest], None]:
    """Remove the field at ``path``."""
    def mutate(obj: Manifest) -> None:
        node = obj
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return mutate
