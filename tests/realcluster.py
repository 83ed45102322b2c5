"""Running the API suites against real clusters: which tests skip there, and saying why.

``tests/kubesim`` runs against one real cluster when ``MKD_TEST_KUBECONFIG`` names its kubeconfig, and
``tests/e2e`` against a real manager plus workers when ``MKD_TEST_KUBECONFIGS`` is
``manager=/path/m.kubeconfig,worker-1=/path/w1.kubeconfig,...``. There, a test runs when it is marked
``realcluster``; a test marked ``kubesim_only("why")`` or ``needs_running_pods("why")`` skips with that
reason (on a test cluster of kwok-style nodes pods become Running and batch Job pods complete, but no
container really runs, so nothing else completes); any other test skips asking to be marked, so that no
test is left out silently.
"""

from __future__ import annotations

import pytest

REASONS = {
    "kubesim_only": "kubesim only",
    "needs_running_pods": "needs pods whose containers really run to completion (kwok-style nodes only make pods "
                          "Running and complete batch Job pods)",
}


def skip_on_real_clusters(items: list[pytest.Item], folder: str, variable: str) -> None:
    for item in items:
        if f"tests/{folder}/" not in str(item.fspath).replace("\\", "/"):
            continue
        for name, prefix in REASONS.items():
            marker = item.get_closest_marker(name)
            if marker is not None:
                why = marker.args[0] if marker.args else ""
                item.add_marker(pytest.mark.skip(reason=f"{prefix}: {why}" if why else prefix))
                break
        else:
            if "realcluster" not in item.keywords:
                item.add_marker(pytest.mark.skip(
                    reason=f"{variable} is set and this test is not marked realcluster, kubesim_only or "
                           "needs_running_pods (mark it, saying why)"))


def parse_kubeconfigs(text: str) -> dict[str, str]:
    """``name=path,name=path`` -> {name: path}; refuses a malformed entry, naming it."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, path = part.partition("=")
        if not sep or not name or not path:
            raise pytest.UsageError(f"MKD_TEST_KUBECONFIGS: {part!r} is not name=/path/to/kubeconfig")
        out[name.strip()] = path.strip()
    if "manager" not in out:
        raise pytest.UsageError(f"MKD_TEST_KUBECONFIGS names no 'manager' cluster: {sorted(out)}")
    return out
