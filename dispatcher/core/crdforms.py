"""The AppWrapper CRD's two forms. Pure, no I/O.

Objects are stored as v1beta1 whatever version they are written in, so only requests in
v1beta2 call a conversion webhook. Where v1beta2 is served, it is also the version clients
prefer (`kubectl get aw`, the namespace controller's deletion, the garbage collector), and
every such request fails while no converter answers. So the CRD has two forms:

- **readable** (crds/appwrapper.yaml as shipped): v1beta1 served, v1beta2 listed but not
  served, no conversion. Nothing it serves needs a dispatcher: AppWrappers can be listed,
  described and deleted, and their namespaces deleted, before an install, after `run --dev`
  stops and after an uninstall.
- **converting** (what an install that converts applies: the Helm chart's template,
  manifests/crd-patches/conversion.json, `run --dev` while it runs, the test harnesses): v1beta2
  served too, converted by a webhook at `CONVERT_PATH`.

docs/api.md, "Who serves v1beta2", is the user's account of the same decision.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from dispatcher.core.crdcheck import CONVERT_PATH, CONVERTED

__all__ = ["converting", "is_ours", "readable"]


def is_ours(crd: Mapping[str, Any]) -> bool:
    """Whether `crd` has the shape of this dispatcher's AppWrapper CRD: v1beta1 its storage
    version, and v1beta2 listed. The AppWrapper v1beta2 controller's CRD (v1beta2 alone,
    stored) is not, and neither form is ever made of it."""
    versions = (crd.get("spec") or {}).get("versions") or []
    names = {v.get("name"): v for v in versions if isinstance(v, Mapping)}
    v1beta1 = names.get("v1beta1") or {}
    return v1beta1.get("storage") is True and all(n in names for n in CONVERTED)


def converting(crd: Mapping[str, Any], client_config: Mapping[str, Any]) -> dict[str, Any]:
    """`crd` serving v1beta2 too, converted by the webhook at `client_config` (a Kubernetes
    WebhookClientConfig: `service` or `url`, and `caBundle` where known); the input is not
    changed. `client_config` must name `CONVERT_PATH`."""
    path = (client_config.get("service") or {}).get("path") or str(client_config.get("url"))
    if not path.split("?", 1)[0].endswith(CONVERT_PATH):
        raise ValueError(f"a conversion webhook must call {CONVERT_PATH}: {dict(client_config)}")
    changed = _served(crd, True)
    changed["spec"]["conversion"] = {
        "strategy": "Webhook",
        "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": dict(client_config)},
    }
    return changed


def readable(crd: Mapping[str, Any]) -> dict[str, Any]:
    """`crd` as shipped: v1beta2 not served, no conversion; the input is not changed."""
    changed = _served(crd, False)
    changed["spec"]["conversion"] = {"strategy": "None"}
    return changed


def _served(crd: Mapping[str, Any], served: bool) -> dict[str, Any]:
    changed: dict[str, Any] = copy.deepcopy(dict(crd))
    for version in changed["spec"]["versions"]:
        if version.get("name") in CONVERTED:
            version["served"] = served
    return changed
