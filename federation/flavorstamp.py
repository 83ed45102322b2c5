"""Stamping a quota reservation's flavors on a Job's pod templates: pure, shared by both sides.

Kueue, when it admits a Workload with a ResourceFlavor, adds the flavor's node labels to the pods'
``nodeSelector`` and its tolerations to their ``tolerations``. mkd's agent does the same on the
worker copy (``worker_agent.inbox``), from the Place Command's ``pod_scheduling``. The pod templates
are found by walking the manifest (every object with ``spec.containers``); a template belongs to the
PodSet whose name matches a key or a ``name`` on its path, case-insensitively (``pytorchReplicaSpecs
.Worker.template`` → ``worker``, ``replicatedJobs[name=trainer]`` → ``trainer``). When every PodSet
got the same flavors, every template is stamped.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from federation.messages import PodScheduling


def _templates(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    if isinstance(node, dict):
        spec = node.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("containers"), list):
            yield path, node
            return
        for key, value in node.items():
            yield from _templates(value, (*path, str(key)))
    elif isinstance(node, list):
        for item in node:
            name = item.get("name") if isinstance(item, dict) else None
            yield from _templates(item, (*path, str(name)) if isinstance(name, str) else path)


def stamp(manifest: dict[str, Any], scheduling: Mapping[str, PodScheduling]) -> int:
    """Add each PodSet's flavor nodeSelector and tolerations to its pod templates in place; returns
    how many templates were stamped."""
    if not scheduling:
        return 0
    distinct = {s.model_dump_json() for s in scheduling.values()}
    single = next(iter(scheduling.values())) if len(distinct) == 1 else None
    names = {name.lower(): value for name, value in scheduling.items()}
    count = 0
    for path, template in _templates(manifest.get("spec") or {}):
        chosen = single
        if chosen is None:
            for part in reversed(path):
                if part.lower() in names:
                    chosen = names[part.lower()]
                    break
        if chosen is None:
            continue
        spec = template["spec"]
        if chosen.node_selector:
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **chosen.node_selector}
        if chosen.tolerations:
            have = list(spec.get("tolerations") or [])
            spec["tolerations"] = have + [t for t in chosen.tolerations if t not in have]
        count += 1
    return count
