"""kubectl against any cluster: the commands tests, the demo and benchmarks type, node
manifests for KWOK, and `ExistingCluster`, a kubeconfig for a cluster made elsewhere (kind, a
real one) behind the same interface as `LocalCluster`.

Side effects: runs kubectl.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"


class KubectlError(subprocess.CalledProcessError):
    """A kubectl call failed; the message carries what kubectl printed."""

    def __str__(self) -> str:
        return f"{' '.join(map(str, self.cmd[3:]))!r} exited {self.returncode}: {self.stderr}"


def node_manifest(
    name: str,
    *,
    cpu: str = "8",
    memory: str = "32Gi",
    gpu: int = 0,
    pods: int = 110,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    extra: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Node that KWOK manages: no kubelet, made Ready by KWOK's node stages."""
    capacity = {"cpu": cpu, "memory": memory, "pods": str(pods), **(extra or {})}
    if gpu:
        capacity["nvidia.com/gpu"] = str(gpu)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **(labels or {}),
            },
        },
        "spec": {"taints": [dict(t) for t in taints]},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


class KubectlMixin:
    """kubectl against one cluster; `kubeconfig` and `kubectl_path` come from the subclass."""

    kubeconfig: Path
    kubectl_path: Path | str

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, result.args, result.stdout, result.stderr)
        return result

    async def akubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """kubectl without blocking the event loop (an in-process dispatcher keeps running)."""

        argv = [str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig), *args]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(input.encode() if input is not None else None), timeout
            )
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        result = subprocess.CompletedProcess(argv, proc.returncode or 0, out.decode(), err.decode())
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def apply(self, manifest: Mapping[str, Any] | str, *, server_side: bool = False) -> None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        args = ["apply", "-f", "-"] + (["--server-side"] if server_side else [])
        self.kubectl(*args, input=text)

    def add_node(self, name: str, **kwargs: Any) -> None:
        """Create a fake node (see `node_manifest` for the knobs); idempotent."""
        self.apply(node_manifest(name, **kwargs))

    def wait_nodes_ready(self, names: Sequence[str], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        pending = set(names)
        while pending:
            out = self.kubectl("get", "nodes", "-o", "json", check=False)
            if out.returncode == 0:
                for node in json.loads(out.stdout)["items"]:
                    conditions = node.get("status", {}).get("conditions", [])
                    taints = node.get("spec", {}).get("taints") or []
                    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
                    not_ready_taint = any(
                        t["key"].startswith("node.kubernetes.io/not-ready") for t in taints
                    )
                    if ready and not not_ready_taint:
                        pending.discard(node["metadata"]["name"])
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes not Ready after {timeout}s: {sorted(pending)}")
            time.sleep(0.2)


@dataclass
class ExistingCluster(KubectlMixin):
    """A cluster made elsewhere (kind, a real one), reached through its kubeconfig."""

    name: str
    kubeconfig: Path
    kubectl_path: Path | str = "kubectl"
    webhook_client_ca: Path | None = None
    """Not known for a cluster made elsewhere: tests that need it skip."""
    webhook_client_ca_key: Path | None = None

    def stop(self) -> None:
        """Nothing to stop: the cluster is not ours."""
