"""Fixtures: a kubesim manager cluster with the PyTorchJob CRD and a migrated database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import kubesim
from dispatcher import db
from federation.kube import Kube
from tests.dispatcher.harness import install_crd


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[Path]:
    """Kubeconfig of a kubesim manager cluster with the PyTorchJob CRD installed."""
    spec = kubesim.ClusterSpec(name="manager", nodes=[kubesim.NodeSpec(name="m1")])
    async with kubesim.serve_async([spec], tmp_path / "sim") as sim:
        path = sim.kubeconfig("manager")
        await install_crd(path)
        yield path


@pytest.fixture
async def kube(manager: Path) -> AsyncIterator[Kube]:
    async with Kube(manager) as k:
        yield k


@pytest.fixture
async def db_url(database_url: str) -> str:
    await db.upgrade_async(database_url)
    return database_url
