"""v1beta2's differences at admission and in naming: components named by generateName
(api.models.generated_name), the AppWrapper controller's structural invariants at create and
its immutable components at update (core/v1beta2rules.py)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from dispatcher.api.models import AppWrapper
from dispatcher.api.names import generated_name
from dispatcher.cluster.objects import wrapped_identities, wrapped_objects
from dispatcher.core.v1beta2rules import (
    immutable_problems,
    requested_in_v1beta2,
    structure_problems,
)
from dispatcher.core.validation import validate_appwrapper
from dispatcher.core.workloads import InvalidSpec, workload_of
from tests.unit.builders import deployment, job, obj, pod, ray_cluster, worker_group

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def unnamed(template: dict[str, Any], prefix: Any) -> dict[str, Any]:
    """`template` with generateName `prefix` instead of a name."""
    template = copy.deepcopy(template)
    del template["metadata"]["name"]
    template["metadata"]["generateName"] = prefix
    return template


def aw_of(*templates: dict[str, Any], uid: str | None = "uid-1", **item: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "a", "namespace": "team-a"}
    if uid is not None:
        metadata["uid"] = uid
    items = [{"generictemplate": t, **item} for t in templates]
    return {
        "apiVersion": "workload.codeflare.dev/v1beta1",
        "kind": "AppWrapper",
        "metadata": metadata,
        "spec": {"resources": {"GenericItems": items}},
    }


# -- generateName --------------------------------------------------------------------------


def test_a_generated_name_is_the_prefix_and_five_characters_fixed_by_uid_and_index() -> None:
    name = generated_name("job-", "uid-1", 0)
    assert name.startswith("job-")
    assert len(name) == len("job-") + 5
    assert name[4:].isalnum()
    assert name[4:] == name[4:].lower()
    assert generated_name("job-", "uid-1", 0) == name  # after a restart: the same
    assert generated_name("job-", "uid-1", 1) != name  # another component
    assert generated_name("job-", "uid-2", 0) != name  # another AppWrapper
    assert len(generated_name("x" * 80, "uid-1", 0)) == 63  # cut as the API server cuts


def test_reading_an_appwrapper_names_its_components_everywhere_without_touching_the_input() -> None:
    raw = aw_of(unnamed(job("j"), "job-"), unnamed(job("j"), "job-"), pod("kept"))
    before = copy.deepcopy(raw)
    aw = AppWrapper.from_kube(raw)
    assert raw == before  # the watch cache's object is never changed
    first, second = (generated_name("job-", "uid-1", i) for i in (0, 1))
    assert [item.ref().name for item in aw.spec.items] == [first, second, "kept"]
    # Building (creating, adopting) and reading completion (deleting) use the same names.
    built = wrapped_objects(aw, owner_reference=True)
    assert [w.name for w in built] == [first, second, "kept"]
    assert [w.body["metadata"]["name"] for w in built] == [first, second, "kept"]
    assert [w.name for w in wrapped_identities(aw)] == [first, second, "kept"]
    # Read again (a restart): the same names.
    assert [i.ref().name for i in AppWrapper.from_kube(raw).spec.items] == [first, second, "kept"]
    workload = workload_of(aw, priority=0, allowed_kinds=None, now=NOW)
    assert not isinstance(workload, InvalidSpec), workload
    assert sum(p.count for p in workload.pod_sets) == 3


def test_a_name_given_beside_generate_name_wins() -> None:
    template = job("named")
    template["metadata"]["generateName"] = "ignored-"
    aw = AppWrapper.from_kube(aw_of(template))
    assert aw.spec.items[0].ref().name == "named"


def test_without_a_uid_the_name_is_seeded_by_namespace_and_name() -> None:
    aw = AppWrapper.from_kube(aw_of(unnamed(job("j"), "job-"), uid=None))
    assert aw.spec.items[0].ref().name == generated_name("job-", "team-a/a", 0)


@pytest.mark.parametrize(
    ("template", "want"),
    [
        pytest.param(
            unnamed(job("j"), "Job_"),
            "metadata.generateName 'Job_' does not make a valid name",
            id="upper-case-and-underscore",
        ),
        pytest.param(
            unnamed(obj("Service", "s"), "1svc-"),
            "metadata.generateName '1svc-' does not make a valid name",
            id="service-prefix-not-dns-1035",
        ),
        pytest.param(
            unnamed(job("j"), 12),
            "missing metadata.name, and metadata.generateName 12 is not a string",
            id="not-a-string",
        ),
    ],
)
def test_a_bad_generate_name_is_named(template: dict[str, Any], want: str) -> None:
    aw = AppWrapper.from_kube(aw_of(template))
    errors = validate_appwrapper(
        [i.generictemplate for i in aw.spec.items], namespace="team-a", allowed_kinds=None
    )
    assert len(errors) == 1, errors
    assert want in errors[0]


def test_a_good_generate_name_passes_validation() -> None:
    aw = AppWrapper.from_kube(aw_of(unnamed(obj("Service", "s"), "svc-")))
    items = [i.generictemplate for i in aw.spec.items]
    assert validate_appwrapper(items, namespace="team-a", allowed_kinds=None) == []


# -- structural invariants at create -------------------------------------------------------


def ray(workers: int) -> dict[str, Any]:
    return ray_cluster("r", None, *(worker_group(f"w{i}") for i in range(workers)))


@pytest.mark.parametrize(
    ("templates", "want"),
    [
        pytest.param((), "spec.components is empty", id="no-component"),
        pytest.param(
            (obj("Service", "s"), obj("ConfigMap", "c")), "make no pods", id="no-pod-template"
        ),
        pytest.param(
            tuple(pod(f"p{i}") for i in range(9)),
            "contain 9 pod templates (components[0]: 1, components[1]: 1,",
            id="nine-pods",
        ),
        pytest.param((ray(8),), "contain 9 pod templates (components[0]: 9)", id="ray-9-groups"),
        pytest.param(tuple(pod(f"p{i}") for i in range(8)), None, id="eight-is-the-limit"),
        pytest.param((obj("Service", "s"), deployment("d")), None, id="one-is-enough"),
        pytest.param((ray(7),), None, id="ray-8-groups"),
    ],
)
def test_structure(templates: tuple[dict[str, Any], ...], want: str | None) -> None:
    problems = structure_problems(AppWrapper.from_kube(aw_of(*templates)))
    if want is None:
        assert problems == []
    else:
        assert len(problems) == 1, problems
        assert want in problems[0]


def test_declared_pod_sets_count_when_more_than_inferred() -> None:
    declared = [{"path": "template.spec.template"}] * 9
    aw = AppWrapper.from_kube(aw_of(deployment("d"), podSets=declared))
    assert "contain 9 pod templates" in structure_problems(aw)[0]


def test_only_requests_made_in_v1beta2_are_held_to_these_rules() -> None:
    v2 = {"requestKind": {"group": "workload.codeflare.dev", "version": "v1beta2"}}
    v1 = {"requestKind": {"group": "workload.codeflare.dev", "version": "v1beta1"}}
    assert requested_in_v1beta2(v2)
    assert not requested_in_v1beta2(v1)
    assert not requested_in_v1beta2({})


# -- immutable components at update --------------------------------------------------------

SETS = [{"path": "template.spec.template", "replicas": 2}]


def changed(change: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(new, old) of an update making `change`, as the webhook gets them (v1beta1)."""
    old = aw_of(deployment("d"), pod("p"))
    old["spec"]["resources"]["GenericItems"][0]["podSets"] = copy.deepcopy(SETS)
    new = copy.deepcopy(old)
    items = new["spec"]["resources"]["GenericItems"]
    if change == "template":
        items[0]["generictemplate"] = copy.deepcopy(items[1]["generictemplate"])
    elif change == "added-component":
        items.append(copy.deepcopy(items[0]))
    elif change == "pod-sets-doubled":  # appwrapper_test.go:218
        items[0]["podSets"] = items[0]["podSets"] * 2
    elif change == "path":
        items[0]["podSets"][0]["path"] = "bad"
    elif change == "replicas":
        items[0]["podSets"][0]["replicas"] = 12
    elif change == "suspend":
        new["spec"]["suspend"] = True
    elif change == "replicas-default-written":
        old["spec"]["resources"]["GenericItems"][0]["podSets"] = [{"path": SETS[0]["path"]}]
        items[0]["podSets"][0]["replicas"] = 1
    return new, old


@pytest.mark.parametrize(
    ("change", "want"),
    [
        ("template", "spec.components[0].template cannot change"),
        ("added-component", "spec.components: 2 components cannot become 3"),
        ("pod-sets-doubled", "spec.components[0].podSets: 1 pod sets cannot become 2"),
        ("path", "spec.components[0].podSets[0].path cannot change from 'template.spec.template'"),
        ("replicas", "spec.components[0].podSets[0].replicas cannot change from 2 to 12"),
        ("suspend", None),
        ("replicas-default-written", None),
    ],
)
def test_immutable(change: str, want: str | None) -> None:
    problems = immutable_problems(*changed(change))
    if want is None:
        assert problems == []
    else:
        assert len(problems) == 1, problems
        assert want in problems[0]
