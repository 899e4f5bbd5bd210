"""The ProvisioningRequest admission check: what an AppWrapper held for it (`QuotaHeld`)
asks of the cluster autoscaler. Side effects: PodTemplates and ProvisioningRequests on the
hub, and status writes on the AppWrapper (its `AdmissionCheck.<name>` conditions).

The reconciler hands it every AppWrapper in phase *reserved*, and every queued one whose checks
passed (a booking can still expire before the scheduler fits it). What to do next is decided
by `core.admissionchecks.verdict`; this module reads and writes:

- the attempt in force is the highest attempt label among the AppWrapper's requests (listed by
  its uid); one that was made for an earlier reservation (its `reservation` annotation is not
  the current `QuotaHeld` transition) is over, and the next attempt is made. The names are
  fixed by uid, check and attempt, so a crash between create and record finds them again
  (AlreadyExists is success) and nothing is made twice;
- every object is owned by the AppWrapper (the garbage collector removes them with it);
- a check that is not configured, or names a class no provisioner serves here, is the
  operator's mistake: the AppWrapper is not failed, its condition says what is wrong;
- the PodTemplates are written from the pod sets as fitted, with the admission's flavors;
- `revoked` tells the reconciler that a dispatched AppWrapper's request says CapacityRevoked
  (it requeues it); a watch of the requests made (`requests`) wakes their AppWrapper on
  every change. A failed API call propagates: the work queue retries the key with backoff;
- the requests are read from that watch's cache (indexed by the AppWrapper's uid), not by a
  GET per reconcile; until it has synced, by a list. One just created and not in the cache
  yet is remembered (`_made`) so that the next reconcile does not make it again;
- a request counts for an AppWrapper only if it is in its namespace, has the name its uid,
  check and attempt fix, and a controller reference to its uid (`core.admissionchecks.
  foreign`): the labels are anyone's to write, so one a tenant made, in any namespace,
  with a victim's uid label is ignored (logged at debug), never followed; one squatting the
  name of the next attempt is named in the check's message;
- an AppWrapper whose checks all passed but which is not placed within
  `provisioning.fit_timeout_seconds` (other work took the nodes made for it) gives its
  booking up as for an expired one, and asks again; that is never a refusal, so it never
  fails the AppWrapper.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import structlog

from dispatcher.api.models import (
    AppWrapper,
    AppWrapperStatus,
    ConditionType,
    Reason,
    parse_time,
)
from dispatcher.clock import Clock
from dispatcher.config import ProvisioningConfig
from dispatcher.controller.quota.objects import NO_QUOTAS, QuotaLookup
from dispatcher.controller.reading import AppWrapperReader
from dispatcher.controller.status import Change, StatusWriter
from dispatcher.core import admissionchecks as checks
from dispatcher.core import checkstatus
from dispatcher.core import conditions as cond
from dispatcher.core.admissionchecks import Retry, Step, Verdict
from dispatcher.core.model import Workload
from dispatcher.core.phase import dispatched, finished
from dispatcher.core.quota.flavors import with_flavors
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import AlreadyExists, KubeError
from dispatcher.kube.informer import Informer

Obj = dict[str, Any]

REQUESTS = ResourceInfo(
    "autoscaling.x-k8s.io/v1", "ProvisioningRequest", "provisioningrequests", True
)
TEMPLATES = ResourceInfo("v1", "PodTemplate", "podtemplates", True)
RESERVATION_ANNOTATION = "workload.codeflare.dev/reservation"
"""On a request: the `QuotaHeld` transition time it was made for."""
MISCONFIGURED_RECHECK = 30.0


def _reservation(status: AppWrapperStatus) -> str:
    found = status.condition(ConditionType.QUOTA_HELD)
    return (found.lastTransitionMicroTime or "") if found is not None else ""


def _slim(obj: Obj) -> Obj:
    """What waking an owner and following a check need: its name, owner, labels (uid,
    check, attempt) and the reservation it was made for; and the conditions."""
    meta = obj.get("metadata") or {}
    return {
        "metadata": {
            k: meta[k]
            for k in (
                "name",
                "namespace",
                "resourceVersion",
                "ownerReferences",
                "labels",
                "annotations",
            )
            if k in meta
        },
        "status": {"conditions": (obj.get("status") or {}).get("conditions") or []},
    }


def _uid_of(obj: Obj) -> str:
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(checks.UID_LABEL) or "")


def _fitting_since(status: AppWrapperStatus, earliest: float) -> float | None:
    """When every check was Ready and the AppWrapper went back to the fit (the update of
    `QuotaHeld` to `AdmissionChecksReady`; it stays True, so only its update time moves),
    or `earliest` if later."""
    held = status.condition(ConditionType.QUOTA_HELD)
    if held is None or not checkstatus.checks_ready(status) or not held.lastUpdateMicroTime:
        return None
    try:
        return max(earliest, parse_time(held.lastUpdateMicroTime).timestamp())
    except ValueError:
        return None


def _failed_at(request: Mapping[str, Any]) -> float | None:
    for c in (request.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Failed" and c.get("status") == "True":
            try:
                return parse_time(str(c.get("lastTransitionTime") or "")).timestamp()
            except ValueError:
                return None
    return None


class Provisioning:
    def __init__(
        self,
        *,
        config: ProvisioningConfig,
        hub: KubeApi,
        status: StatusWriter,
        reader: AppWrapperReader,
        clock: Clock,
        wake: Callable[[str], None] = lambda key: None,
        quotas: QuotaLookup = NO_QUOTAS,
    ) -> None:
        self._config = config
        self._quotas = quotas
        self._wake = wake
        self.requests = Informer(
            hub, REQUESTS, label_selector=checks.UID_LABEL, transform=_slim, absent_ok=True
        )
        """The dispatcher's requests (by their label): wakes their owners, and is read."""
        self.requests.add_handler(self._on_request)
        self._by_uid: dict[str, set[str]] = {}
        """AppWrapper uid -> the keys of its requests in `requests.store`."""
        self._made: dict[str, dict[str, Obj]] = {}
        """AppWrapper uid -> requests created here and not seen in the cache yet, by name."""
        self._hub = hub
        self._status = status
        self._reader = reader
        self._clock = clock
        self._started = clock.time()
        """The fit timeout counts from here at the earliest: time this dispatcher was not
        running (a restart, a new leader) gave the gang no chance to be placed."""
        self._log = structlog.get_logger("provisioning")

    def _foreign(self, obj: Obj, namespace: str, uid: str) -> str:
        """Why `obj` is no request of the AppWrapper `uid` of `namespace` ("" = it is one);
        logged at debug, as anyone may make such objects."""
        why = checks.foreign(obj, namespace=namespace, uid=uid)
        if why:
            meta = obj.get("metadata") or {}
            self._log.debug(
                "provisioning_request_ignored",
                request=f"{meta.get('namespace')}/{meta.get('name')}",
                appwrapper_uid=uid,
                reason=why,
            )
        return why

    def _unindex(self, uid: str, key: str) -> None:
        keys = self._by_uid.get(uid, set())
        keys.discard(key)
        if not keys:
            self._by_uid.pop(uid, None)

    def _on_request(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        obj = new if new is not None else old
        if obj is None:
            return
        meta = obj.get("metadata") or {}
        uid = _uid_of(obj)
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if old is not None and _uid_of(old) != uid:
            self._unindex(_uid_of(old), key)  # relabelled
        if self._foreign(obj, str(meta.get("namespace")), uid):
            self._unindex(uid, key)
            return  # not the dispatcher's: it wakes and settles nothing
        if new is None:
            self._unindex(uid, key)
        else:
            self._by_uid.setdefault(uid, set()).add(key)
        made = self._made.get(uid)
        if made is not None:
            made.pop(str(meta.get("name")), None)  # same name and owner uid: same namespace
            if not made:
                del self._made[uid]
        for owner in meta.get("ownerReferences") or []:
            if owner.get("kind") == "AppWrapper":
                self._wake(f"{meta.get('namespace')}/{owner.get('name')}")

    async def _requests_of(self, namespace: str, uid: str) -> list[Obj]:
        """The AppWrapper's requests: from the watch's cache once it has synced (with those
        made here that it has not shown yet), else by a list. Only its own count."""
        if not self.requests.synced.is_set():
            listed = await self._hub.list(
                REQUESTS, namespace, query={"labelSelector": f"{checks.UID_LABEL}={uid}"}
            )
            items = listed.get("items") or []
            return [r for r in items if not self._foreign(r, namespace, uid)]
        store = self.requests.store
        found = [
            store[k]
            for k in self._by_uid.get(uid, ())
            if k in store and not self._foreign(store[k], namespace, uid)
        ]
        made = self._made.get(uid)
        if made:
            known = {r["metadata"]["name"] for r in found}
            for name in known & made.keys():  # its watch event came before its create returned
                del made[name]
            found += made.values()
            if not made:
                del self._made[uid]
        return found

    async def follow(self, aw: AppWrapper, obj: Obj) -> float | None:
        """Carry each check of `aw` one step; seconds until it should be looked at again."""
        status = aw.status or AppWrapperStatus()
        names = [
            c.type.removeprefix(checkstatus.check_condition(""))
            for c in status.conditions
            if c.type.startswith(checkstatus.check_condition(""))
        ]
        reserved = status.is_true(ConditionType.QUOTA_HELD) and not checkstatus.checks_ready(status)
        if not names:
            return None
        requests = await self._requests_of(aw.metadata.namespace or "", aw.metadata.uid or "")
        again: float | None = None
        for name in names:
            step = await self._check(aw, name, requests, reserved=reserved)
            if step is not None:
                again = step if again is None else min(again, step)
        return again

    async def revoked(self, aw: AppWrapper) -> str:
        """Why the capacity a dispatched `aw` was provisioned on is gone ("" if it is not):
        its current request says CapacityRevoked."""
        status = aw.status or AppWrapperStatus()
        names = [
            c.type.removeprefix(checkstatus.check_condition(""))
            for c in status.conditions
            if c.type.startswith(checkstatus.check_condition("")) and c.status == "True"
        ]
        if not names:
            return ""
        uid = aw.metadata.uid or ""
        requests = await self._requests_of(aw.metadata.namespace or "", uid)
        for name in names:
            current = self._current(requests, uid, name, _reservation(status))
            if current is None:
                continue
            verdict = checks.verdict(
                current,
                attempt=checks.latest_round(requests, name),
                retry=Retry(),
                now=self._clock.time(),
                failed_at=None,
                dispatched=True,
            )
            if verdict.step is Step.REVOKED:
                return f"admission check {name}: {verdict.message}"
        return ""

    @staticmethod
    def _current(requests: list[Obj], uid: str, name: str, reservation: str) -> Obj | None:
        """The request of `name` made for this reservation (None: none yet)."""
        wanted = checks.request_name(uid, name, checks.latest_round(requests, name))
        for request in requests:
            meta = request["metadata"]
            if meta["name"] == wanted:
                made_for = (meta.get("annotations") or {}).get(RESERVATION_ANNOTATION)
                return request if made_for == reservation else None
        return None

    async def _check(
        self, aw: AppWrapper, name: str, requests: list[Obj], *, reserved: bool
    ) -> float | None:
        status = aw.status or AppWrapperStatus()
        setting = self._config.checks.get(name)
        problem = ""
        if not self._config.enabled:
            problem = "admission checks are off (provisioning.enabled is false)"
        elif setting is None:
            problem = f"no check named {name} in provisioning.checks"
        elif setting.provisioning_class not in self._config.known_classes:
            problem = (
                f"provisioning class {setting.provisioning_class} is unknown (known:"
                f" {', '.join(self._config.known_classes)}): no provisioner would answer it"
            )
        if problem:
            if reserved:
                await self._mark(aw, name, Reason.CHECK_MISCONFIGURED, problem)
            return MISCONFIGURED_RECHECK
        assert setting is not None
        retry = Retry(
            setting.retry_limit, setting.backoff_base_seconds, setting.backoff_max_seconds
        )
        attempt = checks.latest_round(requests, name)
        reservation = _reservation(status)
        current = self._current(requests, aw.metadata.uid or "", name, reservation)
        if current is None:
            if not reserved:
                return None  # ready, then given back: a later reservation makes the next one
            said = await self._create(
                aw, name, attempt + 1, setting.provisioning_class, setting.parameters, reservation
            )
            await self._mark(aw, name, Reason.CHECK_PENDING, said)
            return self._config.poll_seconds
        verdict = checks.verdict(
            current,
            attempt=attempt,
            retry=retry,
            now=self._clock.time(),
            failed_at=_failed_at(current),
            dispatched=False,
            refused=checks.refusals(requests, name),
            fitting_since=_fitting_since(status, self._started),
            fit_timeout=self._config.fit_timeout_seconds,
        )
        return await self._act(
            aw,
            name,
            verdict,
            attempt,
            setting.provisioning_class,
            setting.parameters,
            reservation,
            reserved=reserved,
        )

    async def _act(
        self,
        aw: AppWrapper,
        name: str,
        verdict: Verdict,
        attempt: int,
        klass: str,
        parameters: Mapping[str, str],
        reservation: str,
        *,
        reserved: bool,
    ) -> float | None:
        poll = self._config.poll_seconds
        if verdict.step is Step.WAIT:
            if reserved:
                await self._mark(aw, name, Reason.CHECK_PENDING, verdict.message)
            return poll
        if verdict.step is Step.READY:
            if reserved:
                await self._mark(aw, name, Reason.CHECK_READY, verdict.message)
            # Followed until dispatch: the booking may still expire, or the fit time out.
            return min(poll, verdict.after) if verdict.after > 0 else poll
        if verdict.step is Step.RETRY:
            if verdict.after > 0:
                await self._mark(aw, name, Reason.CHECK_RETRY, verdict.message)
                return min(verdict.after, 60.0)
            said = await self._create(aw, name, attempt + 1, klass, parameters, reservation)
            await self._mark(aw, name, Reason.CHECK_PENDING, said)
            return poll
        if verdict.step is Step.FAIL:
            await self._write(
                aw,
                lambda status, now: cond.mark_failed(
                    status,
                    Reason.PROVISIONING_FAILED,
                    f"admission check {name}: {verdict.message}",
                    now=now,
                ),
            )
            return None
        # RESERVE_AGAIN (and REVOKED, which is not asked before dispatch): quota given back.
        # The write is refused if the AppWrapper was dispatched meanwhile (`_write`).
        self._log.info(
            "admission_check_reserve_again",
            appwrapper=f"{aw.metadata.namespace}/{aw.metadata.name}",
            check=name,
            attempt=attempt,
            reason=verdict.message,
        )
        await self._write(
            aw,
            lambda status, now: checkstatus.retry_checks(
                status, f"admission check {name}: {verdict.message}", now=now
            ),
        )
        return None

    async def _create(
        self,
        aw: AppWrapper,
        name: str,
        attempt: int,
        klass: str,
        parameters: Mapping[str, str],
        reservation: str,
    ) -> str:
        """Make attempt `attempt`'s templates and request; what its check should say."""
        namespace = aw.metadata.namespace or ""
        said = f"attempt {attempt} created, waiting for the provisioner"
        moment = datetime.fromtimestamp(self._clock.time(), UTC)
        workload = self._reader.workload(aw, priority=0, now=moment)
        if not isinstance(workload, Workload):
            return said  # its spec is the reconciler's to report
        admission = aw.status.admission if aw.status is not None else None
        if admission is not None:
            # The nodes asked for must be those its flavors' node labels and taints select.
            assert aw.status is not None
            found = {flavor.name: flavor for flavor, _ in self._quotas.flavors_of(aw.status)}
            chosen = tuple((f.name, tuple(f.resources)) for f in admission.flavors)
            workload = with_flavors(workload, chosen, found)
        owner = {
            "apiVersion": aw.apiVersion,
            "kind": aw.kind,
            "name": aw.metadata.name,
            "uid": aw.metadata.uid,
        }
        templates, request = checks.request_objects(
            namespace=namespace,
            owner=owner,
            check=name,
            attempt=attempt,
            provisioning_class=klass,
            parameters=parameters,
            pod_sets=[checks.template_of(p) for p in workload.pod_sets],
        )
        request["metadata"]["annotations"] = {RESERVATION_ANNOTATION: reservation}
        # Templates first: a request whose templates are missing would be refused.
        for template in templates:
            with contextlib.suppress(AlreadyExists):
                await self._hub.create(TEMPLATES, namespace, template)
        try:
            made = await self._hub.create(REQUESTS, namespace, request)
            self._made.setdefault(str(aw.metadata.uid), {})[request["metadata"]["name"]] = _slim(
                made or request
            )
            self._log.info(
                "provisioning_request_created",
                appwrapper=f"{namespace}/{aw.metadata.name}",
                check=name,
                attempt=attempt,
                request=request["metadata"]["name"],
            )
        except AlreadyExists:
            return await self._taken(aw, request["metadata"]["name"]) or said
        return said

    async def _taken(self, aw: AppWrapper, name: str) -> str:
        """Why the request `name` that exists is not the AppWrapper's ("" = it is: made
        before a crash, or its create's answer was lost). Another's of that name (made by
        someone who may create requests in this namespace) holds the attempt back: said,
        never followed; the AppWrapper waits until it is gone."""
        namespace = aw.metadata.namespace or ""
        uid = aw.metadata.uid or ""
        try:
            found = await self._hub.get(REQUESTS, namespace, name)
        except KubeError:
            return ""  # gone again, or unreadable: the next look decides
        why = self._foreign(found, namespace, uid)
        if not why:
            return ""
        self._log.warning(
            "provisioning_request_name_taken",
            appwrapper=f"{namespace}/{aw.metadata.name}",
            request=name,
            reason=why,
        )
        return (
            f"ProvisioningRequest {name} exists but was not made by the dispatcher for this"
            f" AppWrapper ({why}): delete it to let the check go on"
        )

    async def _mark(self, aw: AppWrapper, name: str, reason: Reason, message: str) -> None:
        await self._write(
            aw, lambda status, now: checkstatus.mark_check(status, name, reason, message, now=now)
        )

    async def _write(self, aw: AppWrapper, change: Any) -> None:
        key = f"{aw.metadata.namespace}/{aw.metadata.name}"
        uid = aw.metadata.uid

        def mutate(obj: Obj) -> Change | None:
            if obj["metadata"].get("uid") != uid:
                return None
            current = self._reader.parse(obj)
            status = (current.status or AppWrapperStatus()).editable_copy()
            if dispatched(status) or finished(status):
                return None
            before = status.model_dump()
            now = datetime.fromtimestamp(self._clock.time(), UTC)
            transition = change(status, now)
            if status.model_dump() == before:
                return None
            return Change(status, [transition])

        try:
            await self._status.update(key, mutate)
        except KubeError as exc:
            self._log.warning("provisioning_status_failed", appwrapper=key, error=str(exc)[:300])
