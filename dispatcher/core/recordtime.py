"""Whether a verified creator record may be honoured: it is worth something only if the API
server asked for it, and that is known only if the dispatcher's MutatingWebhookConfiguration
was in place from before the spec it signs was stored until after. Pure, no I/O, no clock.

Why: where the API server presents no client certificate to the webhook (managed clusters),
whoever reaches the webhook port while it is registered can have a record signed for any
user by posting an AdmissionReview of their own. The record verifies; stored on an
AppWrapper while the configurations are away (an outage, a reinstall), no webhook call
overwrites it. While the configuration is in place, every create and every change of the
spec is sent to the webhook, which writes the requester's own record over whatever the
object carried; so a record is honoured only when the configuration provably existed over
the whole time its spec could have been stored:

- from `lower_bound`: the AppWrapper's creationTimestamp (set by the API server, whole
  seconds); for a later generation, also the time the record says it was signed, less
  `SKEW_SECONDS` (storing comes after signing; the signing replica's clock may run ahead);
- to a read of the configuration that the dispatcher issued after it received this version
  of the AppWrapper (causality, no clock: the read was answered after the version was
  stored).

An object keeps its uid and creationTimestamp from creation to deletion, so one read that
finds the configuration created before the lower bound proves it existed over the whole
span. A configuration deleted and made again has a new creationTimestamp: records signed
before it are then no longer proved by it (the proof made while the old one was in place
is kept by the dispatcher while it runs: `Read`s are remembered).

For generation 1 the record's time must also be within `WEBHOOK_TO_STORE_SECONDS` before the
creationTimestamp (and at most `SKEW_SECONDS` after it): a record obtained earlier is of no
use even where the assumptions below fail.

Assumptions (docs/security.md, "Who may call the webhook"): the webhook is taken away by
deleting its configuration (an edit that points it elsewhere, or narrows what it is sent,
is seen only at the next read); the clocks of the API servers and of the dispatcher's
replicas agree within `SKEW_SECONDS`; the API server takes up a new configuration within the
second it is created.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

SKEW_SECONDS = 5.0
"""Tolerated difference between the clocks of the API servers and the dispatcher's replicas
(the signing time is the replica's; creationTimestamps are the API server's)."""
WEBHOOK_TO_STORE_SECONDS = 60.0
"""The longest a create may take from the webhook's signature to its storage: the webhooks
after ours (at most 30 s each by Kubernetes' limit; ours 10 s) and the write itself."""
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
"""Set by the API server on every namespace: the only namespaceSelector the proof evaluates
without reading namespaces."""


@dataclass(frozen=True, slots=True)
class Read:
    """One read of the MutatingWebhookConfiguration, issued at `issued`: a tick of the
    dispatcher's own counter, compared only with the ticks AppWrappers were received at
    (causality, no clock)."""

    issued: int
    uid: str = ""
    """"": it did not exist."""
    created: float | None = None
    """Its creationTimestamp, seconds since the epoch."""
    configuration: Mapping[str, Any] | None = None


def timestamp(value: Any) -> float | None:
    """An RFC 3339 time as the API server writes it, in seconds (None: unreadable)."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def covers(configuration: Mapping[str, Any], namespace: str) -> bool:
    """Whether one of the configuration's webhooks is sent every create and update of an
    AppWrapper of `namespace`, with no way around it: failurePolicy Fail, no objectSelector
    (object labels are the tenant's), no matchConditions, every served version (matchPolicy
    Equivalent, or both named), and no namespaceSelector other than the namespace's own
    name."""
    for webhook in configuration.get("webhooks") or []:
        if not isinstance(webhook, Mapping):
            continue
        if (webhook.get("failurePolicy") or "Fail") != "Fail":
            continue
        if webhook.get("objectSelector") not in (None, {}) or webhook.get("matchConditions"):
            continue
        if webhook.get("matchPolicy") == "Exact" and not _every_version(webhook.get("rules")):
            continue
        if _selects(webhook.get("namespaceSelector"), namespace) and _sends_appwrappers(
            webhook.get("rules")
        ):
            return True
    return False


def _every_version(rules: Any) -> bool:
    """Whether the rules name every version AppWrappers are served in (with matchPolicy
    Exact, a request made in a version not named is not sent at all)."""
    for rule in rules or []:
        versions = set(rule.get("apiVersions") or []) if isinstance(rule, Mapping) else set()
        if "*" in versions or {"v1beta1", "v1beta2"} <= versions:
            return True
    return False


def _selects(selector: Any, namespace: str) -> bool:
    if selector in (None, {}):
        return True
    if not isinstance(selector, Mapping) or selector.get("matchExpressions"):
        return False
    return selector.get("matchLabels") == {NAMESPACE_LABEL: namespace}


def _sends_appwrappers(rules: Any) -> bool:
    needed = {"CREATE", "UPDATE"}
    for rule in rules or []:
        if not isinstance(rule, Mapping):
            continue
        groups = rule.get("apiGroups") or []
        resources = rule.get("resources") or []
        operations = set(rule.get("operations") or [])
        if (
            ("*" in groups or "workload.codeflare.dev" in groups)
            and ("*" in resources or "appwrappers" in resources)
            and ("*" in operations or needed <= operations)
        ):
            return True
    return False


def lower_bound(meta: Mapping[str, Any], signed_at: int | None) -> float | None:
    """The earliest the AppWrapper's current spec can have been stored (None: no
    creationTimestamp to go by)."""
    created = timestamp(meta.get("creationTimestamp"))
    if created is None:
        return None
    generation = meta.get("generation")
    if signed_at is None or not isinstance(generation, int) or generation <= 1:
        return created
    return max(created, signed_at - SKEW_SECONDS)


def record_time_problem(
    *,
    meta: Mapping[str, Any],
    signed_at: int | None,
    received: int,
    reads: Iterable[Read],
    name: str,
) -> str | None:
    """Why a verified record on an AppWrapper with this metadata may not be honoured; "" when
    it may; None when no read of the configuration issued after the AppWrapper was
    `received` is known yet (read it, then ask again). `name` is the configuration's."""
    generation = meta.get("generation")
    first = not isinstance(generation, int) or generation <= 1
    created = timestamp(meta.get("creationTimestamp"))
    if (
        first
        and signed_at is not None
        and created is not None
        and not created - WEBHOOK_TO_STORE_SECONDS <= signed_at <= created + 1 + SKEW_SECONDS
    ):
        return _refused(
            f"it was signed at {_iso(signed_at)}, not when the AppWrapper was created "
            f"({_iso(created)}): a record is honoured only on the spec it was signed for, "
            "stored at once"
        )
    lower = lower_bound(meta, signed_at)
    after = [read for read in reads if read.issued > received]
    if not after:
        return None
    namespace = str(meta.get("namespace") or "")
    for read in after:
        if read.created is None or read.configuration is None or lower is None:
            continue
        # Whole seconds: created in an earlier second than the lower bound's.
        if math.floor(read.created) + 1 <= lower and covers(read.configuration, namespace):
            return ""
    latest = max(after, key=lambda read: read.issued)
    if not latest.uid:
        why = f"its MutatingWebhookConfiguration {name} does not exist now"
    elif latest.configuration is not None and not covers(latest.configuration, namespace):
        why = (
            f"its MutatingWebhookConfiguration {name} does not send every AppWrapper of "
            f"namespace {namespace} to it (failurePolicy Fail, no objectSelector, no "
            "namespaceSelector but the namespace's name)"
        )
    else:
        when = _iso(latest.created) if latest.created is not None else "?"
        why = (
            f"its MutatingWebhookConfiguration {name} was created at {when}, after "
            f"{_iso(lower) if lower is not None else 'the AppWrapper was created'}"
        )
    return _refused(why)


def _refused(why: str) -> str:
    return (
        "its record of who created it is signed by the dispatcher's admission webhook, but "
        f"not known to have been written by it when this spec was stored: {why}; apply it "
        "again while the webhook is in place"
    )


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
