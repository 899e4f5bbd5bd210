"""The check at start on the hub's AppWrapper CRD: the pure decision (core/crdcheck.py) as a
table, and the shell (kube/preflight.py) on the in-memory API server for the answers a real
one cannot be made to give on the shared test CRD (absent, forbidden). The real API server,
with a CRD that stores v1beta2: tests/e2e/test_preflight.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.core.crdcheck import CrdVersions, crd_problem, versions_of
from dispatcher.kube.errors import Forbidden
from dispatcher.kube.preflight import APPWRAPPER_CRD, CRDS, StartRefused, check_appwrapper_crd
from testenv.fakekube import FakeKube

NAME = APPWRAPPER_CRD
CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "appwrapper.yaml"


def crd(
    *versions: tuple[str, bool],
    stored: list[str] | None = None,
    conversion: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "versions": [{"name": n, "served": s, "storage": False} for n, s in versions]
    }
    if conversion is not None:
        spec["conversion"] = conversion
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": NAME},
        "spec": spec,
        "status": {"storedVersions": stored if stored is not None else []},
    }


def webhook(**client_config: Any) -> dict[str, Any]:
    return {"strategy": "Webhook", "webhook": {"clientConfig": client_config}}


OURS = webhook(service={"namespace": "appwrapper-system", "name": "x", "path": "/convert"})


@dataclass(frozen=True)
class Case:
    id: str
    crd: dict[str, Any] | None
    want: str | None  # a fragment of the refusal; None: it may start
    want_also: tuple[str, ...] = ()


CASES = [
    Case("ours", crd(("v1beta1", True), stored=["v1beta1"]), None),
    Case("ours, nothing stored yet", crd(("v1beta1", True), stored=[]), None),
    Case(
        "ours applied over theirs: v1beta2 kept in storedVersions",
        crd(("v1beta1", True), ("v1beta2", False), stored=["v1beta2", "v1beta1"]),
        "has stored objects as v1beta2 (status.storedVersions: v1beta2, v1beta1)",
        ("Do not apply crds/appwrapper.yaml over it", "one AppWrapper controller per cluster"),
    ),
    Case(
        "theirs: serves and stores v1beta2",
        crd(("v1beta2", True), stored=["v1beta2"]),
        "has stored objects as v1beta2",
        ("project-codeflare/appwrapper",),
    ),
    Case(
        "theirs, nothing stored yet: serves v1beta2",
        crd(("v1beta2", True), stored=[]),
        "serves v1beta2; this dispatcher understands v1beta1 only, not v1beta2",
        ("move one of them",),
    ),
    Case(
        "both served from one CRD, without conversion",
        crd(("v1beta1", True), ("v1beta2", True), stored=["v1beta1"]),
        "serves v1beta1, v1beta2; this dispatcher understands v1beta1 only, not v1beta2",
    ),
    Case(
        "ours with both generations: converted by our webhook",
        crd(("v1beta1", True), ("v1beta2", True), stored=["v1beta1"], conversion=OURS),
        None,
    ),
    Case(
        "ours over theirs: v1beta2 stored, readable through our conversion",
        crd(("v1beta1", True), ("v1beta2", True), stored=["v1beta2", "v1beta1"], conversion=OURS),
        None,
    ),
    Case(
        "ours with conversion by URL (a webhook out of cluster)",
        crd(("v1beta1", True), ("v1beta2", True), conversion=webhook(url="https://h:1/convert")),
        None,
    ),
    Case(
        "both served, converted by someone else's webhook",
        crd(("v1beta1", True), ("v1beta2", True), conversion=webhook(url="https://h/other")),
        "understands v1beta1 only, not v1beta2",
    ),
    Case(
        "theirs: conversion None",
        crd(("v1beta2", True), stored=["v1beta2"], conversion={"strategy": "None"}),
        "has stored objects as v1beta2",
    ),
    Case(
        "the repository's CRD",
        yaml.safe_load(CRD_FILE.read_text()) | {"status": {"storedVersions": ["v1beta1"]}},
        None,
    ),
    Case(
        "v1beta1 not served",
        crd(("v1beta1", False), stored=["v1beta1"]),
        "serves no version, not v1beta1",
    ),
    Case("absent", None, "is not installed: apply this dispatcher's CRDs first"),
    Case(
        "no status at all (an answer missing fields)",
        {"spec": {"versions": [{"name": "v1beta1", "served": True}]}},
        None,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_crd_problem(case: Case) -> None:
    versions = None if case.crd is None else versions_of(case.crd)
    problem = crd_problem(NAME, versions)
    if case.want is None:
        assert problem is None
        return
    assert problem is not None
    assert problem.startswith(f"CustomResourceDefinition {NAME} ")
    assert case.want in problem
    for fragment in case.want_also:
        assert fragment in problem


def test_versions_of_reads_served_and_stored() -> None:
    got = versions_of(crd(("v1beta1", True), ("v1beta2", False), stored=["v1beta2", "v1beta1"]))
    assert got == CrdVersions(
        served=("v1beta1",), not_served=("v1beta2",), stored=("v1beta2", "v1beta1")
    )


def fake_with_crd_kind() -> FakeKube:
    kube = FakeKube()
    kube.add_kind(CRDS.group_version, CRDS.kind, CRDS.plural, False, custom=False)
    return kube


async def test_the_shell_refuses_a_missing_crd_and_accepts_ours() -> None:
    kube = fake_with_crd_kind()
    with pytest.raises(StartRefused, match="is not installed"):
        await check_appwrapper_crd(kube)
    await kube.create(CRDS, None, crd(("v1beta1", True), stored=["v1beta1"]))
    await check_appwrapper_crd(kube)  # ours: no refusal


async def test_the_shell_says_which_right_is_missing_when_forbidden() -> None:
    kube = fake_with_crd_kind()
    kube.fail_next("get", kind=CRDS.kind, error=Forbidden("forbidden", status=403))
    with pytest.raises(StartRefused, match=r"grant it get on that CRD by name \(manifests/rbac"):
        await check_appwrapper_crd(kube)
