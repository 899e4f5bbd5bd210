"""Which members take which hub namespaces, and where their objects go: the mapping
(members[].namespaces), the scheduling filter and its message, and who owns an object in a
member. Pure: no API server."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.api.constants import LABEL_NAME, LABEL_NAMESPACE, LABEL_UID
from dispatcher.app import build, close
from dispatcher.cluster.capacity import CapacityCache
from dispatcher.cluster.member import Member, mapped_namespace, mapping_problems
from dispatcher.config import Config, MemberConfig
from dispatcher.core.model import ClusterSnapshot, Placement, QueueMode, Workload
from dispatcher.core.namespaces import Wildcard
from dispatcher.core.scheduling import schedule
from testenv.fakekube import FakeKube
from tests.unit.builders import cluster, node, pods, res, workload

NOW = 10_000.0


# -- the mapping --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mapping", "namespace", "want"),
    [
        pytest.param({"team-a": "batch-a"}, "team-a", "batch-a", id="listed"),
        pytest.param({"team-a": "batch-a"}, "team-b", None, id="not-listed"),
        pytest.param({}, "team-a", None, id="empty-takes-nothing"),
        pytest.param({"*": "*"}, "team-a", "team-a", id="star-keeps-the-name"),
        pytest.param({"*": "shared"}, "team-a", "shared", id="star-to-one-namespace"),
        pytest.param({"*": "*", "team-a": "batch-a"}, "team-a", "batch-a", id="own-entry-first"),
        pytest.param({"*": "*", "team-a": "batch-a"}, "team-b", "team-b", id="star-for-others"),
        pytest.param({"team-a": "*"}, "team-a", "team-a", id="star-value-keeps-the-name"),
    ],
)
def test_mapped_namespace(mapping: dict[str, str], namespace: str, want: str | None) -> None:
    assert mapped_namespace(mapping, namespace) == want


STAR = {"*": "*"}
TEAMS_ONLY = Wildcard(allowed=("team-*",))
PLATFORM_RESERVED = Wildcard(reserved=("gpu-operator", "*-system"))


@pytest.mark.parametrize(
    ("mapping", "wildcard", "namespace", "want"),
    [
        pytest.param(STAR, TEAMS_ONLY, "team-a", "team-a", id="allowed-pattern"),
        pytest.param(STAR, TEAMS_ONLY, "gpu-operator", None, id="outside-the-allowed"),
        pytest.param(STAR, PLATFORM_RESERVED, "team-a", "team-a", id="not-reserved"),
        pytest.param(STAR, PLATFORM_RESERVED, "gpu-operator", None, id="reserved-name"),
        pytest.param(STAR, PLATFORM_RESERVED, "istio-system", None, id="reserved-pattern"),
        pytest.param(
            STAR, Wildcard(allowed=("*",)), "kube-system", None, id="system-never-by-star"
        ),
        pytest.param(STAR, Wildcard(allowed=("*",)), "kube-node-lease", None, id="lease-ns"),
        pytest.param(STAR, Wildcard(allowed=("kube-*",)), "kube-public", None, id="even-allowed"),
        pytest.param(
            {"*": "*", "kube-system": "kube-system"},
            TEAMS_ONLY,
            "kube-system",
            "kube-system",
            id="explicit-entry-unaffected",
        ),
        pytest.param(
            {"*": "*", "gpu-operator": "gpus"},
            PLATFORM_RESERVED,
            "gpu-operator",
            "gpus",
            id="explicit-entry-beats-reserved",
        ),
        pytest.param(
            {"*": "shared"},
            Wildcard(allowed=("team-*",), reserved=("team-x",)),
            "team-x",
            None,
            id="reserved-wins-over-allowed",
        ),
    ],
)
def test_what_the_star_key_takes(
    mapping: dict[str, str], wildcard: Wildcard, namespace: str, want: str | None
) -> None:
    assert mapped_namespace(mapping, namespace, wildcard) == want


def member(
    *, is_hub: bool = False, namespaces: dict[str, str] | None = None, **settings: Any
) -> Member:
    config = MemberConfig(name="west", namespaces=namespaces or {}, **settings)
    return Member.build(config, FakeKube(name="west"), is_hub=is_hub)


@dataclass(frozen=True)
class MemberCase:
    id: str
    is_hub: bool
    namespaces: dict[str, str]
    want_for_team_a: str | None
    want_hub_namespaces: frozenset[str] | None
    want_own_namespaces: tuple[str, ...] | None


MEMBER_CASES = [
    MemberCase("hub-ignores-the-mapping", True, {"x": "y"}, "team-a", None, None),
    MemberCase("hub-without-mapping", True, {}, "team-a", None, None),
    MemberCase("member-without-mapping", False, {}, None, frozenset(), ()),
    MemberCase(
        "two-into-one",
        False,
        {"team-a": "shared", "team-b": "shared"},
        "shared",
        frozenset({"team-a", "team-b"}),
        ("shared",),
    ),
    MemberCase("star", False, {"*": "*", "team-b": "b"}, "team-a", frozenset({"team-b"}), None),
]


@pytest.mark.parametrize("case", MEMBER_CASES, ids=[c.id for c in MEMBER_CASES])
def test_where_a_member_puts_each_namespace(case: MemberCase) -> None:
    built = member(is_hub=case.is_hub, namespaces=case.namespaces)
    assert built.namespace_for("team-a") == case.want_for_team_a
    assert built.hub_namespaces == case.want_hub_namespaces
    assert built.own_namespaces == case.want_own_namespaces


def test_member_settings_are_carried_and_namespaces_default_to_restricted() -> None:
    built = member(namespaces={"*": "*"}, create_namespaces=True)
    assert built.create_namespaces
    assert built.namespace_labels == {"pod-security.kubernetes.io/enforce": "restricted"}
    assert not member().create_namespaces


STAR_REFUSED = (
    'the key "*" takes every hub namespace under any name a tenant chooses (one named like a'
    " namespace only this member has, such as gpu-operator, would land pods there): name the"
    " namespaces it may take (wildcard_allowed) or those it must never take"
    " (wildcard_reserved)"
)


@pytest.mark.parametrize(
    ("mapping", "allowed", "reserved", "want"),
    [
        pytest.param({"*": "*", "team-a": "batch-a"}, ["team-*"], [], [], id="star-allowed"),
        pytest.param({"*": "*"}, [], ["*-system", "gpu-operator"], [], id="star-reserved"),
        pytest.param({"*": "*", "team-a": "batch-a"}, [], [], [STAR_REFUSED], id="star-alone"),
        pytest.param({"*": "shared"}, [], [], [STAR_REFUSED], id="star-to-one-alone"),
        pytest.param({"team-a": "*"}, [], [], [], id="star-value-is-explicit"),
        pytest.param(
            {"*": "*"},
            ["Team_*", "team-[ab]"],
            [],
            ["'Team_*' is not a namespace name or a glob pattern of one"],
            id="bad-pattern",
        ),
    ],
)
def test_a_star_key_needs_allowed_or_reserved(
    mapping: dict[str, str], allowed: list[str], reserved: list[str], want: list[str]
) -> None:
    assert mapping_problems(mapping, allowed, reserved) == want


@pytest.mark.parametrize(
    ("mapping", "want"),
    [
        pytest.param({"team-a": "batch-a"}, [], id="fine"),
        pytest.param({"Team_A": "a"}, ["'Team_A' is neither \"*\" nor a namespace name"], id="key"),
        pytest.param(
            {"a": "b" * 64}, [f"'{'b' * 64}' is neither \"*\" nor a namespace name"], id="long"
        ),
        pytest.param({"a": ""}, ["'' is neither \"*\" nor a namespace name"], id="empty"),
    ],
)
def test_mapping_problems(mapping: dict[str, str], want: list[str]) -> None:
    assert mapping_problems(mapping) == want


# -- who owns an object in a member -------------------------------------------------------


def meta(namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": "p", "namespace": namespace, "labels": labels}


OURS = {LABEL_NAME: "a", LABEL_NAMESPACE: "team-a", LABEL_UID: "u1"}


@pytest.mark.parametrize(
    ("namespace", "labels", "want"),
    [
        pytest.param("batch-a", OURS, ("team-a/a", "u1"), id="in-the-mapped-namespace"),
        pytest.param("team-a", OURS, None, id="in-the-hub-namespace-name"),
        pytest.param("batch-a", {**OURS, LABEL_NAMESPACE: "team-b"}, None, id="other-tenant"),
        pytest.param("batch-a", {**OURS, LABEL_NAMESPACE: "team-c"}, None, id="unmapped-tenant"),
        pytest.param("batch-a", {LABEL_NAME: "a", LABEL_UID: "u1"}, None, id="no-namespace-label"),
        pytest.param("batch-a", {LABEL_NAME: "a", LABEL_NAMESPACE: "team-a"}, None, id="no-uid"),
    ],
)
def test_an_object_is_its_appwrappers_only_where_its_namespace_maps(
    namespace: str, labels: dict[str, str], want: tuple[str, str] | None
) -> None:
    west = member(namespaces={"team-a": "batch-a", "team-b": "batch-b"})
    assert west.owner(meta(namespace, labels)) == want


def test_the_hub_owns_objects_in_the_appwrappers_own_namespace_only() -> None:
    hub = member(is_hub=True, namespaces={"team-a": "batch-a"})
    assert hub.owner(meta("team-a", OURS)) == ("team-a/a", "u1")
    assert hub.owner(meta("batch-a", OURS)) is None


def running_pod(namespace: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"nodeName": "n1", "containers": [{"resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Running"},
    }


def test_pods_count_for_their_hub_appwrapper_and_look_alikes_for_nobody() -> None:
    """What the pod watch delivers: the hub identity where the mapping puts it; a copy of
    the labels anywhere else loses them on arrival."""
    west = member(namespaces={"team-a": "shared", "team-b": "shared"})
    capacity = CapacityCache(cluster="west")
    for pod in (
        running_pod("shared", "a-0", OURS),
        running_pod("shared", "b-0", {**OURS, LABEL_NAMESPACE: "team-b", LABEL_UID: "u2"}),
        running_pod("elsewhere", "spoof", OURS),
        running_pod("shared", "spoof-c", {**OURS, LABEL_NAMESPACE: "team-c"}),
    ):
        capacity.on_pod("ADDED", None, west._vouched(pod))
    assert capacity.pod_counts("team-a/a", "u1").running == 1
    assert capacity.pod_counts("team-b/a", "u2").running == 1
    assert capacity.pod_counts("team-c/a", "u1").total == 0
    assert sorted(capacity.owners()) == [("team-a/a", "u1"), ("team-b/a", "u2")]
    # Every pod still holds room on its node, whoever it belongs to.
    assert capacity.requested["n1"] == res(cpu=4) + {"pods": 4000}


# -- the scheduling filter ----------------------------------------------------------------


def cpu_cluster(
    name: str, cpu: int = 8, *, takes: set[str] | None = None, star: Wildcard | None = None
) -> ClusterSnapshot:
    snapshot = cluster(name, node(f"{name}-n1", cpu=cpu), labels={"region": name})
    taken = None if takes is None else frozenset(takes)
    return replace(snapshot, namespaces=taken, wildcard=star)


def job(key: str, cpu: int = 2, **kwargs: Any) -> Workload:
    return workload(key, pods(1, cpu=cpu), **kwargs)


@dataclass(frozen=True)
class Case:
    id: str
    pending: tuple[Workload, ...]
    clusters: tuple[ClusterSnapshot, ...]
    want_admits: dict[str, str] = field(default_factory=dict)
    want_waits: dict[str, str] = field(default_factory=dict)
    mode: QueueMode = QueueMode.BEST_EFFORT_FIFO


CASES = [
    Case(
        id="only-members-that-take-the-namespace",
        # west is the better fit (less room left), but does not take team-a.
        pending=(job("team-a/x", 2),),
        clusters=(cpu_cluster("east", 8, takes={"team-a"}), cpu_cluster("west", 2, takes=set())),
        want_admits={"team-a/x": "east"},
    ),
    Case(
        id="the-hub-takes-every-namespace",
        pending=(job("team-a/x"),),
        clusters=(cpu_cluster("local"), cpu_cluster("west", takes={"team-b"})),
        want_admits={"team-a/x": "local"},
    ),
    Case(
        id="one-member-left-out",
        pending=(job("team-a/x"),),
        clusters=(cpu_cluster("west", takes={"team-b"}),),
        want_waits={
            "team-a/x": "cluster west: namespace team-a is not mapped to it (members[].namespaces)"
        },
    ),
    Case(
        id="every-member-left-out",
        pending=(job("team-a/x"),),
        clusters=(cpu_cluster("west", takes=set()), cpu_cluster("east", takes={"team-b"})),
        want_waits={
            "team-a/x": "clusters east, west: namespace team-a is not mapped to them "
            "(members[].namespaces)"
        },
    ),
    Case(
        id="names-only-the-members-the-placement-allows",
        pending=(job("team-a/x", placement=Placement(clusters=frozenset({"west"}))),),
        clusters=(cpu_cluster("east", takes={"team-a"}), cpu_cluster("west", takes={"team-b"})),
        want_waits={
            "team-a/x": "cluster west: namespace team-a is not mapped to it (members[].namespaces)"
        },
    ),
    Case(
        id="placement-first",
        pending=(job("team-a/x", placement=Placement(clusters=frozenset({"mars"}))),),
        clusters=(cpu_cluster("west", takes=set()),),
        want_waits={"team-a/x": "no member cluster matches the placement (clusterScheduling)"},
    ),
    Case(
        id="selector-and-mapping-together",
        pending=(job("team-a/x", placement=Placement(match_labels=(("region", "east"),))),),
        clusters=(cpu_cluster("east", takes={"team-a"}), cpu_cluster("west", takes={"team-a"})),
        want_admits={"team-a/x": "east"},
    ),
    Case(
        id="same-shape-other-namespace-same-cycle",
        # The refusal of team-a's gang must not answer for team-b's gang of the same shape.
        pending=(job("team-a/x", created_at=1), job("team-b/y", created_at=2)),
        clusters=(cpu_cluster("west", takes={"team-b"}),),
        want_admits={"team-b/y": "west"},
        want_waits={
            "team-a/x": "cluster west: namespace team-a is not mapped to it (members[].namespaces)"
        },
    ),
    Case(
        id="strict-fifo-not-blocked-by-an-unmapped-head",
        # Waiting cannot help it: it holds nothing back, as one too large for every member.
        pending=(job("team-a/x", created_at=1), job("team-b/y", created_at=2)),
        clusters=(cpu_cluster("west", takes={"team-b"}),),
        want_admits={"team-b/y": "west"},
        want_waits={
            "team-a/x": "cluster west: namespace team-a is not mapped to it (members[].namespaces)"
        },
        mode=QueueMode.STRICT_FIFO,
    ),
    Case(
        id="star-takes-an-allowed-namespace",
        pending=(job("team-a/x"),),
        clusters=(cpu_cluster("west", takes=set(), star=TEAMS_ONLY),),
        want_admits={"team-a/x": "west"},
    ),
    Case(
        id="star-outside-the-allowed-says-why",
        pending=(job("gpu-operator/x"),),
        clusters=(cpu_cluster("west", takes=set(), star=TEAMS_ONLY),),
        want_waits={
            "gpu-operator/x": "cluster west: namespace gpu-operator is not mapped to it"
            ' (members[].namespaces): "*" takes only the namespaces'
            " members[].wildcard_allowed names"
        },
    ),
    Case(
        id="star-reserved-and-unmapped-grouped-by-reason",
        pending=(job("istio-system/x"),),
        clusters=(
            cpu_cluster("east", takes={"team-a"}),
            cpu_cluster("west", takes=set(), star=PLATFORM_RESERVED),
            cpu_cluster("north", takes=set(), star=PLATFORM_RESERVED),
        ),
        want_waits={
            "istio-system/x": "cluster east: namespace istio-system is not mapped to it"
            " (members[].namespaces); clusters north, west: namespace istio-system is not"
            ' mapped to them (members[].namespaces): "*" does not take it: reserved by'
            " '*-system' (members[].wildcard_reserved)"
        },
    ),
    Case(
        id="star-never-kube-system",
        pending=(job("kube-system/x"),),
        clusters=(cpu_cluster("west", takes=set(), star=Wildcard(allowed=("*",))),),
        want_waits={
            "kube-system/x": "cluster west: namespace kube-system is not mapped to it"
            ' (members[].namespaces): "*" never takes kube-system (a Kubernetes system'
            " namespace)"
        },
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_members_are_filtered_by_namespace(case: Case) -> None:
    result = schedule(
        case.pending,
        case.clusters,
        mode=case.mode,
        now=NOW,
        starvation_after=1e9,
        preemption=None,
    )
    assert {a.key: a.cluster for a in result.admits} == case.want_admits
    assert {w.key: w.message for w in result.waits} == case.want_waits


# -- the refusal at start -----------------------------------------------------------------


async def test_the_dispatcher_refuses_to_start_with_a_bare_star_key(tmp_path: Path) -> None:
    """`app.build` reads the settings before anything runs: a member mapping "*" without
    wildcard_allowed or wildcard_reserved stops it with the member's name and the fix."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    bare = MemberConfig(name="west", kubeconfig=str(kubeconfig), namespaces={"*": "*"})
    config = Config(kubeconfig=str(kubeconfig), members=[bare])
    with pytest.raises(ValueError, match=r"^members\[west\]\.namespaces: ") as refused:
        await build(config)
    assert str(refused.value) == f"members[west].namespaces: {STAR_REFUSED}"
    fenced = bare.model_copy(update={"wildcard_reserved": ["*-system"]})
    manager = await build(config.model_copy(update={"members": [fenced]}))
    try:
        assert manager.members["west"].namespace_for("team-a") == "team-a"
        assert manager.members["west"].namespace_for("istio-system") is None
    finally:
        await close(manager)
