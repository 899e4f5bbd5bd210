"""The CRD (crds/appwrapper.yaml), the pydantic models and the samples/ must not drift apart."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.api.constants import LABEL_QUEUE
from dispatcher.api.models import API_VERSION, KIND, AppWrapper
from dispatcher.api.resources import Resources
from dispatcher.core.convert import V1BETA2, convert
from dispatcher.core.podsets import infer_pod_sets

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "appwrapper.yaml"
SAMPLES = sorted((ROOT / "samples").glob("*.yaml"))
OPAQUE = {"generictemplate"}  # wrapped objects: any Kubernetes object, not described here

Schema = dict[str, Any]


def load_crd() -> Schema:
    crd: Schema = yaml.safe_load(CRD_PATH.read_text())
    return crd


def crd_version(name: str = "v1beta1") -> Schema:
    (version,) = [v for v in load_crd()["spec"]["versions"] if v["name"] == name]
    return version  # type: ignore[no-any-return]


def crd_root() -> Schema:
    return crd_version()["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def model_root() -> Schema:
    return AppWrapper.model_json_schema(by_alias=True)


# -- walking the two schemas -------------------------------------------------------------------


def resolve_model(node: Schema, defs: Schema) -> Schema:
    """Follow $ref and drop the `null` branch of Optional[...]."""
    while True:
        if "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[-1]]
        elif "anyOf" in node:
            branches = [b for b in node["anyOf"] if b.get("type") != "null"]
            if len(branches) != 1:
                return node  # a real union (a quantity: str | int | float)
            node = branches[0]
        else:
            return node


def model_type(node: Schema) -> str | None:
    kind = node.get("type")
    return kind if isinstance(kind, str) else None


def compare(crd: Schema, model: Schema, defs: Schema, path: str, problems: list[str]) -> None:
    model = resolve_model(model, defs)
    if crd.get("type") == "array" or model_type(model) == "array":
        if crd.get("type") != "array" or model_type(model) != "array":
            problems.append(f"{path}: array in one schema only")
            return
        compare(crd["items"], model["items"], defs, f"{path}[]", problems)
        return
    if "x-kubernetes-int-or-string" in crd:
        return  # quantities: the model takes str | int | float and parses them later
    if crd.get("type") != model_type(model):
        problems.append(f"{path}: CRD type {crd.get('type')!r}, model {model_type(model)!r}")
    if "enum" in crd and sorted(crd["enum"]) != sorted(model.get("enum", [])):
        problems.append(f"{path}: CRD enum {crd['enum']}, model {model.get('enum')}")
    if crd.get("minimum") != model.get("minimum"):
        problems.append(f"{path}: CRD minimum {crd.get('minimum')}, model {model.get('minimum')}")
    if sorted(crd.get("required", [])) != sorted(model.get("required", [])):
        problems.append(
            f"{path}: CRD requires {crd.get('required', [])}, model {model.get('required', [])}"
        )
    crd_props: Schema = crd.get("properties", {})
    model_props: Schema = model.get("properties", {})
    for name in sorted(set(crd_props) - set(model_props)):
        problems.append(f"{path}.{name}: in the CRD, not in the model")
    for name in sorted(set(model_props) - set(crd_props)):
        problems.append(f"{path}.{name}: in the model, not in the CRD")
    for name in sorted(set(crd_props) & set(model_props)):
        if name not in OPAQUE:
            compare(crd_props[name], model_props[name], defs, f"{path}.{name}", problems)
    crd_extra = crd.get("additionalProperties")
    model_extra = model.get("additionalProperties")
    if isinstance(crd_extra, dict) and isinstance(model_extra, dict):
        compare(crd_extra, model_extra, defs, f"{path}.*", problems)


@pytest.mark.parametrize("section", ["spec", "status"])
def test_crd_and_models_have_the_same_fields(section: str) -> None:
    model = model_root()
    problems: list[str] = []
    compare(
        crd_root()["properties"][section],
        model["properties"][section],
        model["$defs"],
        section,
        problems,
    )
    assert problems == []


def test_drift_check_notices_a_missing_field() -> None:
    crd = crd_root()["properties"]["spec"]
    del crd["properties"]["schedulingSpec"]["properties"]["requeuing"]["properties"]["growthType"]
    model = model_root()
    problems: list[str] = []
    compare(crd, model["properties"]["spec"], model["$defs"], "spec", problems)
    assert problems == ["spec.schedulingSpec.requeuing.growthType: in the model, not in the CRD"]


# -- the CRD itself ----------------------------------------------------------------------------


def test_crd_names_and_version() -> None:
    crd = load_crd()
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == "appwrappers.workload.codeflare.dev"
    spec = crd["spec"]
    assert f"{spec['group']}/{crd_version()['name']}" == API_VERSION
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": KIND,
        "listKind": "AppWrapperList",
        "plural": "appwrappers",
        "singular": "appwrapper",
        "shortNames": ["aw"],
    }
    version = crd_version()
    assert version["served"] is True
    assert version["storage"] is True
    assert version["subresources"] == {"status": {}}


def test_crd_is_small_enough_for_client_side_apply() -> None:
    # kubectl apply (client-side) stores the object in an annotation limited to 256 KiB.
    assert len(CRD_PATH.read_bytes()) < 64 * 1024


def test_printer_columns_point_at_real_fields() -> None:
    columns = {c["name"]: c for c in crd_version()["additionalPrinterColumns"]}
    assert list(columns) == [
        "State",
        "Stage",
        "AppQueue",
        "Reason",
        "Cluster",
        "Priority",
        "Requeues",
        "ClusterQueue",
        "Age",
    ]
    assert columns["Requeues"].get("priority") == 1
    assert columns["ClusterQueue"].get("priority") == 1
    # The label the dispatcher reads first (core.workloads.queue_name_of), dots escaped.
    assert columns["AppQueue"]["jsonPath"] == (
        ".metadata.labels." + LABEL_QUEUE.replace(".", "\\.")
    )
    reason = columns.pop("Reason")["jsonPath"]
    assert reason == '.status.conditions[?(@.type=="Dispatched")].reason'
    assert (
        "reason"
        in crd_root()["properties"]["status"]["properties"]["conditions"]["items"]["properties"]
    )
    assert columns["Age"] == {
        "name": "Age",
        "type": "date",
        "jsonPath": ".metadata.creationTimestamp",
    }
    status = crd_root()["properties"]["status"]["properties"]
    for column in columns.values():
        path = column["jsonPath"]
        if path.startswith(".status."):
            field: Schema = {"properties": status}
            for part in path.removeprefix(".status.").split("."):
                field = field["properties"][part]
            want = "integer" if column["type"] == "integer" else "string"
            assert field["type"] == want, column


def test_v1beta2_columns_keep_mcads_first_and_add_the_phase() -> None:
    # `kubectl get aw` reads v1beta2 (the preferred version): MCAD users' columns keep their
    # places, the queue columns match v1beta1's, the phase and v1beta2 conditions follow.
    v1 = {c["name"]: c for c in crd_version()["additionalPrinterColumns"]}
    v2 = {c["name"]: c for c in crd_version("v1beta2")["additionalPrinterColumns"]}
    assert list(v2) == [
        "State",
        "Stage",
        "AppQueue",
        "Reason",
        "Status",
        "Cluster",
        "Priority",
        "Quota Reserved",
        "Resources Deployed",
        "Unhealthy",
        "Requeues",
        "ClusterQueue",
        "Age",
    ]
    for shared in set(v1) & set(v2):
        assert v2[shared] == v1[shared], shared
    assert v2["Status"]["jsonPath"] == ".status.phase"


def walk(node: Schema, path: str) -> list[tuple[str, Schema]]:
    found = [(path, node)]
    for name, child in node.get("properties", {}).items():
        found += walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += walk(node["additionalProperties"], f"{path}.*")
    return found


def test_crd_schema_is_structural() -> None:
    for path, node in walk(crd_root(), ""):
        if node.get("x-kubernetes-int-or-string"):
            assert [b["type"] for b in node["anyOf"]] == ["integer", "string"], path
            continue
        assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, (
            path
        )
        if node["type"] == "array":
            assert "items" in node, path


def test_generictemplate_is_an_embedded_object_kept_as_written() -> None:
    """As MCAD's CRD: apiVersion and kind required and metadata checked as an object's,
    every other field kept as written; and the template itself may be absent."""
    spec = crd_root()["properties"]["spec"]["properties"]
    items = spec["resources"]["properties"]["GenericItems"]["items"]
    template = items["properties"]["generictemplate"]
    assert template == {
        "type": "object",
        "description": template["description"],
        "x-kubernetes-preserve-unknown-fields": True,
        "x-kubernetes-embedded-resource": True,
    }
    assert "generictemplate" not in items.get("required", [])


# -- a small validator for the CRD schema, so samples are checked without an API server ---------


def validate(value: Any, node: Schema, path: str = "") -> list[str]:
    """Errors the API server would report for `value` (strict field validation, as kubectl
    uses by default), for the schema features this CRD uses."""
    if "anyOf" in node:
        if isinstance(value, bool) or not isinstance(value, int | str):
            return [f"{path}: want integer or string, got {value!r}"]
        if isinstance(value, str) and "pattern" in node and not re.search(node["pattern"], value):
            return [f"{path}: {value!r} does not match {node['pattern']}"]
        return []
    kinds: dict[str, tuple[type, ...]] = {
        "object": (dict,),
        "array": (list,),
        "string": (str,),
        "integer": (int,),
        "number": (int, float),
        "boolean": (bool,),
    }
    kind = node["type"]
    if not isinstance(value, kinds[kind]) or (isinstance(value, bool) and kind != "boolean"):
        return [f"{path}: want {kind}, got {value!r}"]
    errors: list[str] = []
    if "enum" in node and value not in node["enum"]:
        errors.append(f"{path}: {value!r} not one of {node['enum']}")
    if "minimum" in node and value < node["minimum"]:
        errors.append(f"{path}: {value} < {node['minimum']}")
    if isinstance(value, list):
        element: Any
        for index, element in enumerate(value):
            errors += validate(element, node["items"], f"{path}[{index}]")
    if isinstance(value, dict):
        required = list(node.get("required", []))
        if node.get("x-kubernetes-embedded-resource"):
            required += ["apiVersion", "kind"]  # what the API server asks of an embedded object
        errors += [f"{path}.{name}: required" for name in required if name not in value]
        props = node.get("properties", {})
        extra = node.get("additionalProperties")
        for name, child in value.items():
            if name in props:
                errors += validate(child, props[name], f"{path}.{name}")
            elif isinstance(extra, dict):
                errors += validate(child, extra, f"{path}.{name}")
            elif props and not node.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f"{path}.{name}: unknown field")
    return errors


@pytest.mark.parametrize(
    ("patch", "want_error"),
    [
        pytest.param({"priority": "high"}, "want integer", id="priority-string"),
        pytest.param({"schedulingspec": {}}, "unknown field", id="typo"),
        pytest.param(
            {"schedulingSpec": {"requeuing": {"growthType": "quadratic"}}},
            "not one of",
            id="growth-type",
        ),
        pytest.param(
            {
                "resources": {
                    "GenericItems": [
                        {"generictemplate": {}, "custompodresources": [{"replicas": -1}]}
                    ]
                }
            },
            "< 0",
            id="replicas-negative",
        ),
        pytest.param(
            {
                "resources": {
                    "GenericItems": [
                        {
                            "generictemplate": {},
                            "custompodresources": [{"replicas": 1, "requests": {"cpu": "4 GB"}}],
                        }
                    ]
                }
            },
            "does not match",
            id="malformed-quantity",
        ),
        pytest.param(
            {"resources": {"GenericItems": [{"generictemplate": {"metadata": {"name": "x"}}}]}},
            ".generictemplate.apiVersion: required",
            id="template-without-apiversion",
        ),
    ],
)
def test_crd_rejects_bad_specs(patch: Schema, want_error: str) -> None:
    obj = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "x"}, "spec": patch}
    errors = validate(obj, crd_root())
    assert any(want_error in e for e in errors), errors


# -- samples -----------------------------------------------------------------------------------


def test_there_are_samples() -> None:
    names = {p.name for p in SAMPLES}
    assert {
        "ray-glue-1.yaml",
        "ray-glue-2.yaml",
        "job-completion.yaml",
        "service-deployment.yaml",
        "mcad-legacy.yaml",
    } <= names


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_sample_is_a_valid_appwrapper(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, path
    for written in docs:
        assert written["kind"] == KIND
        assert "namespace" not in written["metadata"], "samples apply to the current namespace"
        if written["apiVersion"] == V1BETA2:
            # A v1beta2 sample: valid there, and as the dispatcher reads it (converted).
            assert validate(written, crd_version("v1beta2")["schema"]["openAPIV3Schema"]) == []
            obj = convert(written, API_VERSION)
        else:
            obj = written
        assert obj["apiVersion"] == API_VERSION
        assert validate(obj, crd_root()) == []
        aw = AppWrapper.from_kube(obj)
        assert aw.spec.items, "a sample wraps something"
        for generic in aw.spec.items:
            template = generic.generictemplate
            assert template["apiVersion"]
            assert template["kind"]
            assert template["metadata"]["name"]
            assert "namespace" not in template["metadata"]
            for pods in generic.custompodresources or []:
                per_pod = pods.effective_requests()
                # each pod fits a fake node of 8 CPU / 32Gi / 4 GPU
                assert per_pod.fits_in(
                    Resources.parse({"cpu": 8, "memory": "32Gi", "nvidia.com/gpu": 4})
                ), per_pod


@pytest.mark.parametrize("name", ["glue-1", "glue-2"])
def test_ray_samples_reserve_what_their_pods_ask(name: str) -> None:
    """The blog's RayCluster, with a declaration equal to its pods: read as written (MCAD's
    way), a smaller one could start a gang kube-scheduler cannot place."""
    aw = AppWrapper.from_kube(yaml.safe_load((ROOT / "samples" / f"ray-{name}.yaml").read_text()))
    assert aw.metadata.name == name
    (generic,) = aw.spec.items
    assert generic.generictemplate["kind"] == "RayCluster"
    assert generic.generictemplate["metadata"]["name"] == name
    assert generic.custompodresources is not None
    declared = [(p.replicas, p.effective_requests()) for p in generic.custompodresources]
    assert declared == [
        (1, Resources.parse({"cpu": 2, "memory": "16G"})),
        (2, Resources.parse({"cpu": 4, "memory": "16G", "nvidia.com/gpu": 2})),
    ]
    templates = [
        (p.count, Resources({k: v for k, v in p.requests.items() if k != "pods"}))
        for p in infer_pod_sets(generic.generictemplate)
    ]
    assert templates == declared


def test_crd_item_limit_is_validations() -> None:
    """The CRD refuses more items at `kubectl apply` than validation allows (MAX_ITEMS);
    template size and depth cannot be bounded by the schema (unknown fields preserved), so
    validation alone enforces those."""
    from dispatcher.core.validation import MAX_ITEMS

    resources = crd_root()["properties"]["spec"]["properties"]["resources"]["properties"]
    assert resources["GenericItems"]["maxItems"] == MAX_ITEMS
    assert resources["Items"]["maxItems"] == MAX_ITEMS
