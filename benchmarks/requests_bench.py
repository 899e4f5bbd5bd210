"""API requests the dispatcher makes, counted from the API server's audit log.

    python -m benchmarks.requests_bench [--lives 40] [--backlog 300 --backlog 3000]
        [--window 20] [--webhook] [--out benchmarks/results/requests.json]

One local control plane with its audit log on (reads too, not watches), a dispatcher run in
this process; its requests are told apart by their User-Agent (`appwrapper-dispatcher/...`).
With `--webhook` the dispatcher serves its admission webhook too, registered for every
namespace, as installed (the webhook sets the finalizer at CREATE; its own requests, the
SubjectAccessReviews, are counted with the rest).

- `lives`: N AppWrappers, each one Job of one 1-CPU pod, applied at once onto one 4-CPU
  node, so that most queue first; each runs to Completed (KWOK ends Job pods at once), then
  is deleted. Printed: the dispatcher's requests per AppWrapper life, by verb and resource,
  up to Completed and for the deletion apart; and its status writes by the step each
  recorded (the furthest condition it turned True) and its Events by reason.
- `backlog`: N AppWrappers (a Deployment of one 4-CPU pod each) queued behind one that
  holds the node, all initialised; then one change (the holder is deleted: the head is
  dispatched and a new head follows) and the dispatcher's writes in the `window` seconds
  after it, by verb and resource. O(1) means the same count at 300 as at 3,000.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.peer_watch import AuditTail
from benchmarks.report import save
from dispatcher.api.constants import API_VERSION, KIND, PLURAL
from dispatcher.app import running
from dispatcher.config import Config, WebhookConfig
from dispatcher.kube.client import KubeClient, ResourceInfo
from dispatcher.kube.registration import webhook_configurations
from testenv.converter import install_appwrapper_crd
from testenv.localcluster import LocalCluster, ensure_binaries, free_port
from testenv.manifests import appwrapper, deployment, job

APPWRAPPERS = ResourceInfo(API_VERSION, KIND, PLURAL, True)
AGENT = "appwrapper-dispatcher/"
BENCH_AGENT = "requests-bench"
WRITES = frozenset({"create", "update", "patch", "delete"})


def _key(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    resource = str(ref.get("resource", "?"))
    if ref.get("subresource"):
        resource += "/" + str(ref["subresource"])
    return f"{event.get('verb')} {resource}"


def _ours(
    events: list[dict[str, Any]], since: float = 0.0, until: float = float("inf")
) -> Iterator[dict[str, Any]]:
    """The dispatcher's answered requests among audit `events`, watches left out, received
    at or after `since` and before `until`."""
    for event in events:
        if not str(event.get("userAgent", "")).startswith(AGENT):
            continue
        if event.get("verb") == "watch" or event.get("stage") != "ResponseComplete":
            continue
        stamp = event.get("requestReceivedTimestamp", "")
        if (since or until != float("inf")) and not since <= _seconds(stamp) < until:
            continue
        yield event


def count(events: list[dict[str, Any]], since: float = 0.0) -> Counter[str]:
    """The dispatcher's requests among audit `events` (received at or after `since`)."""
    return Counter(_key(event) for event in _ours(events, since))


STEPS = ("Failed", "Completed", "Running", "Dispatched", "HeadOfLine", "Queueing", "Init")
"""The conditions a status write may turn True, furthest first: a write is named for the
furthest it turned True ("Dispatched" also carries Init, Queueing and HeadOfLine when it
is the first), or "message" when it turned none True (a new reason or message)."""


def steps(events: list[dict[str, Any]], since: float, until: float) -> dict[str, Counter[str]]:
    """The dispatcher's status writes by the step each recorded, and its Events by reason,
    between `since` and `until` (the audit policy keeps their bodies)."""
    true_before: dict[str, set[str]] = {}
    writes: Counter[str] = Counter()
    notices: Counter[str] = Counter()
    for event in _ours(events, since, until):
        if event.get("verb") not in WRITES:
            continue
        ref, body = event.get("objectRef") or {}, event.get("requestObject") or {}
        if ref.get("resource") == "events":
            notices[str(body.get("reason", "?"))] += 1
        elif ref.get("subresource") == "status":
            conditions = (body.get("status") or {}).get("conditions") or []
            now_true = {c.get("type") for c in conditions if c.get("status") == "True"}
            turned = now_true - true_before.get(str(ref.get("name")), set())
            true_before[str(ref.get("name"))] = now_true
            writes[next((s for s in STEPS if s in turned), "message")] += 1
    return {"status_writes": writes, "events": notices}


def _seconds(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


async def _count_status(client: KubeClient, namespace: str, condition: str) -> int:
    items = (await client.list(APPWRAPPERS, namespace)).get("items") or []
    return sum(
        1
        for item in items
        if any(
            c.get("type") == condition and c.get("status") == "True"
            for c in (item.get("status") or {}).get("conditions") or []
        )
    )


async def _until(check: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.5)


async def _apply_all(client: KubeClient, namespace: str, objects: list[dict[str, Any]]) -> None:
    limit = asyncio.Semaphore(32)

    async def one(obj: dict[str, Any]) -> None:
        async with limit:
            await client.create(APPWRAPPERS, namespace, obj)

    await asyncio.gather(*(one(o) for o in objects))


def _per_life(counted: Counter[str], lives: int) -> dict[str, float]:
    figures = {k: round(v / lives, 3) for k, v in sorted(counted.items())}
    figures["total"] = round(sum(counted.values()) / lives, 3)
    figures["writes"] = round(
        sum(v for k, v in counted.items() if k.split()[0] in WRITES) / lives, 3
    )
    return figures


async def lives(cluster: LocalCluster, client: KubeClient, audit: AuditTail, n: int) -> Any:
    namespace = "lives"
    cluster.kubectl("create", "namespace", namespace)
    objects = [
        appwrapper(f"j{i}", job(f"j{i}", 1, {"cpu": "1"}), completion="Complete") for i in range(n)
    ]
    started = time.time()
    await _apply_all(client, namespace, objects)

    async def completed() -> bool:
        return await _count_status(client, namespace, "Completed") == n

    await _until(completed, f"{n} Completed", 60 + 3 * n)
    await asyncio.sleep(3)  # what trails the last Completed (its Event)
    deleting = time.time()
    await cluster.akubectl(
        "delete", "aw", "--all", "-n", namespace, "--wait=true", "--timeout=300s"
    )
    await asyncio.sleep(3)
    audit.read()
    life = count(audit.events, since=started) - count(audit.events, since=deleting)
    deletion = count(audit.events, since=deleting)
    by_step = steps(audit.events, since=started, until=deleting)
    return {
        "n": n,
        "life": _per_life(life, n),
        "deletion": _per_life(deletion, n),
        "life_by_step": {
            what: {k: round(v / n, 3) for k, v in sorted(c.items())} | {"total": c.total() / n}
            for what, c in by_step.items()
        },
    }


async def backlog(
    cluster: LocalCluster, client: KubeClient, audit: AuditTail, n: int, window: float
) -> Any:
    namespace = f"backlog-{n}"
    cluster.kubectl("create", "namespace", namespace)
    holder = appwrapper("holder", deployment("holder", 1, {"cpu": "4"}))
    await client.create(APPWRAPPERS, namespace, holder)

    async def held() -> bool:
        return await _count_status(client, namespace, "Dispatched") == 1

    await _until(held, "holder dispatched", 60)
    objects = [appwrapper(f"w{i:05d}", deployment(f"w{i:05d}", 1, {"cpu": "4"})) for i in range(n)]
    started = time.time()
    await _apply_all(client, namespace, objects)

    async def initialised() -> bool:
        return await _count_status(client, namespace, "Queueing") == n + 1

    await _until(initialised, f"{n} initialised", 120 + n / 5)
    ready = time.time()
    await asyncio.sleep(window)  # a quiet window before: what the backlog costs at rest
    audit.read()
    at_rest = count(audit.events, since=ready + 0.001)
    changed = time.time()
    await cluster.akubectl("delete", "aw", "holder", "-n", namespace, "--wait=false")
    await asyncio.sleep(window)
    audit.read()
    after = count(audit.events, since=changed)
    init = count(audit.events, since=started) - count(audit.events, since=ready)
    result = {
        "n": n,
        "initialise_seconds": round(ready - started, 1),
        "initialise_per_second": round(n / max(ready - started, 1e-9), 1),
        "initialise_requests": dict(init),
        "window_seconds": window,
        "at_rest": dict(at_rest),
        "after_one_change": dict(after),
        "writes_after_one_change": sum(v for k, v in after.items() if k.split()[0] in WRITES),
    }
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    return result


def _webhook(cluster: LocalCluster) -> WebhookConfig:
    """The admission webhook on a free loopback port, registered for every namespace; it
    answers only the API server's client certificate, as installed."""
    name, port = "requests-bench", free_port()
    cluster.kubectl("create", "namespace", "aw-webhook")
    for configuration in webhook_configurations(name, port):
        cluster.apply(configuration)
    return WebhookConfig(
        enabled=True,
        host="127.0.0.1",
        port=port,
        namespace="aw-webhook",
        extra_names=["127.0.0.1"],
        mutating_configuration=name,
        validating_configuration=name,
        client_ca_file=str(cluster.webhook_client_ca),
    )


async def measure(
    workdir: Path, n_lives: int, backlogs: list[int], window: float, qps: float, webhook: bool
) -> dict[str, Any]:
    cluster = LocalCluster.start(
        "requests", workdir, binaries=ensure_binaries(), audit=True, audit_reads=True
    )
    result: dict[str, Any] = {"webhook": webhook}
    try:
        cluster.add_node("node-1", cpu="4", memory="16Gi")
        cluster.wait_nodes_ready(["node-1"])
        install_appwrapper_crd(cluster)  # its conversion served here: `kubectl ... aw` works
        cluster.kubectl(
            "wait", "--for=condition=Established",
            f"crd/{PLURAL}.{API_VERSION.split('/')[0]}", "--timeout=60s",
        )  # fmt: skip
        await asyncio.sleep(2)
        audit = AuditTail(cluster.workdir / "logs" / "audit.log")
        client = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig))
        client._agent = BENCH_AGENT  # its own requests are not the dispatcher's
        config = Config(
            kubeconfig=str(cluster.kubeconfig),
            health_port=0,
            log_level="warning",
            unattributed="allow",
            qps=qps,
            webhook=_webhook(cluster) if webhook else WebhookConfig(),
        )
        try:
            async with running(config):
                if n_lives:
                    result["lives"] = await lives(cluster, client, audit, n_lives)
                    print(f"lives: {result['lives']}", flush=True)
                for n in backlogs:
                    result[f"backlog_{n}"] = await backlog(cluster, client, audit, n, window)
                    print(f"backlog {n}: {result[f'backlog_{n}']}", flush=True)
        finally:
            await client.close()
    finally:
        cluster.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lives", type=int, default=40)
    parser.add_argument("--backlog", type=int, action="append", default=[])
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--qps", type=float, default=200.0)
    parser.add_argument("--webhook", action="store_true", help="serve the admission webhook")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/requests.json"))
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        workdir = report.workdir(stack, args.workdir, "aw-req-")
        result = asyncio.run(
            measure(workdir, args.lives, args.backlog, args.window, args.qps, args.webhook)
        )
    save(result, args.out)


if __name__ == "__main__":
    main()
