"""mkd's minimal CRDs for the job kinds it supports, shipped as package data.

One ``apiextensions.k8s.io/v1`` YAML file per CRD in this directory: structural schemas that keep
unknown fields under ``spec`` and ``status``, the status subresource, the upstream printer columns,
and a schema for managedBy (allowed values, immutable). Install them with
``kubectl apply -k deploy/crds`` (every CRD mkd needs; ``Kustomization`` here lists these files; ``kubectl apply -f`` on this folder ignores it)
or :func:`load_crds` plus ``federation.kube``.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml


def load_crds() -> list[dict[str, Any]]:
    """Every CRD manifest of this package, sorted by file name (= ``<plural>.<group>``)."""
    folder = resources.files(__name__)
    out: list[dict[str, Any]] = []
    for entry in sorted(folder.iterdir(), key=lambda item: item.name):
        if entry.name.endswith(".yaml"):
            document = yaml.safe_load(entry.read_text(encoding="utf-8"))
            if isinstance(document, dict) and document.get("kind") == "CustomResourceDefinition":
                out.append(document)
    return out
