"""Member clusters' upkeep: requeue AppWrappers stranded on a silent member, and remove
wrapped objects whose hub AppWrapper is gone or now lives elsewhere.

Side effects: lists and deletes wrapped objects in member clusters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dispatcher.api.constants import LABEL_NAME, LABEL_NAMESPACE, LABEL_UID
from dispatcher.kube.client import KubeClient
from dispatcher.kube.errors import KubeError, UnknownKind, Unreachable

# Where each allowed kind usually lives; kinds seen in AppWrappers are added at run time.
KNOWN_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "Pod"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "ServiceAccount"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "ReplicaSet"),
    ("batch/v1", "Job"),
    ("networking.k8s.io/v1", "Ingress"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("ray.io/v1", "RayCluster"),
    ("ray.io/v1", "RayJob"),
    ("ray.io/v1", "RayService"),
    ("kubeflow.org/v1", "PyTorchJob"),
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"),
    ("scheduling.sigs.k8s.io/v1alpha1", "PodGroup"),
    ("route.openshift.io/v1", "Route"),
)


def owner_of(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """("namespace/name", uid) of the hub AppWrapper an object was made for, if any."""
    labels = obj.get("metadata", {}).get("labels") or {}
    if LABEL_NAME not in labels or LABEL_UID not in labels:
        return None
    namespace = labels.get(LABEL_NAMESPACE) or obj["metadata"].get("namespace")
    return f"{namespace}/{labels[LABEL_NAME]}", labels[LABEL_UID]


async def collect(
    client: KubeClient,
    *,
    member: str,
    kinds: Iterable[tuple[str, str]],
    keep: Mapping[str, tuple[str, str]],
) -> list[str]:
    """Delete objects labelled for an AppWrapper that `keep` does not place in this member.

    `keep` maps AppWrapper key -> (uid, member it is dispatched or being dispatched to).
    Returns "Kind ns/name" of what was deleted.
    """
    deleted: list[str] = []
    for api_version, kind in sorted(set(kinds)):
        try:
            info = await client.resource_info(api_version, kind)
        except UnknownKind:
            continue
        try:
            listing = await client.list(info, query={"labelSelector": LABEL_UID})
        except Unreachable:
            raise  # the member went quiet: try again when it answers
        except KubeError:
            continue
        for obj in listing.get("items", []):
            owner = owner_of(obj)
            if owner is None:
                continue
            key, uid = owner
            wanted = keep.get(key)
            if wanted is not None and wanted == (uid, member):
                continue
            meta = obj["metadata"]
            await client.delete(info, meta.get("namespace"), meta["name"], uid=meta.get("uid"))
            deleted.append(f"{kind} {meta.get('namespace')}/{meta['name']}")
    return deleted
