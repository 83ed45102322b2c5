"""Fixtures for the what-if tests: a kubesim manager cluster (the live queue objects) from the dispatcher's tests."""

from tests.dispatcher.conftest import kube, manager  # noqa: F401  (re-exported fixtures)
