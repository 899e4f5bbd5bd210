"""`make demo`: the dispatcher's main job on a local control plane, start to finish.

Side effects: builds (if missing) and starts a local control plane with fake GPU nodes and
KubeRay, runs the dispatcher in this process, applies the samples, prints what users see,
and tears everything down (or keeps it with --keep).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from dispatcher.app import running
from dispatcher.config import Config, MemberConfig
from dispatcher.logs import configure_logging
from dispatcher.testing.localcluster import REPO_ROOT, LocalCluster, ensure_binaries

SAMPLES = [
    "ray-glue-1.yaml",
    "ray-glue-2.yaml",
    "job-completion.yaml",
    "service-deployment.yaml",
    "mcad-legacy.yaml",
]
NAMESPACE = "demo"


def _say(text: str) -> None:
    print(f"\n=== {text}", flush=True)


async def _conditions(cluster: LocalCluster, name: str) -> dict[str, str]:
    out = await cluster.akubectl("get", "aw", name, "-n", NAMESPACE, "-o", "json", check=False)
    if out.returncode != 0:
        return {}
    status = json.loads(out.stdout).get("status") or {}
    return {c["type"]: c["status"] for c in status.get("conditions", [])}


async def _wait_for(cluster: LocalCluster, name: str, condition: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (await _conditions(cluster, name)).get(condition) == "True":
            return True
        await asyncio.sleep(0.5)
    return False


async def _show(cluster: LocalCluster, *args: str) -> None:
    print(f"$ kubectl {' '.join(args)}")
    out = await cluster.akubectl(*args, check=False)
    print(out.stdout or out.stderr, end="", flush=True)


async def demo(workdir: Path, keep: bool) -> int:
    _say("Building (first run only) and starting a local control plane with KubeRay")
    binaries = ensure_binaries()
    cluster = LocalCluster.start("demo", workdir, binaries=binaries, kuberay=True)
    try:
        # Six GPUs: one RayCluster gang (4 GPUs) fits, a second does not.
        for index in (1, 2, 3):
            cluster.add_node(f"gpu-node-{index}", cpu="8", memory="40Gi", gpu=2)
        cluster.add_node("cpu-node", cpu="8", memory="32Gi")
        cluster.wait_nodes_ready(["gpu-node-1", "gpu-node-2", "gpu-node-3", "cpu-node"])
        cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds" / "appwrapper.yaml"))
        cluster.kubectl("create", "namespace", NAMESPACE)
        await _show(
            cluster,
            "get",
            "nodes",
            "-o",
            "custom-columns=NAME:.metadata.name,CPU:.status.allocatable.cpu,"
            "MEMORY:.status.allocatable.memory,"
            "GPU:.status.allocatable.nvidia\\.com/gpu",
        )
        config = Config(kubeconfig=str(cluster.kubeconfig), health_port=0, log_level="warning")
        async with running(config):
            _say("Dispatcher running; applying the samples")
            for sample in SAMPLES:
                await _show(
                    cluster, "apply", "-n", NAMESPACE, "-f", str(REPO_ROOT / "samples" / sample)
                )
                if sample == "ray-glue-1.yaml":
                    await _wait_for(cluster, "glue-1", "Dispatched", 30)
            await _wait_for(cluster, "glue-1", "Running", 90)
            await _wait_for(cluster, "mcad-legacy", "Dispatched", 60)
            await asyncio.sleep(2)
            _say("Two RayClusters, GPUs for one: glue-1 runs, glue-2 waits with the reason")
            await _show(cluster, "get", "aw", "-n", NAMESPACE)
            await _show(cluster, "get", "pods", "-n", NAMESPACE, "-o", "wide")
            await _show(
                cluster,
                "get",
                "aw",
                "glue-2",
                "-n",
                NAMESPACE,
                "-o",
                "jsonpath={range .status.conditions[*]}{.type}={.status} "
                '({.reason}: {.message}){"\\n"}{end}',
            )
            _say("kubectl describe aw glue-1 (conditions and events)")
            await _show(cluster, "describe", "aw", "glue-1", "-n", NAMESPACE)
            _say("Deleting glue-1: its pods go, and only then glue-2 is dispatched")
            await _show(cluster, "delete", "aw", "glue-1", "-n", NAMESPACE)
            ok = await _wait_for(cluster, "glue-2", "Running", 90)
            await _show(cluster, "get", "aw", "-n", NAMESPACE)
            if keep:
                _say(
                    f"Still running. Try: kubectl --kubeconfig {cluster.kubeconfig} get aw -A"
                    "   (Ctrl-C to stop)"
                )
                await asyncio.Event().wait()
            return 0 if ok else 1
    finally:
        cluster.stop()


async def demo_members(workdir: Path, members: int, keep: bool) -> int:
    """A hub holding AppWrappers and `members` member clusters; work lands where it fits."""
    _say(f"Starting a hub and {members} member clusters")
    binaries = ensure_binaries()
    hub = LocalCluster.start("hub", workdir, binaries=binaries)
    clusters: list[LocalCluster] = []
    try:
        names = [f"member-{chr(ord('a') + i)}" for i in range(members)]
        for index, name in enumerate(names):
            cluster = LocalCluster.start(name, workdir, binaries=binaries)
            clusters.append(cluster)
            # Only the last member has GPUs: GPU work must land there.
            cluster.add_node(
                f"{name}-node", cpu="8", memory="32Gi", gpu=4 if index == members - 1 else 0
            )
            cluster.wait_nodes_ready([f"{name}-node"])
        hub.kubectl("apply", "-f", str(REPO_ROOT / "crds" / "appwrapper.yaml"))
        hub.kubectl("create", "namespace", NAMESPACE)
        config = Config(
            kubeconfig=str(hub.kubeconfig),
            health_port=0,
            log_level="warning",
            members=[
                MemberConfig(name=n, kubeconfig=str(c.kubeconfig), labels={"demo": n})
                for n, c in zip(names, clusters, strict=True)
            ],
        )
        async with running(config):
            _say("Applying a GPU job and a CPU service on the hub")
            await _show(
                hub, "apply", "-n", NAMESPACE, "-f", str(REPO_ROOT / "samples" / "mcad-legacy.yaml")
            )
            await _show(
                hub,
                "apply",
                "-n",
                NAMESPACE,
                "-f",
                str(REPO_ROOT / "samples" / "service-deployment.yaml"),
            )
            ok = await _wait_for(hub, "mcad-legacy", "Dispatched", 60)
            ok = await _wait_for(hub, "service-deployment", "Running", 60) and ok
            await _show(hub, "get", "aw", "-n", NAMESPACE)
            for name, cluster in zip(names, clusters, strict=True):
                _say(f"In {name}")
                await _show(cluster, "get", "deployments,jobs,pods", "-n", NAMESPACE)
            if keep:
                _say(f"Still running. Hub: kubectl --kubeconfig {hub.kubeconfig} get aw -A")
                await asyncio.Event().wait()
            return 0 if ok else 1
    finally:
        for cluster in clusters:
            cluster.stop()
        hub.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep running until Ctrl-C")
    parser.add_argument(
        "--members",
        type=int,
        default=1,
        help="member clusters besides the hub (default: the hub alone)",
    )
    args = parser.parse_args()
    configure_logging(level="warning")
    with tempfile.TemporaryDirectory(prefix="aw-demo-") as tmp:
        try:
            if args.members > 1:
                raise SystemExit(asyncio.run(demo_members(Path(tmp), args.members, args.keep)))
            raise SystemExit(asyncio.run(demo(Path(tmp), args.keep)))
        except KeyboardInterrupt:
            raise SystemExit(130) from None


if __name__ == "__main__":
    main()
