"""Quantities (dispatcher/api/quantity.py) and resource vectors (dispatcher/api/resources.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.api.quantity import QuantityError, format_milli, parse_milli
from dispatcher.api.resources import EMPTY, Resources

GI = 2**30

# -- parse_milli -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "want_milli"),
    [
        pytest.param("500m", 500, id="millicores"),
        pytest.param("2", 2000, id="cores"),
        pytest.param("0", 0, id="zero"),
        pytest.param("16G", 16 * 10**12, id="decimal-giga"),
        pytest.param("19531250Ki", 19531250 * 1024 * 1000, id="binary-kibi"),
        pytest.param("1e3", 1_000_000, id="exponent"),
        pytest.param("1E3", 1_000_000, id="exponent-upper"),
        pytest.param("2e-3", 2, id="negative-exponent"),
        pytest.param("0.5Gi", GI // 2 * 1000, id="fractional-binary"),
        pytest.param("1.5", 1500, id="fractional-cores"),
        pytest.param(".5", 500, id="leading-dot"),
        pytest.param("+1", 1000, id="explicit-plus"),
        pytest.param("1k", 1_000_000, id="kilo"),
        pytest.param("1M", 10**9, id="mega"),
        pytest.param("1Mi", 2**20 * 1000, id="mebi"),
        pytest.param("1Ti", 2**40 * 1000, id="tebi"),
        pytest.param("1E", 10**21, id="exa-suffix"),
        pytest.param("1n", 1, id="nano-rounds-up"),
        pytest.param("1500u", 2, id="micro-rounds-up"),
        pytest.param(2, 2000, id="int"),
        pytest.param(0, 0, id="int-zero"),
        pytest.param(0.5, 500, id="float"),
        pytest.param(1e20, 10**23, id="float-exponent-repr"),
        pytest.param(1e-7, 1, id="tiny-float-rounds-up"),
    ],
)
def test_parse_milli(value: str | int | float, want_milli: int) -> None:
    assert parse_milli(value) == want_milli


def test_parse_milli_gpu_count_via_resources() -> None:
    assert Resources.parse({"nvidia.com/gpu": 4})["nvidia.com/gpu"] == 4000
    assert Resources.parse({"nvidia.com/gpu": "1"})["nvidia.com/gpu"] == 1000


@pytest.mark.parametrize(
    ("value", "want_in_message"),
    [
        pytest.param("4 GB", "'4 GB'", id="space-and-unknown-suffix"),
        pytest.param("1.5.2", "'1.5.2'", id="two-dots"),
        pytest.param("abc", "'abc'", id="letters"),
        pytest.param("", "''", id="empty"),
        pytest.param("Gi", "'Gi'", id="suffix-only"),
        pytest.param("1KB", "'1KB'", id="kb"),
        pytest.param("1ki", "'1ki'", id="lowercase-binary"),
        pytest.param("-1", "'-1'", id="negative-string"),
        pytest.param(-1, "-1", id="negative-int"),
        pytest.param(-0.5, "-0.5", id="negative-float"),
        pytest.param(True, "True", id="bool"),
        pytest.param(None, "None", id="none"),
        pytest.param([1], "[1]", id="list"),
        pytest.param(float("nan"), "nan", id="nan"),
        pytest.param(float("inf"), "inf", id="inf"),
        pytest.param("1e100000", "'1e100000'", id="huge-exponent"),
        pytest.param("9" * 5000, "out of range", id="huge-digits"),
        pytest.param(10**40, "out of range", id="huge-int"),
    ],
)
def test_parse_milli_rejects(value: Any, want_in_message: str) -> None:
    with pytest.raises(QuantityError) as excinfo:
        parse_milli(value)
    assert want_in_message in str(excinfo.value)


def test_quantity_error_is_a_value_error() -> None:
    assert issubclass(QuantityError, ValueError)


# -- format_milli ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("milli", "resource", "want"),
    [
        pytest.param(500, "cpu", "500m", id="millicores"),
        pytest.param(3000, "cpu", "3", id="cores"),
        pytest.param(0, "memory", "0", id="zero-memory"),
        pytest.param(16 * 10**12, "memory", "16G", id="decimal-stays-decimal"),
        pytest.param(16 * GI * 1000, "memory", "16Gi", id="binary-stays-binary"),
        pytest.param(1024 * 1000, "memory", "1Ki", id="binary-wins-tie"),
        pytest.param(1536 * 1000, "memory", "1536", id="no-exact-suffix"),
        pytest.param(GI * 1000, "ephemeral-storage", "1Gi", id="ephemeral-storage"),
        pytest.param(2 * 2**20 * 1000, "hugepages-2Mi", "2Mi", id="hugepages"),
        pytest.param(GI * 1000, "nvidia.com/gpu", str(GI), id="counts-get-no-suffix"),
        pytest.param(-2000, "cpu", "-2", id="negative-difference"),
    ],
)
def test_format_milli(milli: int, resource: str, want: str) -> None:
    assert format_milli(milli, resource) == want


_MAX = 10**29  # parse_milli rejects values beyond 10**30 milli-units


@given(milli=st.integers(min_value=0, max_value=_MAX), resource=st.sampled_from(["cpu", "memory"]))
def test_format_then_parse_round_trips(milli: int, resource: str) -> None:
    assert parse_milli(format_milli(milli, resource)) == milli


@given(st.lists(st.integers(min_value=0, max_value=10**15), max_size=200))
def test_sum_of_parses_is_parse_of_sum(millis: list[int]) -> None:
    texts = [format_milli(m, "memory") for m in millis]
    assert sum(parse_milli(t) for t in texts) == parse_milli(format_milli(sum(millis), "memory"))
    total = EMPTY
    for text in texts:
        total = total + Resources.parse({"memory": text})
    assert total["memory"] == sum(millis)


def test_many_small_cpu_requests_add_exactly() -> None:
    # 0.1 has no exact binary float; a float sum would drift, integers do not.
    assert sum(parse_milli("100m") for _ in range(10_000)) == parse_milli("1000")


# -- Resources ---------------------------------------------------------------------------------


def res(**quantities: str | int) -> Resources:
    """Builder: res(cpu="2", memory="16G", gpu=1) with gpu meaning nvidia.com/gpu."""
    raw = {("nvidia.com/gpu" if k == "gpu" else k): v for k, v in quantities.items()}
    return Resources.parse(raw)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        pytest.param(None, {}, id="none"),
        pytest.param({}, {}, id="empty"),
        pytest.param({"cpu": "0"}, {}, id="zeros-dropped"),
        pytest.param(
            {"cpu": 2, "memory": "16G", "nvidia.com/gpu": "1"},
            {"cpu": 2000, "memory": 16 * 10**12, "nvidia.com/gpu": 1000},
            id="mixed",
        ),
        pytest.param({"google.com/tpu": 8}, {"google.com/tpu": 8000}, id="any-resource-name"),
    ],
)
def test_resources_parse(raw: dict[str, Any] | None, want: dict[str, int]) -> None:
    assert Resources.parse(raw) == want


def test_resources_parse_error_names_resource_and_value() -> None:
    with pytest.raises(QuantityError, match=r"memory: malformed quantity '4 GB'"):
        Resources.parse({"cpu": "1", "memory": "4 GB"})


@pytest.mark.parametrize(
    ("got", "want"),
    [
        pytest.param(res(cpu=1) + res(cpu="500m", gpu=1), res(cpu="1500m", gpu=1), id="add"),
        pytest.param(res(cpu=2, gpu=1) - res(cpu=2), res(gpu=1), id="sub-drops-zero"),
        pytest.param(res(cpu=1) - res(cpu=3), Resources({"cpu": -2000}), id="sub-negative"),
        pytest.param(res(cpu=3, memory="16G").scale(2), res(cpu=6, memory="32G"), id="scale"),
        pytest.param(res(cpu=3).scale(0), EMPTY, id="scale-zero"),
        pytest.param(res(cpu=1, memory="2Gi").max(res(cpu=2)), res(cpu=2, memory="2Gi"), id="max"),
        pytest.param(
            res(cpu=4, gpu=2).shortfall(res(cpu=3, gpu=4)), res(cpu=1), id="shortfall-positive-only"
        ),
        pytest.param(res(gpu=8).shortfall(EMPTY), res(gpu=8), id="shortfall-nothing-free"),
        pytest.param(res(cpu=1).shortfall(res(cpu=1)), EMPTY, id="shortfall-exact-fit"),
    ],
)
def test_resources_arithmetic(got: Resources, want: Resources) -> None:
    assert got == want


@pytest.mark.parametrize(
    ("request_", "available", "want_fits"),
    [
        pytest.param(res(cpu=2), res(cpu=2), True, id="exact"),
        pytest.param(res(cpu=2), res(cpu="1999m"), False, id="one-milli-short"),
        pytest.param(res(gpu=1), res(cpu=8), False, id="absent-is-zero"),
        pytest.param(EMPTY, EMPTY, True, id="nothing-fits-nothing"),
        pytest.param(res(cpu=1), res(cpu=8, gpu=4), True, id="extra-available"),
    ],
)
def test_resources_fits_in(request_: Resources, available: Resources, want_fits: bool) -> None:
    assert request_.fits_in(available) is want_fits


def test_resources_is_an_immutable_hashable_mapping() -> None:
    a = res(cpu=1, gpu=1)
    b = Resources({"nvidia.com/gpu": 1000, "cpu": 1000, "memory": 0})
    assert a == b
    assert hash(a) == hash(b)
    assert {a: "x"}[b] == "x"
    assert a["memory"] == 0
    assert "memory" not in a
    assert len(a) == 2
    assert a == {"cpu": 1000, "nvidia.com/gpu": 1000, "memory": 0}


def test_resources_describe_and_to_kube() -> None:
    r = res(cpu="3", memory="16G", gpu=1, **{"ephemeral-storage": "1Gi"})
    assert r.describe() == "cpu 3, ephemeral-storage 1Gi, memory 16G, nvidia.com/gpu 1"
    assert r.to_kube() == {
        "cpu": "3",
        "ephemeral-storage": "1Gi",
        "memory": "16G",
        "nvidia.com/gpu": "1",
    }
    assert res(cpu="250m").to_kube() == {"cpu": "250m"}
    assert EMPTY.describe() == ""
    assert repr(res(cpu=1)) == "Resources(cpu 1)"


@given(
    st.dictionaries(
        st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]),
        st.integers(min_value=0, max_value=10**18),
    )
)
def test_to_kube_parses_back(values: dict[str, int]) -> None:
    r = Resources(values)
    assert Resources.parse(r.to_kube()) == r
