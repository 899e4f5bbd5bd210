"""Making one dispatch attempt's wrapped objects exist in its member cluster: the creator's
rights asked again, the objects built (with the admission's flavors, and node-health
anti-affinities in the pod templates that ask for a covered resource), their namespace
prepared, all created or none (adopted after a restart); and removing them again.

Side effects: API requests to the member (creates and deletes), access reviews through the
webhook's rules. It writes no status: it says what came of the attempt, or raises the error
that did (`TerminalError` when the creator may not create them, cluster/objects.py's
`DispatchError` when creating failed), and the reconciler writes that as the one error
policy says (controller/errors.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from dispatcher.api.models import AppWrapper, AppWrapperStatus, Reason, parse_time
from dispatcher.clock import Clock
from dispatcher.cluster.member import Member
from dispatcher.cluster.objects import (
    DispatchError,
    Wrapped,
    create_all,
    delete_all,
    dispatched_objects,
    prepare_namespace,
    wrapped_objects,
)
from dispatcher.controller.access.gatekeeper import Gatekeeper
from dispatcher.controller.errors import TerminalError
from dispatcher.controller.quota.objects import QuotaLookup
from dispatcher.core.declared import item_pod_templates
from dispatcher.core.nodehealth import OFF, NodeHealth, inject_anti_affinities
from dispatcher.kube.errors import KubeError

Obj = dict[str, Any]
TERMINATING_RETRY = 0.5
"""Seconds before trying again to create objects whose earlier copies are being deleted."""
TERMINATING_LIMIT = 300.0
"""Seconds after dispatch that a dispatch waits for earlier copies to go before it requeues."""
TERMINATING_POLL_SECONDS = 1.0
"""How often a dispatch waiting for an earlier attempt's pods to go looks again (their
deletion also wakes it)."""


@dataclass(frozen=True, slots=True)
class Made:
    """The attempt's objects exist (created now or earlier)."""

    objects: list[Wrapped]


@dataclass(frozen=True, slots=True)
class NotYet:
    """An earlier attempt's pods or objects are still going: try again in `seconds`."""

    seconds: float


class Maker:
    """`ensure(...)`: Made or NotYet; `TerminalError` (Forbidden) when the recorded creator
    may not create them (any more); DispatchError when creating failed (UserInputError
    when the user's objects are refused); any other exception is a bug of the dispatcher's
    own, raised as it is."""

    def __init__(
        self,
        *,
        gatekeeper: Gatekeeper | None,
        quotas: QuotaLookup,
        clock: Clock,
        node_health: NodeHealth = OFF,
    ) -> None:
        self._gatekeeper = gatekeeper
        self._quotas = quotas
        self._clock = clock
        self._node_health = node_health
        self._log = structlog.get_logger("maker")

    async def ensure(
        self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus, member: Member
    ) -> Made | NotYet:
        if any(p.deleting for p in member.capacity.owned_pods(aw.key, aw.metadata.uid or "")):
            # An earlier attempt's pods are still terminating: objects made now would
            # make a second gang, bound wherever kube-scheduler finds room (room the
            # dispatcher has given to others) while the first still holds its own.
            return NotYet(TERMINATING_POLL_SECONDS)
        try:
            # The recorded creator's rights, asked again now: they may have been taken
            # away while it queued, or it may have been created past the webhook.
            refused = (
                await self._gatekeeper.dispatch_problem(obj, member.client)
                if self._gatekeeper is not None
                else ""
            )
        except KubeError as exc:
            raise DispatchError(f"checking the creator's rights: {exc}") from exc
        if refused:
            raise TerminalError(Reason.FORBIDDEN, refused)
        # Built only when needed: it deep-copies every template, and following runs on
        # every pod change of every dispatched AppWrapper.
        try:
            objects = wrapped_objects(
                aw, owner_reference=member.is_hub, flavors=self._quotas.flavors_of(status)
            )
            keep_off_unhealthy_nodes(aw, objects, self._node_health)
            namespace = await prepare_namespace(member, aw.metadata.namespace)
            made = await create_all(member.client, namespace, objects, uid=aw.metadata.uid or "")
        except KubeError as exc:
            raise DispatchError(str(exc)) from exc
        if made.terminating:
            return self._old_objects_linger(aw, status, made.terminating)
        return Made(objects)

    async def remove(self, aw: AppWrapper, member: Member) -> list[str]:
        """Delete `aw`'s wrapped objects in `member`: those its latest dispatch recorded (the
        spec may have been edited since), only if they carry its uid; returns the ones still
        there."""
        namespace = member.namespace_for(aw.metadata.namespace)
        if namespace is None:
            return []  # not mapped there (any more): no namespace to look in
        return await delete_all(
            member.client,
            namespace,
            dispatched_objects(aw, owner_reference=member.is_hub),
            uid=aw.metadata.uid or "",
            deleting=member.deleting,
        )

    async def remove_everywhere(self, aw: AppWrapper, members: list[Member]) -> list[str]:
        """`remove` from each of `members`; what is still there, or which could not be
        asked (logged)."""
        remaining: list[str] = []
        for member in members:
            try:
                remaining += await self.remove(aw, member)
            except KubeError as exc:
                self._log.warning(
                    "deleting_objects_failed",
                    appwrapper=aw.metadata.name,
                    namespace=aw.metadata.namespace,
                    cluster=member.name,
                    error=str(exc)[:300],
                )
                remaining.append(f"{member.name}: {exc}")
        return remaining

    def _old_objects_linger(
        self, aw: AppWrapper, status: AppWrapperStatus, terminating: tuple[str, ...]
    ) -> NotYet:
        """An earlier attempt's objects are still going (a requeue deleted them): adopting
        them would leave this attempt with objects about to vanish. Wait, within limits."""
        dispatched = _stamp(status.lastDispatchedAt)
        if dispatched is not None and self._clock.time() - dispatched > TERMINATING_LIMIT:
            # Held by a finalizer nobody removes: give the room back and retry later.
            raise DispatchError(
                f"{', '.join(terminating[:5])} still being deleted after {int(TERMINATING_LIMIT)}s"
            )
        self._log.info(
            "waiting_for_old_objects",
            appwrapper=aw.metadata.name,
            namespace=aw.metadata.namespace,
            objects=list(terminating[:5]),
        )
        return NotYet(TERMINATING_RETRY)


def _stamp(text: str | None) -> float | None:
    if not text:
        return None
    try:
        moment: datetime = parse_time(text)
    except ValueError:
        return None
    return moment.timestamp()


def keep_off_unhealthy_nodes(aw: AppWrapper, objects: list[Wrapped], rules: NodeHealth) -> None:
    """In place: each pod template of `objects` (the declared ones, else those known for the
    kind) that asks for a resource the health labels cover gets the anti-affinities
    (`core.nodehealth.inject_anti_affinities`); every attempt's objects get them, so a reset
    keeps its new pods off the node that evicted the old ones."""
    if not rules.inject_anti_affinities:
        return
    for wrapped in objects:
        item = aw.spec.items[wrapped.index]
        # The declared paths were resolved already, building the object.
        for template in item_pod_templates(wrapped.body, item, where=f"item {wrapped.index}"):
            if isinstance(template, dict):
                inject_anti_affinities(template, rules)
