"""`Workload.shape`: the key the scheduling cycle looks gangs up by."""

from __future__ import annotations

from dataclasses import replace

from dispatcher.api.resources import Resources
from dispatcher.core.model import PodSet, Workload


def _workload(*pod_sets: PodSet) -> Workload:
    return Workload(key="ns/w", priority=0, created_at=0.0, pod_sets=pod_sets)


def test_shape_is_the_pod_sets_shapes_in_order() -> None:
    small = PodSet(count=2, requests=Resources({"cpu": 1000}), name="a")
    large = PodSet(count=1, requests=Resources({"cpu": 4000}), name="b")
    workload = _workload(small, large)
    assert workload.shape == (small.shape, large.shape)
    assert _workload(large, small).shape != workload.shape


def test_shape_ignores_names_and_follows_replace() -> None:
    pod_set = PodSet(count=2, requests=Resources({"cpu": 1000}), name="a")
    renamed = replace(pod_set, name="b")
    assert _workload(pod_set).shape == _workload(renamed).shape
    bigger = replace(_workload(pod_set), pod_sets=(replace(pod_set, count=3),))
    assert bigger.shape != _workload(pod_set).shape
    assert bigger == replace(bigger)  # not part of equality: derived from the pod sets
