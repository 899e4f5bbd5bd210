"""The ProvisioningRequest admission check, as plain values. Pure, no I/O, no clock reads.

An AppWrapper held for its checks (`QuotaHeld`) gets, per check and attempt, one
`autoscaling.x-k8s.io/v1` ProvisioningRequest and a PodTemplate per pod set, all named from
its uid, the check and the attempt (`request_name`, `template_name`): a dispatcher killed
between creating them and recording anything finds the same names again, so nothing is
duplicated or orphaned (they are owned by the AppWrapper and go with it). The attempt in
force is the highest one that exists: the API server holds it, not the AppWrapper's status.

`verdict` reads a request's conditions into what the controller does next (docs/autoscaling.md):

| request says | before dispatch |
| --- | --- |
| nothing yet, `Accepted` | wait (the check stays Pending) |
| `Provisioned` | the check is Ready: the AppWrapper is fitted on the nodes again |
| `Provisioned`, not placed within the fit timeout | as `BookingExpired` below |
| `Failed` | retry after a backoff with the next attempt, up to the refusal limit; then fail it |
| `BookingExpired` (not dispatched yet) | give the quota back and reserve again: a new attempt |
| `CapacityRevoked` | as `BookingExpired` before dispatch; after it, a requeue as for a lost node |

The fit timeout is the liveness of a provisioned gang: its new nodes are ordinary nodes, and
pods of other work (kube-scheduler binds them where it likes) may take some before the gang
is placed. It would then wait for ever on a booking that no longer holds it; after
`fit_timeout` seconds of being fitted without being placed it asks again, exactly as for an
expired booking. A refusal is the provisioner's answer and counts towards the retry limit;
nodes taken by others are not, so the AppWrapper is never failed for them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dispatcher.core.model import PodSet
from dispatcher.core.retry import retry_delay

PROVISIONING_API = "autoscaling.x-k8s.io/v1"
CHECK_CAPACITY = "check-capacity.autoscaling.x-k8s.io"
BEST_EFFORT_ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
KNOWN_CLASSES = (CHECK_CAPACITY, BEST_EFFORT_ATOMIC, "queued-provisioning.gke.io")
"""Classes the cluster autoscaler (and GKE's) serve; another is refused as misconfigured:
no provisioner answers it, so the AppWrapper would wait for ever with its quota held."""

OVERCOMMITTED = frozenset({"cpu", "memory", "ephemeral-storage"})
"""Resources a container may request below its limit; any other must set both alike."""

UID_LABEL = "workload.codeflare.dev/appwrapper-uid"
CHECK_LABEL = "workload.codeflare.dev/admission-check"
ATTEMPT_LABEL = "workload.codeflare.dev/attempt"


class Step(StrEnum):
    WAIT = "wait"
    READY = "ready"
    RETRY = "retry"  # a new attempt after `after` seconds, the quota kept
    RESERVE_AGAIN = "reserve-again"  # the quota given back; a later cycle reserves it again
    FAIL = "fail"  # the retries are spent: the AppWrapper fails with the message
    REVOKED = "revoked"  # after dispatch: requeue as for a lost node


@dataclass(frozen=True, slots=True)
class Verdict:
    step: Step
    message: str
    after: float = 0.0  # RETRY: seconds still to wait before the next attempt; READY: until
    # the fit timeout (0: none)


@dataclass(frozen=True, slots=True)
class Retry:
    """A check's retry rules (Kueue's ProvisioningRequestConfig retryStrategy)."""

    limit: int = 3  # attempts after the first
    base_seconds: float = 60.0
    max_seconds: float = 1800.0

    def backoff(self, attempt: int) -> float:
        """Seconds between attempt `attempt`'s failure and the next: doubling, capped."""
        return retry_delay(self.base_seconds, attempt - 1, self.max_seconds)


def request_name(uid: str, check: str, attempt: int) -> str:
    return f"aw-{uid}-{check}-{attempt}"


def template_name(uid: str, check: str, attempt: int, index: int) -> str:
    return f"aw-{uid}-{check}-{attempt}-ps{index}"


OWNER_GROUP = "workload.codeflare.dev/"
"""The apiVersion prefix of the AppWrapper a request's controller reference names."""


def foreign(request: Mapping[str, Any], *, namespace: str, uid: str) -> str:
    """Why `request` is not one the dispatcher made for the AppWrapper `uid` of `namespace`
    ("" = it is one of its requests).

    Anyone allowed to create ProvisioningRequests may give one any labels, in any namespace
    they may write to; the uid label alone would let a tenant's request count for another
    team's AppWrapper (make it abandon its own and ask again, without end). So a request
    counts only where all of these hold, as the dispatcher writes them (`request_objects`):
    it is in the AppWrapper's namespace, its labels name the AppWrapper's uid, a check and
    an attempt, its name is the one those fix, and a controller reference names the
    AppWrapper's uid."""
    meta = request.get("metadata") or {}
    where = meta.get("namespace")
    if where != namespace:
        return f"in namespace {where}, not the AppWrapper's ({namespace})"
    labels = meta.get("labels") or {}
    if not uid or labels.get(UID_LABEL) != uid:
        return f"its {UID_LABEL} label is not the AppWrapper's uid"
    check = labels.get(CHECK_LABEL)
    attempt = labels.get(ATTEMPT_LABEL)
    if not isinstance(check, str) or not check:
        return f"no {CHECK_LABEL} label"
    # ASCII digits, unpadded (str.isdigit() takes "²", which int() refuses; label values
    # are ASCII on a real API server, but this reads what any store holds).
    if not isinstance(attempt, str) or not re.fullmatch(r"0|[1-9][0-9]{0,8}", attempt):
        return f"its {ATTEMPT_LABEL} label is not a number"
    wanted = request_name(uid, check, int(attempt))
    if meta.get("name") != wanted:
        return f"named {meta.get('name')}, not {wanted}"
    for owner in meta.get("ownerReferences") or []:
        if (
            owner.get("uid") == uid
            and owner.get("controller") is True
            and owner.get("kind") == "AppWrapper"
            and str(owner.get("apiVersion") or "").startswith(OWNER_GROUP)
        ):
            return ""
    return "no controller reference to the AppWrapper"


def latest_round(requests: Iterable[Mapping[str, Any]], check: str) -> int:
    """The highest attempt of `check` among the AppWrapper's requests (0: none yet)."""
    best = 0
    for request in requests:
        labels = (request.get("metadata") or {}).get("labels") or {}
        if labels.get(CHECK_LABEL) != check:
            continue
        try:
            best = max(best, int(labels.get(ATTEMPT_LABEL, "0")))
        except ValueError:
            continue
    return best


def refusals(requests: Iterable[Mapping[str, Any]], check: str) -> int:
    """How many of `check`'s requests the provisioner refused (`Failed`): only these count
    towards the retry limit (an expired booking, or nodes taken, is not a refusal)."""
    count = 0
    for request in requests:
        labels = (request.get("metadata") or {}).get("labels") or {}
        if labels.get(CHECK_LABEL) == check and "Failed" in _conditions(request):
            count += 1
    return count


def _conditions(request: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    found = (request.get("status") or {}).get("conditions") or []
    return {str(c.get("type")): c for c in found if c.get("status") == "True"}


def verdict(
    request: Mapping[str, Any],
    *,
    attempt: int,
    retry: Retry,
    now: float,
    failed_at: float | None,
    dispatched: bool,
    refused: int | None = None,
    fitting_since: float | None = None,
    fit_timeout: float | None = None,
) -> Verdict:
    """What request `attempt` (its object as read) means now. `failed_at`: when its
    `Failed` condition turned True (seconds since the epoch), if it did. `refused`: the
    check's refused requests, this one included (`refusals`; None: every attempt was).
    `fitting_since`: when every check of the AppWrapper was Ready and it went back to the
    fit (None: not yet); past `fit_timeout` seconds of that it asks again. A READY verdict's
    `after` is the time left until then (0: no timeout)."""
    true = _conditions(request)

    def said(kind: str, default: str) -> str:
        return str(true[kind].get("message") or default)

    if "Failed" in true:
        message = said("Failed", "the provisioner refused it")
        count = attempt if refused is None else refused
        if count > retry.limit:
            return Verdict(Step.FAIL, f"provisioning failed {count} times: {message}")
        wait = retry.backoff(count) - (now - (failed_at if failed_at is not None else now))
        return Verdict(
            Step.RETRY,
            f"attempt {attempt} failed ({message}); refusal {count} of at most"
            f" {retry.limit + 1}, attempt {attempt + 1} follows",
            after=max(0.0, wait),
        )
    if "CapacityRevoked" in true:
        message = said("CapacityRevoked", "its capacity was revoked")
        return Verdict(Step.REVOKED if dispatched else Step.RESERVE_AGAIN, message)
    if dispatched:
        return Verdict(Step.WAIT, "dispatched")
    if "BookingExpired" in true:
        return Verdict(
            Step.RESERVE_AGAIN,
            f"the booking of attempt {attempt} expired before dispatch: "
            + said("BookingExpired", "capacity no longer booked"),
        )
    if "Provisioned" in true:
        return _provisioned(
            said("Provisioned", f"provisioned (attempt {attempt})"),
            attempt,
            now=now,
            fitting_since=fitting_since,
            fit_timeout=fit_timeout,
        )
    if "Accepted" in true:
        return Verdict(Step.WAIT, f"attempt {attempt} accepted, waiting for capacity")
    return Verdict(Step.WAIT, f"attempt {attempt} created, waiting for the provisioner")


def _provisioned(
    message: str,
    attempt: int,
    *,
    now: float,
    fitting_since: float | None,
    fit_timeout: float | None,
) -> Verdict:
    """Ready; or, fitted for longer than `fit_timeout` without being placed, ask again."""
    if fitting_since is None or fit_timeout is None:
        return Verdict(Step.READY, message)
    left = fit_timeout - (now - fitting_since)
    if left > 0:
        return Verdict(Step.READY, message, after=left)
    return Verdict(
        Step.RESERVE_AGAIN,
        f"provisioned (attempt {attempt}), but the nodes were taken before it was placed"
        f" (not placed within {fit_timeout:g}s); asking again",
    )


@dataclass(frozen=True, slots=True)
class PodSetTemplate:
    """One pod set of the request: a pod template and how many pods use it."""

    template: Mapping[str, Any]
    count: int


def template_of(pod_set: PodSet) -> PodSetTemplate:
    """The pod template a provisioner sizes nodes from: one container asking what one pod
    of the set asks (as fitted: declared requests, the admission's flavors), with its node
    selector and tolerations. Written from the fitted pod set rather than copied from the
    wrapped object, so every kind (custompodresources included) is provisioned for exactly
    what the dispatcher will fit afterwards."""
    requests = {k: v for k, v in pod_set.requests.to_kube().items() if k != "pods"}
    # Extended resources (GPUs...) cannot be overcommitted: the API server wants their
    # limits equal to their requests.
    limits = {k: v for k, v in requests.items() if k not in OVERCOMMITTED}
    resources: dict[str, Any] = {"requests": requests}
    if limits:
        resources["limits"] = limits
    spec: dict[str, Any] = {
        "containers": [{"name": "pod", "image": "provisioning", "resources": resources}]
    }
    if pod_set.node_selector:
        spec["nodeSelector"] = dict(pod_set.node_selector)
    if pod_set.tolerations:
        spec["tolerations"] = [
            {
                k: v
                for k, v in (
                    ("key", t.key),
                    ("operator", t.operator),
                    ("value", t.value),
                    ("effect", t.effect),
                )
                if v
            }
            for t in pod_set.tolerations
        ]
    return PodSetTemplate({"spec": spec}, pod_set.count)


def request_objects(
    *,
    namespace: str,
    owner: Mapping[str, Any],
    check: str,
    attempt: int,
    provisioning_class: str,
    parameters: Mapping[str, str],
    pod_sets: Sequence[PodSetTemplate],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The PodTemplates and the ProvisioningRequest of one attempt, owned by the AppWrapper
    (`owner`: its apiVersion, kind, name, uid)."""
    uid = str(owner["uid"])
    labels = {UID_LABEL: uid, CHECK_LABEL: check, ATTEMPT_LABEL: str(attempt)}
    reference = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["name"],
        "uid": uid,
        "blockOwnerDeletion": True,
        "controller": True,
    }
    templates = []
    sets = []
    for index, pod_set in enumerate(pod_sets):
        name = template_name(uid, check, attempt, index)
        templates.append(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": dict(labels),
                    "ownerReferences": [dict(reference)],
                },
                "template": dict(pod_set.template),
            }
        )
        sets.append({"podTemplateRef": {"name": name}, "count": pod_set.count})
    request: dict[str, Any] = {
        "apiVersion": PROVISIONING_API,
        "kind": "ProvisioningRequest",
        "metadata": {
            "name": request_name(uid, check, attempt),
            "namespace": namespace,
            "labels": dict(labels),
            "ownerReferences": [dict(reference)],
        },
        "spec": {"provisioningClassName": provisioning_class, "podSets": sets},
    }
    if parameters:
        request["spec"]["parameters"] = dict(parameters)
    return templates, request
