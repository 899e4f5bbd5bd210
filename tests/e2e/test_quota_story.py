"""The Kueue + KubeRay priority story with samples/queues/, on the real control plane with
the KubeRay operator: dev RayClusters share a queue one at a time, a prod one preempts the
running dev one, and the dev ones resume one at a time once prod is gone.

Quota, not capacity, is the limit: the node holds all of them at once, the queue one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import pytest
import yaml

from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import (
    QUIET_SECONDS,
    REPO,
    StartDispatcher,
    apply,
    conditions,
    get_aw,
    pods_of,
    wait_condition,
)
from tests.e2e.test_quotas import get_table, wait_message

pytestmark = [pytest.mark.cluster]

SAMPLES = REPO / "samples" / "queues"
SETUP = SAMPLES / "setup.yaml"
QUEUE = "cluster-queue"
LOCAL_QUEUE = "user-queue"
DEVS = ("dev-1", "dev-2", "dev-3")
PROD = "prod-1"
RAY_TIMEOUT = 120  # seconds for a RayCluster's pods to be made and run
FULL = f"queue {QUEUE}: needs cpu 2; nominal 2, in use 2, cohort can lend 0"
"""The head of the queue's message: live, with what the queue uses and the cohort lends."""
OWN = f"queue {QUEUE}: needs cpu 2; nominal 2"
"""What every waiting one's message starts with: the queue, its ask, the queue's nominal
quota (behind the head, what moves with others' work is left to the pending list)."""


def ray_job(sample: str, name: str) -> dict[str, Any]:
    """The AppWrapper of samples/queues/`sample`, it and its RayCluster named `name`."""
    aw = dict(yaml.safe_load((SAMPLES / sample).read_text()))
    aw["metadata"]["name"] = name
    (item,) = aw["spec"]["resources"]["GenericItems"]
    item["generictemplate"]["metadata"]["name"] = name
    return aw


@pytest.fixture
def priority_classes(cluster: Any) -> Iterator[list[str]]:
    """The PriorityClasses setup.yaml makes (cluster-scoped), deleted after the test."""
    docs = yaml.safe_load_all(SETUP.read_text())
    names = [d["metadata"]["name"] for d in docs if d and d["kind"] == "PriorityClass"]
    yield names
    cluster.kubectl("delete", "priorityclass", *names, "--ignore-not-found", check=False)


class QueueHolders:
    """The namespace's AppWrappers followed through a watch, every change in the API
    server's order: which are Dispatched after each change (`most` is the most at once,
    `timeline` who became Dispatched, in order) and which ever were Running (`ran`).

    Samples miss what happens between them; the watch misses nothing from the moment it
    is established (`__aenter__` returns then)."""

    _FIELDS = (
        '{.type}|{.object.metadata.name}|{.object.status.conditions[?(@.type=="Dispatched")]'
        '.status}|{.object.status.conditions[?(@.type=="Running")].status}{"\\n"}'
    )

    def __init__(self, cluster: Any, namespace: str) -> None:
        self._argv = [
            str(cluster.kubectl_path),
            "--kubeconfig",
            str(cluster.kubeconfig),
            "get",
            "appwrappers",
            "-n",
            namespace,
            "--watch",
            "--output-watch-events",
            "-v=6",  # logs the watch request's response: the watch is established
            "-o",
            f"jsonpath={self._FIELDS}",
        ]
        self.dispatched: set[str] = set()
        self.most = 0
        self.timeline: list[str] = []
        self.ran: set[str] = set()
        self.errors: list[str] = []
        self._log: list[str] = []
        self._stopping = False
        self._proc: asyncio.subprocess.Process | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> QueueHolders:
        self._proc = await asyncio.create_subprocess_exec(
            *self._argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert self._proc.stdout is not None
        assert self._proc.stderr is not None
        watching = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self._read_events(self._proc.stdout)),
            asyncio.create_task(self._read_log(self._proc.stderr, watching)),
        ]
        try:
            await asyncio.wait_for(watching.wait(), 30)
        except TimeoutError:
            await self._stop()
            raise AssertionError(f"no watch: {''.join(self._log)[-2000:]}") from None
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._stop()

    async def _stop(self) -> None:
        assert self._proc is not None
        self._stopping = True
        if self._proc.returncode is None:
            self._proc.terminate()
        await self._proc.wait()
        await asyncio.gather(*self._tasks)

    async def _read_log(self, stream: asyncio.StreamReader, watching: asyncio.Event) -> None:
        async for raw in stream:
            line = raw.decode(errors="replace")
            self._log.append(line)
            if "watch=true" in line and "200 OK" in line:
                watching.set()

    async def _read_events(self, stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            kind, name, dispatched, running = [*raw.decode().rstrip("\n").split("|"), "", ""][:4]
            if kind not in ("ADDED", "MODIFIED", "DELETED"):
                self.errors.append(raw.decode())
                continue
            if kind != "DELETED" and dispatched == "True":
                if name not in self.dispatched:
                    self.timeline.append(name)
                self.dispatched.add(name)
            else:
                self.dispatched.discard(name)
            if running == "True":
                self.ran.add(name)
            self.most = max(self.most, len(self.dispatched))
        if not self._stopping:
            self.errors.append(f"the watch stopped early: {''.join(self._log)[-2000:]}")


async def dispatched_one_of(cluster: Any, namespace: str, names: list[str]) -> str | None:
    """The one of `names` that is Dispatched, None if none is; two at once fail."""
    found = [
        n for n in names if (await conditions(cluster, namespace, n)).get("Dispatched") == "True"
    ]
    assert len(found) <= 1, f"{found} dispatched at once in a queue with room for one"
    return found[0] if found else None


async def waits_for(cluster: Any, namespace: str, name: str) -> tuple[str, str]:
    """The reason and message of `name`'s Dispatched condition (False while it waits)."""
    status = (await get_aw(cluster, namespace, name)).get("status") or {}
    (dispatched,) = [c for c in status.get("conditions", []) if c["type"] == "Dispatched"]
    assert dispatched["status"] == "False", dispatched
    return dispatched["reason"], dispatched["message"]


async def holds_alone(cluster: Any, namespace: str, holder: str, waiting: list[str]) -> bool:
    """`holder` is Dispatched; every one of `waiting` is not and has no pods."""
    assert (await conditions(cluster, namespace, holder)).get("Dispatched") == "True", holder
    for name in waiting:
        assert (await conditions(cluster, namespace, name)).get("Dispatched") != "True", name
        assert await pods_of(cluster, namespace, name) == [], name
    return True


async def wait_counts(cluster: Any, namespace: str, pending: int, admitted: int) -> None:
    """Until `kubectl get clusterappqueue` and `kubectl get appqueues` show these counts."""
    want = (str(pending), str(admitted))

    async def shown() -> bool:
        (row,) = await get_table(cluster, "clusterappqueue", QUEUE)
        (local,) = await get_table(cluster, "appqueues", "-n", namespace)
        return (row["PENDING"], row["ADMITTED"]) == want and (
            local["PENDING"],
            local["ADMITTED"],
        ) == want

    await async_wait_until(
        shown, timeout=30, what=f"queues show pending {pending}, admitted {admitted}"
    )
    (row,) = await get_table(cluster, "clusterappqueue", QUEUE)
    assert (row["NAME"], row["COHORT"], row["ACTIVE"]) == (QUEUE, "", "True")
    (local,) = await get_table(cluster, "appqueues", "-n", namespace)
    assert (local["NAME"], local["CLUSTERQUEUE"], local["ACTIVE"]) == (LOCAL_QUEUE, QUEUE, "True")


async def usage(cluster: Any) -> dict[str, str]:
    """The queue's status.flavorsUsage of default-flavor: resource -> total in use."""
    out = await cluster.akubectl("get", "caq", QUEUE, "-o", "jsonpath={.status.flavorsUsage}")
    (flavor,) = json.loads(out.stdout)
    assert flavor["name"] == "default-flavor"
    return {r["name"]: r["total"] for r in flavor["resources"]}


async def rayclusters(cluster: Any, namespace: str) -> list[str]:
    out = await cluster.akubectl(
        "get", "rayclusters", "-n", namespace, "-o", "jsonpath={.items[*].metadata.name}"
    )
    return str(out.stdout).split()


async def no_pods(cluster: Any, namespace: str, name: str) -> bool:
    return await pods_of(cluster, namespace, name) == []


async def delete_aw(cluster: Any, namespace: str, name: str) -> None:
    await cluster.akubectl("delete", "appwrapper", name, "-n", namespace, "--timeout=60s")


@pytest.mark.kuberay
async def test_prod_preempts_dev_in_a_full_queue_and_the_dev_ones_resume_one_at_a_time(
    cluster: Any,
    namespace: str,
    fake_nodes: Any,
    quotas: None,
    priority_classes: list[str],
    run_dispatcher: StartDispatcher,
) -> None:
    fake_nodes.add("big", cpu="16", memory="64Gi", gpu=4)
    await cluster.akubectl("label", "namespace", namespace, "team=ml")  # the sample's selector
    await cluster.akubectl("apply", "-n", namespace, "-f", str(SETUP))
    assert priority_classes == ["prod-priority", "dev-priority"]
    async with QueueHolders(cluster, namespace) as holders:
        await run_dispatcher()  # preemption on: the default
        await cluster.akubectl(
            "wait", "--for=condition=Active", f"clusterappqueue/{QUEUE}", "--timeout=30s"
        )

        # Three dev RayClusters, quota for one: one runs, two wait naming the queue.
        for name in DEVS:
            await apply(cluster, namespace, ray_job("dev-job.yaml", name))
        first = await async_wait_until(
            lambda: dispatched_one_of(cluster, namespace, list(DEVS)),
            timeout=60,
            what="a dev RayCluster dispatched",
        )
        assert first == DEVS[0]  # the oldest: queue order is priority, then age
        waiting = [n for n in DEVS if n != first]
        await wait_condition(cluster, namespace, first, "Running", timeout=RAY_TIMEOUT)
        pods = await pods_of(cluster, namespace, first)
        assert sorted(p["metadata"]["labels"]["ray.io/node-type"] for p in pods) == [
            "head",
            "worker",
        ]
        head, *behind = waiting
        assert await wait_message(cluster, namespace, head, f"queue {QUEUE}:") == FULL
        assert await waits_for(cluster, namespace, head) == ("QuotaExceeded", FULL)
        for name in behind:
            assert (await wait_message(cluster, namespace, name, OWN)).startswith(OWN)
            reason, _ = await waits_for(cluster, namespace, name)
            assert reason == "QuotaExceeded"
        await async_holds_for(
            lambda: holds_alone(cluster, namespace, first, waiting),
            seconds=QUIET_SECONDS,
            what=f"{first} alone in the queue",
        )
        await wait_counts(cluster, namespace, pending=2, admitted=1)
        assert await usage(cluster) == {"cpu": "2", "memory": "4G", "nvidia.com/gpu": "0"}
        admission = (await get_aw(cluster, namespace, first))["status"]["admission"]
        assert (admission["queue"], admission["clusterQueue"]) == (
            f"{namespace}/{LOCAL_QUEUE}",
            QUEUE,
        )
        assert (await get_aw(cluster, namespace, first))["status"]["priority"] == 100

        # prod arrives: the running dev one is evicted for it, back to the queue.
        await apply(cluster, namespace, ray_job("prod-job.yaml", PROD))
        await wait_condition(cluster, namespace, first, "Preempted")
        await wait_condition(cluster, namespace, PROD, "Running", timeout=RAY_TIMEOUT)
        victim = (await get_aw(cluster, namespace, first))["status"]
        assert victim["preemptedBy"] == f"{namespace}/{PROD}"
        (preempted,) = [c for c in victim["conditions"] if c["type"] == "Preempted"]
        assert preempted["status"] == "True"
        assert preempted["reason"] == "PreemptedByHigherPriority"
        assert f"preempted by {namespace}/{PROD}, priority 1000" in preempted["message"]
        assert (await conditions(cluster, namespace, first))["Dispatched"] != "True"
        assert victim["requeueCount"] == 1
        # Its RayCluster is deleted before it is requeued; its pods follow with the garbage
        # collector, which the requeue does not wait for (on a young cluster, up to ~30s).
        assert await rayclusters(cluster, namespace) == [PROD]
        await async_wait_until(
            lambda: no_pods(cluster, namespace, first), timeout=60, what=f"{first}'s pods gone"
        )
        assert len(await pods_of(cluster, namespace, PROD)) == 2
        prod = (await get_aw(cluster, namespace, PROD))["status"]
        assert (prod["priority"], prod["admission"]["clusterQueue"]) == (1000, QUEUE)
        await async_holds_for(
            lambda: holds_alone(cluster, namespace, PROD, list(DEVS)),
            seconds=QUIET_SECONDS,
            what="prod alone in the queue",
        )
        await wait_counts(cluster, namespace, pending=3, admitted=1)
        assert await usage(cluster) == {"cpu": "2", "memory": "4G", "nvidia.com/gpu": "0"}

        # prod is gone: the dev ones go one at a time, each deleted once it runs.
        await delete_aw(cluster, namespace, PROD)
        remaining = list(DEVS)
        while remaining:
            current = await async_wait_until(
                lambda: dispatched_one_of(cluster, namespace, remaining),
                timeout=60,
                what=f"one of {remaining} dispatched",
            )
            await wait_condition(cluster, namespace, current, "Running", timeout=RAY_TIMEOUT)
            remaining.remove(current)
            await wait_counts(cluster, namespace, pending=len(remaining), admitted=1)
            await delete_aw(cluster, namespace, current)
        await wait_counts(cluster, namespace, pending=0, admitted=0)
        assert await rayclusters(cluster, namespace) == []

    assert holders.errors == []
    assert holders.most == 1, "two AppWrappers held the queue's quota at once"
    # The evicted one kept its place in the queue: it went again first.
    assert holders.timeline == [DEVS[0], PROD, *DEVS]
    assert holders.ran == {*DEVS, PROD}
