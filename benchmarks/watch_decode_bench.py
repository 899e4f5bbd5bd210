"""One pod watch event, decoded whole and then slimmed, against read lazily (`kube/lazyjson.py`).

    python -m benchmarks.watch_decode_bench [--events 20000]

The event is a real KubeRay worker pod (`kuberay_worker_pod.json`, 9.8 KB: a worker of the
peer benchmark's gangs RayCluster, with the labels the dispatcher puts on its pod templates,
made by the KubeRay v1.6.1 operator and run by KWOK on the local control plane, as read with
`kubectl get -o json --show-managed-fields`), as the pod cache sees it in that scenario.
Prints the microseconds per event of each way (the best of 7 rounds) and checks that both
give the same dict. No side effects.
"""

from __future__ import annotations

import argparse
import json
import timeit
from pathlib import Path
from typing import Any

from dispatcher.cluster.capacity import slim_pod, slim_pod_lazy
from dispatcher.kube.jsoncodec import decode, encode
from dispatcher.kube.lazyjson import LazyEvents

Obj = dict[str, Any]
POD = Path(__file__).with_name("kuberay_worker_pod.json")


def worker_pod() -> Obj:
    pod: Obj = json.loads(POD.read_text())
    return pod


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20000)
    args = parser.parse_args(argv)
    line = encode({"type": "MODIFIED", "object": worker_pod()}) + b"\n"
    lazily = LazyEvents(slim_pod_lazy)

    def whole() -> tuple[str, Obj]:
        event = decode(line)
        return event["type"], slim_pod(event["object"])

    assert lazily(line) == whole()
    print(f"pod watch event: {len(line)} bytes")
    for name, way in (
        ("decoded whole (orjson) + slim_pod", whole),
        ("read lazily", lambda: lazily(line)),
    ):
        best = min(timeit.repeat(way, number=args.events, repeat=7)) / args.events
        print(f"  {name}: {best * 1e6:.1f} µs")


if __name__ == "__main__":
    main()
