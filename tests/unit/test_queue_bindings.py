"""Queue bindings: an AppWrapper's namespace reaches a cluster queue through a namespaced
queue (an AppQueue or a Kueue LocalQueue, to a ClusterAppQueue or a Kueue ClusterQueue), and
every such binding honours the cluster queue's `namespaceSelector` (unset admits no
namespace, `{}` every namespace, as in Kueue); and the notes kept on Kueue's objects go with
their objects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.api.queues import AppQueue, ClusterAppQueue
from dispatcher.clock import ManualClock
from dispatcher.config import Config
from dispatcher.controller.quota.objects import Quotas
from dispatcher.core.quota.kueue import KueueObjects, KueueQuotas, with_kueue
from dispatcher.core.quota.read import setup_of
from dispatcher.core.quota.resolve import Queued, QueueProblem, resolve
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.events import EventRecorder
from dispatcher.kube.informer import Informer
from testenv.fakekube import FakeKube

Obj = dict[str, Any]
UNSET = object()
"""No `namespaceSelector` at all."""
GROUPS = [
    {
        "coveredResources": ["cpu"],
        "flavors": [{"name": "f", "resources": [{"name": "cpu", "nominalQuota": 2}]}],
    }
]
LABELS = {"team-a": {"team": "a"}, "team-b": {"team": "b"}, "bare": {}}


def cluster_queue(name: str, selector: object) -> Obj:
    spec: Obj = {"resourceGroups": GROUPS}
    if selector is not UNSET:
        spec["namespaceSelector"] = selector
    return {"metadata": {"name": name}, "spec": spec}


def local_queue(namespace: str, name: str, target: str) -> Obj:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": target}}


def bound(
    *, local_kind: str, queue_kind: str, selector: object, namespace: str
) -> Queued | QueueProblem | None:
    """Where an AppWrapper of `namespace` naming queue `q` goes, when `q` is a `local_kind`
    (AppQueue / LocalQueue) naming a `queue_kind` (ClusterAppQueue / ClusterQueue) `cq`."""
    queue = cluster_queue("cq", selector)
    local = local_queue(namespace, "q", "cq")
    mode = KueueQuotas.BESIDE
    if local_kind == "LocalQueue" and queue_kind == "ClusterQueue":
        mode = KueueQuotas.INSTEAD  # only Kueue's objects
    ours = setup_of(
        [ClusterAppQueue.model_validate(queue)] if queue_kind == "ClusterAppQueue" else [],
        [],
        [],
        [AppQueue.model_validate(local)] if local_kind == "AppQueue" else [],
        LABELS,
    )
    kueue = KueueObjects(
        cluster_queues=[queue] if queue_kind == "ClusterQueue" else [],
        flavors=[{"metadata": {"name": "f"}, "spec": {}}],
        local_queues=[local] if local_kind == "LocalQueue" else [],
    )
    setup, _ = with_kueue(ours, kueue, mode)
    return resolve(namespace, "q", setup, QuotaTree(setup))


ROUTES = [
    (local, queue)
    for local in ("AppQueue", "LocalQueue")
    for queue in ("ClusterAppQueue", "ClusterQueue")
]


@dataclass(frozen=True)
class Case:
    id: str
    selector: object
    namespace: str
    want: str  # "" = admitted; else a part of the waiting message


CASES = [
    Case("selected", {"matchLabels": {"team": "a"}}, "team-a", ""),
    Case(
        "another team's namespace",
        {"matchLabels": {"team": "a"}},
        "team-b",
        "cluster queue cq does not admit namespace team-b",
    ),
    Case(
        "an unlabelled namespace",
        {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]},
        "bare",
        "does not admit namespace bare",
    ),
    Case(
        "by the name the API server labels it with",
        {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}},
        "team-a",
        "does not admit namespace team-a",  # LABELS here carry no such label
    ),
    Case("unset: no namespace", UNSET, "team-a", "admits no namespace"),
    Case("null: no namespace", None, "team-a", "admits no namespace"),
    Case("{}: every namespace", {}, "bare", ""),
]


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r[0]}->{r[1]}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_binding_honours_the_namespace_selector(case: Case, route: tuple[str, str]) -> None:
    found = bound(
        local_kind=route[0], queue_kind=route[1], selector=case.selector, namespace=case.namespace
    )
    if case.want:
        assert isinstance(found, QueueProblem)
        assert case.want in found.message
        assert found.queue == "cq"  # counted as waiting there
    else:
        assert found == Queued(f"{case.namespace}/q", "cq")


LABEL_VALUES = st.sampled_from(["a", "b", "c"])


@given(
    wanted=st.dictionaries(st.sampled_from(["team", "tier"]), LABEL_VALUES, max_size=2),
    labels=st.dictionaries(st.sampled_from(["team", "tier", "other"]), LABEL_VALUES, max_size=3),
    route=st.sampled_from(ROUTES),
)
def test_admitted_exactly_when_the_selector_matches(
    wanted: dict[str, str], labels: dict[str, str], route: tuple[str, str]
) -> None:
    LABELS["probe"] = labels
    found = bound(
        local_kind=route[0],
        queue_kind=route[1],
        selector={"matchLabels": wanted},
        namespace="probe",
    )
    matches = all(labels.get(k) == v for k, v in wanted.items())
    assert isinstance(found, Queued) is matches


# -- Kueue notes go with their objects ------------------------------------------------------

LOCAL_QUEUES = ResourceInfo("kueue.x-k8s.io/v1beta1", "LocalQueue", "localqueues", True)


def test_kueue_notes_stay_bounded_as_local_queues_come_and_go() -> None:
    """Each LocalQueue with a field not read here makes a note naming it; made and deleted
    under new names, the notes kept are only those of the objects that exist."""
    kube = cast(KubeApi, FakeKube())
    quotas = Quotas(
        hub=kube,
        config=Config(kueue_quotas=KueueQuotas.BESIDE),
        events=EventRecorder(kube),
        clock=ManualClock(),
    )
    informer = Informer(kube, LOCAL_QUEUES)
    quotas.kueue.informers["LocalQueue"] = informer
    sizes = []
    for round_ in range(200):
        key = f"ns-{round_}/lq-{round_}"
        obj = local_queue(f"ns-{round_}", f"lq-{round_}", "cq")
        obj["spec"]["fairSharing"] = {"weight": "2"}  # noted: not read here
        informer.store[key] = obj
        quotas._on_change("", None, obj)
        quotas.tree()
        assert any(f"lq-{round_}" in n for n in quotas._noted)  # noted while it exists
        informer.store.pop(key)
        quotas._on_change("", obj, None)
        quotas.tree()
        sizes.append(len(quotas._noted))
    assert max(sizes) == 0
