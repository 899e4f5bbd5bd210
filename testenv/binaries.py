"""The control plane's binaries, built from Go modules (testenv/build.sh) into a cache
directory, and where each one is.

Side effects: `ensure_binaries` runs the build (minutes when cold, a second when warm).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = Path(
    os.environ.get("APPWRAPPER_CACHE_DIR", Path.home() / ".cache/appwrapper-dispatcher")
)


class ClusterStartError(RuntimeError):
    """A component did not come up; the message names it and the log to read."""


@dataclass(frozen=True)
class Binaries:
    """Paths of the built control-plane binaries and the data files built beside them."""

    root: Path

    @property
    def k8s(self) -> Path:
        return self.root / "k8s"

    @property
    def kubectl(self) -> Path:
        return self.root / "kubectl"

    @property
    def kwok(self) -> Path:
        return self.root / "kwok"

    @property
    def kuberay(self) -> Path:
        return self.root / "kuberay-operator"

    @property
    def kwok_stages(self) -> list[Path]:
        # "fast" stages: nodes Ready at once, pods Running once bound, Job pods
        # Succeeded (after an optional per-pod delay annotation), deletions honoured.
        stages = self.root / "kwok-stages"
        return sorted(
            path
            for kind in ("node", "pod")
            for path in (stages / kind / "fast").glob("*.yaml")
            if path.name != "kustomization.yaml"
        )

    @property
    def kuberay_crds(self) -> Path:
        return self.root / "kuberay-crds"

    @property
    def kueue_crds(self) -> Path:
        """Kueue v0.15.0's quota CRDs (ClusterQueue, LocalQueue, Cohort, ResourceFlavor,
        WorkloadPriorityClass), as published: serving v1beta1 (stored) and v1beta2."""
        return self.root / "kueue-crds"


def ensure_binaries(cache: Path = DEFAULT_CACHE) -> Binaries:
    """Build the control plane if missing (cold: minutes; warm: a second) and return it."""
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "testenv" / "build.sh")],
        env={**os.environ, "APPWRAPPER_CACHE_DIR": str(cache)},
        check=False,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise ClusterStartError(
            f"testenv/build.sh failed (exit {result.returncode}):\n{result.stderr[-4000:]}"
        )
    return Binaries(Path(result.stdout.strip().splitlines()[-1]))
