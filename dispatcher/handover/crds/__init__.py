"""The HandoverPolicy CRD, shipped as package data (``kubectl apply -k deploy/crds`` installs it too)."""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml


def load_crd() -> dict[str, Any]:
    text = resources.files(__name__).joinpath("handoverpolicies.handover.mkd.dev.yaml").read_text(encoding="utf-8")
    crd: dict[str, Any] = yaml.safe_load(text)
    return crd
