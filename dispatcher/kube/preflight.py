"""Checks at start, before the dispatcher serves or dispatches anything: the installed
AppWrapper CRD must be one it can serve (the decision: `dispatcher/core/crdcheck.py`).

Side effects: one GET of the CRD, by name (the dispatcher's RBAC grants `get` on that name
only).
"""

from __future__ import annotations

import structlog

from dispatcher.core.crdcheck import UNDERSTOOD, crd_problem, versions_of
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import Forbidden, NotFound

__all__ = ["APPWRAPPER_CRD", "CRDS", "StartRefused", "check_appwrapper_crd"]

APPWRAPPER_CRD = "appwrappers.workload.codeflare.dev"
CRDS = ResourceInfo(
    "apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", False
)


class StartRefused(Exception):
    """The hub is not one this dispatcher may run on; the message says why and what to do."""


async def check_appwrapper_crd(
    api: KubeApi, *, name: str = APPWRAPPER_CRD, understood: tuple[str, ...] = UNDERSTOOD
) -> None:
    """Raise StartRefused unless the CRD `name` serves only versions in `understood` and
    stores objects in no other. Errors reaching the API server propagate as they are (the
    start fails; a supervisor restarts it)."""
    log = structlog.get_logger("preflight").bind(crd=name)
    try:
        crd = await api.get(CRDS, None, name)
    except NotFound:
        versions = None
    except Forbidden as exc:
        raise StartRefused(
            f"cannot read CustomResourceDefinition {name} ({exc}): the dispatcher checks at "
            "start that the installed AppWrapper CRD is one it serves; grant it get on that "
            "CRD by name (manifests/rbac.yaml)"
        ) from exc
    else:
        versions = versions_of(crd)
    problem = crd_problem(name, versions, understood=understood)
    if problem is not None:
        raise StartRefused(problem)
    assert versions is not None  # no problem means the CRD was there
    log.info("crd_checked", served=list(versions.served), stored=list(versions.stored))
