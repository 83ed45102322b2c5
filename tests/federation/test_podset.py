"""Quantities (parse, format, arithmetic), per-pod requests as the scheduler counts them, PodSets."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from federation.errors import Invalid
from federation.podset import (
    MAX_QUANTITY,
    PodSet,
    add,
    fits,
    format_quantity,
    format_resources,
    parse_quantity,
    pod_requests,
    scale,
    shortfall,
    sub,
    total_requests,
)

D = Decimal


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500m", D("0.5")),
        ("2", D(2)),
        ("1.5", D("1.5")),
        (".5", D("0.5")),
        ("1.", D(1)),
        ("+3", D(3)),
        ("-1k", D(-1000)),
        ("2Gi", D(2 * 1024**3)),
        ("512Mi", D(512 * 1024**2)),
        ("1Ki", D(1024)),
        ("1.5Gi", D(1536 * 1024**2)),
        ("1Ei", D(2**60)),
        ("1e3", D(1000)),
        ("1E3", D(1000)),
        ("1e-3", D("0.001")),
        ("2.5e+2", D(250)),
        ("100n", D("0.0000001")),
        ("5u", D("0.000005")),
        ("1M", D(10**6)),
        ("1G", D(10**9)),
        ("1T", D(10**12)),
        ("1P", D(10**15)),
        ("1E", D(10**18)),
        ("0", D(0)),
        ("0.0001n", D("1e-9")),  # rounded up to the nano unit, as the API server does
        ("-0.0001n", D("-1e-9")),
        ("1e30", MAX_QUANTITY),  # capped
        ("9Ei", MAX_QUANTITY),
        ("1e-99999", D("1e-9")),
    ],
)
def test_parse_quantity(text: str, expected: Decimal) -> None:
    assert parse_quantity(text, "spec.x") == expected


@pytest.mark.parametrize(
    ("value", "expected"), [(2, D(2)), (0.25, D("0.25")), (1024, D(1024)), (D("0.0000000001"), D("1e-9"))]
)
def test_parse_numbers_from_yaml(value: int | float, expected: Decimal) -> None:
    assert parse_quantity(value, "f") == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 1",
        "1 ",
        "Ki",
        "m",
        "1.2.3",
        "1e",
        "1e+",
        "1Kb",
        "1ki",
        "1KI",
        "--1",
        "+-1",
        "e3",
        "1e1.5",
        "1 Gi",
        "abc",
        "1,5",
        "0x10",
        "1e99999999999",
        "١",
    ],
)
def test_parse_rejects_malformed(text: str) -> None:
    with pytest.raises(Invalid) as info:
        parse_quantity(text, "spec.containers[0].resources.requests.cpu")
    assert info.value.field == "spec.containers[0].resources.requests.cpu"
    assert info.value.fix  # says what would fix it


@pytest.mark.parametrize(
    "value", [True, None, float("nan"), float("inf"), D("NaN"), D("-Infinity"), [1], {"a": 1}]
)
def test_parse_rejects_non_quantities(value: Any) -> None:
    with pytest.raises(Invalid):
        parse_quantity(value, "f")


@pytest.mark.parametrize(
    ("amount", "resource", "expected"),
    [
        (D("0.5"), "cpu", "500m"),
        (D(4), "cpu", "4"),
        (D(2000), "cpu", "2k"),
        (D(1500), "cpu", "1500"),
        (D("1.5"), "cpu", "1500m"),
        (D("0.000000001"), "cpu", "1n"),
        (D(0), "cpu", "0"),
        (D(-250) / 1000, "cpu", "-250m"),
        (D(2 * 1024**3), "memory", "2Gi"),
        (D(1536 * 1024**2), "memory", "1536Mi"),
        (D(10**9), "memory", "1G"),
        (D(10**12), "memory", "1T"),  # shorter than 976562500Ki
        (D(1000), "memory", "1k"),
        (D(1024), "ephemeral-storage", "1Ki"),
        (D(2 * 1024**2), "hugepages-2Mi", "2Mi"),
        (D(2 * 1024**3), "cpu", "2147483648"),  # binary suffixes only for byte resources
        (D(3), "nvidia.com/gpu", "3"),
    ],
)
def test_format_quantity(amount: Decimal, resource: str, expected: str) -> None:
    assert format_quantity(amount, resource) == expected


nano_amounts = st.integers(min_value=-(2**63 - 1), max_value=2**63 - 1).flatmap(
    lambda whole: st.integers(min_value=0, max_value=999_999_999).map(
        lambda frac: D(whole) + D(frac).scaleb(-9) if whole < 2**63 - 1 else D(whole)
    )
)
resources = st.sampled_from(["", "cpu", "memory", "ephemeral-storage", "nvidia.com/gpu", "hugepages-1Gi"])


@given(nano_amounts, resources)
def test_format_then_parse_round_trips(amount: Decimal, resource: str) -> None:
    text = format_quantity(amount, resource)
    assert parse_quantity(text, "f") == amount
    assert format_quantity(parse_quantity(text, "f"), resource) == text  # canonical form is stable


@given(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(["", "n", "u", "m", "k", "M", "G", "Ki", "Mi", "Gi", "Ti", "e2", "e-2", "E0"]),
)
def test_parse_integer_with_suffix(number: int, suffix: str) -> None:
    multiplier = {
        "": D(1),
        "n": D("1e-9"),
        "u": D("1e-6"),
        "m": D("1e-3"),
        "k": D(10**3),
        "M": D(10**6),
        "G": D(10**9),
        "Ki": D(2**10),
        "Mi": D(2**20),
        "Gi": D(2**30),
        "Ti": D(2**40),
        "e2": D(100),
        "e-2": D("0.01"),
        "E0": D(1),
    }[suffix]
    assert parse_quantity(f"{number}{suffix}", "f") == min(number * multiplier, MAX_QUANTITY)


@given(st.text(max_size=12))
def test_parse_never_raises_anything_but_invalid(text: str) -> None:
    try:
        value = parse_quantity(text, "f")
    except Invalid:
        return
    assert abs(value) <= MAX_QUANTITY


small = st.decimals(min_value=-(10**6), max_value=10**6, places=3, allow_nan=False, allow_infinity=False)
res_maps = st.dictionaries(st.sampled_from(["cpu", "memory", "pods", "nvidia.com/gpu"]), small, max_size=4)


@given(res_maps, res_maps, res_maps)
def test_add_is_commutative_and_associative(
    a: dict[str, Decimal], b: dict[str, Decimal], c: dict[str, Decimal]
) -> None:
    assert add(a, b) == add(b, a)
    assert add(add(a, b), c) == add(a, add(b, c))


@given(res_maps, res_maps)
def test_sub_undoes_add(a: dict[str, Decimal], b: dict[str, Decimal]) -> None:
    back = sub(add(a, b), b)
    assert all(back[k] == a.get(k, 0) for k in back)


@given(res_maps, st.integers(min_value=0, max_value=50))
def test_scale_is_repeated_add(a: dict[str, Decimal], n: int) -> None:
    total: dict[str, Decimal] = {k: D(0) for k in a}
    for _ in range(n):
        total = add(total, a)
    assert scale(a, n) == total


@given(res_maps, res_maps)
def test_fits_exactly_when_no_shortfall(need: dict[str, Decimal], free: dict[str, Decimal]) -> None:
    assert fits(need, free) == (shortfall(need, free) == {})
    for name, missing in shortfall(need, free).items():
        assert missing > 0 and need[name] - missing == free.get(name, 0)


def test_fits_counts_missing_resources_as_zero() -> None:
    assert not fits({"nvidia.com/gpu": D(1)}, {"cpu": D(8)})
    assert shortfall({"nvidia.com/gpu": D(2), "cpu": D(1)}, {"cpu": D(8)}) == {"nvidia.com/gpu": D(2)}
    assert fits({"cpu": D(0)}, {})


def container(
    name: str, requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v is not None}
    return {"name": name, "image": "busybox", "resources": resources, **extra}


def test_regular_containers_are_summed_and_pods_is_one() -> None:
    spec = {"containers": [container("a", {"cpu": "500m", "memory": "1Gi"}), container("b", {"cpu": "250m"})]}
    assert pod_requests(spec) == {"cpu": D("0.75"), "memory": D(2**30), "pods": D(1)}


def test_limits_stand_in_for_missing_requests_per_resource() -> None:
    spec = {"containers": [container("a", {"cpu": "1"}, {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": 1})]}
    assert pod_requests(spec) == {"cpu": D(1), "memory": D(2**30), "nvidia.com/gpu": D(1), "pods": D(1)}


def test_regular_init_containers_count_by_their_maximum() -> None:
    spec = {
        "initContainers": [container("i1", {"cpu": "2"}), container("i2", {"memory": "4Gi"})],
        "containers": [container("a", {"cpu": "1", "memory": "1Gi"})],
    }
    assert pod_requests(spec) == {"cpu": D(2), "memory": D(4 * 2**30), "pods": D(1)}


def test_sidecars_add_to_containers_and_to_later_init_containers() -> None:
    spec = {
        "initContainers": [
            container("early", {"cpu": "3"}),  # runs before the sidecar: alone
            container("sidecar", {"cpu": "500m", "memory": "256Mi"}, restartPolicy="Always"),
            container("late", {"cpu": "2"}),  # runs next to the sidecar: 2.5
        ],
        "containers": [container("main", {"cpu": "1", "memory": "1Gi"})],
    }
    # regular + sidecar = 1.5 cpu; init peak = max(3, 0.5, 2.5) = 3
    assert pod_requests(spec) == {"cpu": D(3), "memory": D(1280 * 2**20), "pods": D(1)}
    spec["initContainers"][0]["resources"] = {"requests": {"cpu": "1"}}
    assert pod_requests(spec)["cpu"] == D("2.5")


def test_overhead_is_added_last() -> None:
    spec = {"containers": [container("a", {"cpu": "1"})], "overhead": {"cpu": "250m", "memory": "120Mi"}}
    assert pod_requests(spec) == {"cpu": D("1.25"), "memory": D(120 * 2**20), "pods": D(1)}


def test_pod_level_resources_replace_the_container_sum() -> None:
    spec = {
        "resources": {"requests": {"cpu": "4"}},
        "containers": [container("a", {"cpu": "1", "memory": "1Gi"})],
    }
    assert pod_requests(spec) == {"cpu": D(4), "memory": D(2**30), "pods": D(1)}


def test_no_resources_is_one_pod() -> None:
    assert pod_requests({"containers": [{"name": "a", "image": "x"}]}) == {"pods": D(1)}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (
            {"containers": [container("a", {"cpu": "1x"})]},
            "spec.template.spec.containers[0].resources.requests.cpu",
        ),
        (
            {"containers": [container("a"), container("b", None, {"memory": "lots"})]},
            "spec.template.spec.containers[1].resources.limits.memory",
        ),
        (
            {"containers": [], "initContainers": [container("i", {"cpu": "-1"})]},
            "spec.template.spec.initContainers[0].resources.requests.cpu",
        ),
        ({"containers": [], "overhead": {"cpu": "?"}}, "spec.template.spec.overhead.cpu"),
        ({"containers": "nope"}, "spec.template.spec.containers"),
    ],
)
def test_pod_requests_names_the_bad_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(Invalid) as info:
        pod_requests(spec, "spec.template.spec")
    assert info.value.field == field


def test_podset_total_and_total_requests() -> None:
    per_pod = {"cpu": D("0.5"), "memory": D(2**30), "pods": D(1)}
    master = PodSet("master", 1, {"spec": {}}, per_pod)
    workers = PodSet("worker", 3, {"spec": {}}, per_pod)
    assert workers.total() == {"cpu": D("1.5"), "memory": D(3 * 2**30), "pods": D(3)}
    assert format_resources(total_requests([master, workers])) == {"cpu": "2", "memory": "4Gi", "pods": "4"}
    assert total_requests([]) == {}


# --- pod_requests against a model of the pod's start-up timeline ------------------------------------

amounts = st.integers(min_value=0, max_value=4000)
containers_st = st.lists(
    st.tuples(st.booleans(), amounts, amounts),
    max_size=5,  # (is sidecar, milli-cpu, MiB)
)


def stage_peak(inits: list[tuple[bool, int, int]], regular: list[tuple[int, int]]) -> tuple[int, int]:
    """Walk the start-up: init containers one by one (sidecars stay), then everything regular."""
    running: list[tuple[int, int]] = []
    peak = [0, 0]
    for sidecar, cpu, mem in inits:
        stage = [*running, (cpu, mem)]
        for i in (0, 1):
            peak[i] = max(peak[i], sum(c[i] for c in stage))
        if sidecar:
            running.append((cpu, mem))
    final = running + regular
    return max(peak[0], sum(c[0] for c in final)), max(peak[1], sum(c[1] for c in final))


@given(containers_st, st.lists(st.tuples(amounts, amounts), max_size=4), st.tuples(amounts, amounts))
def test_pod_requests_match_the_startup_timeline(
    inits: list[tuple[bool, int, int]], regular: list[tuple[int, int]], overhead: tuple[int, int]
) -> None:
    spec = {
        "initContainers": [
            container(
                f"i{n}",
                {"cpu": f"{cpu}m", "memory": f"{mem}Mi"},
                **({"restartPolicy": "Always"} if sidecar else {}),
            )
            for n, (sidecar, cpu, mem) in enumerate(inits)
        ],
        "containers": [
            container(f"c{n}", {"cpu": f"{cpu}m", "memory": f"{mem}Mi"})
            for n, (cpu, mem) in enumerate(regular)
        ],
        "overhead": {"cpu": f"{overhead[0]}m", "memory": f"{overhead[1]}Mi"},
    }
    cpu, mem = stage_peak(inits, [(c, m) for c, m in regular])
    got = pod_requests(spec)
    assert got["cpu"] == D(cpu + overhead[0]) / 1000
    assert got["memory"] == D((mem + overhead[1]) * 2**20)
    assert got["pods"] == 1
