"""The dashboard in a real browser: headless Chromium (selenium + chromedriver) loads every page of the
demo topology (kubesim manager + three workers, dispatcher with its API, three agents, the examples)
and the test asserts on what the pages show.

Skips, saying so, where Chromium or chromedriver is not installed (``make test`` installs them where
it may: root and apt). ``MKD_UPDATE_SCREENSHOTS=1`` writes the README's screenshots to ``docs/``.
"""

from __future__ import annotations

import asyncio
import copy
import os
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from mkctl import jobs
from mkctl.demo import create_job, submit
from mkctl.topology import Topology, TopologyOptions

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")


@pytest.fixture
def browser() -> Iterator[Any]:
    if not CHROMIUM or not DRIVER:
        pytest.skip("Chromium or chromedriver is not installed (apt-get install chromium chromium-driver; "
                    "`make test` does it when run as root with apt): the dashboard's browser test did not run")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,900", "--no-proxy-server"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
async def demo(tmp_path: Path, mqtt_url: str, database_url: str, topic_root: str) -> AsyncIterator[Topology]:
    options = TopologyOptions(state_dir=tmp_path / "state", mqtt_url=mqtt_url, database_url=database_url,
                              topic_root=topic_root, heartbeat_seconds=2.0, heartbeat_timeout_seconds=10.0,
                              origin="mkd-ui")
    async with Topology(options) as top:
        await top.wait_for_clusters()
        examples = jobs.load_examples()
        examples.add(jobs.load_examples(jobs.queues_dir()))  # as `make demo`: demo/queues' ClusterQueues too
        await submit(top, examples)
        # one sample that keeps running, so the clusters page has capacity in use to show
        long = next(s for s in examples.samples if s.name == "pytorch-simple")
        manifest = copy.deepcopy(long.manifest)
        manifest["metadata"]["name"] = "long-runner"
        for spec in manifest["spec"]["pytorchReplicaSpecs"].values():
            spec["template"]["metadata"]["annotations"]["kubesim.mkd.dev/run-seconds"] = "600"
        await create_job(top.manager, jobs.Sample(manifest, long.source, "Succeeded"))
        yield top


def shot(driver: Any, name: str) -> None:
    target = ROOT / "docs" / f"dashboard-{name}.png" if os.environ.get("MKD_UPDATE_SCREENSHOTS") else None
    if target is not None:
        driver.save_screenshot(str(target))


def wait_text(driver: Any, css: str, text: str, within: float = 30.0) -> str:
    """The text of ``css`` once it contains ``text`` (the pages refresh themselves every few seconds)."""
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + within
    seen = ""
    while time.monotonic() < deadline:
        try:
            seen = driver.find_element(By.CSS_SELECTOR, css).text
        except Exception:  # element replaced by a live refresh between find and read
            seen = ""
        if text in seen:
            return str(seen)
        time.sleep(0.25)
    raise AssertionError(f"{css} never showed {text!r}; last: {seen!r}")


@pytest.mark.slow
async def test_every_page_in_a_real_browser(browser: Any, demo: Topology) -> None:
    from selenium.webdriver.common.by import By

    info = demo.describe()
    base = info["api_url"]
    assert base and info["api_token"]

    def scenario() -> None:
        # without the token: a sign-in page, not the data
        browser.get(f"{base}/ui/workloads")
        assert "Sign in" in browser.page_source and "pytorch-simple" not in browser.page_source
        # a deep link with the token opens that very page, signed in
        browser.get(f"{base}/ui/clusters?token={info['api_token']}")
        assert browser.current_url.endswith("/ui/clusters") and "Sign in" not in browser.page_source
        # the demo's printed URL stores the token and lands on the Workloads table
        browser.get(info["dashboard_url"])
        assert browser.current_url.endswith("/ui/workloads")
        # clusters while the samples run: health and capacity bars that show the use
        browser.get(f"{base}/ui/clusters")
        text = wait_text(browser, "#cluster-rows", "online")  # stale only if a heartbeat is 3 intervals late
        assert "worker-1" in text and "worker-3" in text and "nvidia.com/gpu" in text
        deadline = time.monotonic() + 30
        widths = "return [...document.querySelectorAll('.cap .bar span')].map(e => parseFloat(e.style.width))"
        while not any(w > 0 for w in browser.execute_script(widths)):
            assert time.monotonic() < deadline, "no capacity bar ever showed use"
            time.sleep(0.2)
        shot(browser, "clusters")
        browser.get(f"{base}/ui/workloads")
        wait_text(browser, "#workload-rows", "pytorch-simple")
        wait_text(browser, "#workload-rows", "too-large")
        rows = browser.find_elements(By.CSS_SELECTOR, "#workload-rows tr")
        assert len(rows) >= 8
        # live refresh: a job the table had not shown running shows up finished without a reload
        wait_text(browser, "#workload-rows", "finished", within=60)
        shot(browser, "workloads")
        # filters
        browser.get(f"{base}/ui/workloads?state=Pending")
        text = wait_text(browser, "#workload-rows", "too-large")
        assert "pytorch-simple" not in text
        browser.get(f"{base}/ui/workloads?state=bogus")
        assert "is not a Workload state" in browser.find_element(By.ID, "error").text
        # one Workload: why it waits, placements, history
        browser.get(f"{base}/ui/workloads")
        wait_text(browser, "#workload-rows", "too-large")
        browser.find_element(By.LINK_TEXT, "too-large").click()
        why = browser.find_element(By.ID, "why").text
        assert "why pending" in why and "can never run here" in why and "nvidia.com/gpu" in why
        assert "heartbeat" in browser.find_element(By.ID, "why-details").text  # per cluster, with its age
        browser.get(f"{base}/ui/workloads/default/pytorch-simple")
        wait_text(browser, "#placement-rows", "worker-")
        assert "claimed" in browser.find_element(By.ID, "event-rows").text
        # the manager Job's own conditions, read from the manager (they were always empty)
        conditions = browser.find_element(By.ID, "condition-rows").text
        assert "MultiClusterDispatched" in conditions and "Created" in conditions, conditions
        shot(browser, "workload")
        # its pods, read on the worker through the agent, and the master's log
        wait_text(browser, "#pods", "master")
        browser.find_element(By.ID, "log-load").click()
        wait_text(browser, "#log", "Test set: Average loss")
        assert "container pytorch" in browser.find_element(By.ID, "log-note").text
        # a follow on a Job that runs on: the first line now, the page keeps the stream open
        browser.get(f"{base}/ui/workloads/default/long-runner")
        wait_text(browser, "#pods", "Running")
        browser.find_element(By.ID, "log-follow").click()
        browser.find_element(By.ID, "log-load").click()
        wait_text(browser, "#log", "Train Epoch: 1 [0/60000")
        assert "(following)" in browser.find_element(By.ID, "log-note").text
        # a Job mkd leaves alone says who manages it
        browser.get(f"{base}/ui/workloads/default/other-controller")
        assert "left to kubeflow.org/training-operator" in browser.find_element(By.ID, "why").text
        # queues: every ClusterQueue of the manager with its quota in use, every LocalQueue by namespace/name
        browser.get(f"{base}/ui/queues")
        cluster_queues = wait_text(browser, "#cluster-queue-rows", "team-b")
        assert "team-a" in cluster_queues and "shared" in cluster_queues and "org" in cluster_queues
        queue_rows = browser.find_element(By.ID, "queue-rows").text
        assert "default/default" in queue_rows and "team-a/default" in queue_rows  # two LocalQueues, not one
        assert "Queues not configured" not in browser.page_source
        shot(browser, "queues")

    await asyncio.to_thread(scenario)

    # what `make demo DEMO_ARGS=--keep-running` prints: the URL just used, the token, API commands
    from io import StringIO

    from rich.console import Console

    from mkctl.demo import print_running

    out = StringIO()
    print_running(Console(file=out, width=300, force_terminal=False), info)
    printed = out.getvalue()
    assert info["dashboard_url"] in printed and f"token: {info['api_token']}" in printed
    assert f"--server {base} --token {info['api_token']}" in printed
