"""`kubectl aw`: the AppWrapper queue from a terminal (installed as the `kubectl-aw` script).

Side effects: reads the kubeconfig; requests to the API server (reads, and for `stop` /
`resume` a merge patch of a ClusterAppQueue's `spec.stopPolicy`); prints to stdout.

  kubectl aw list [-n NS | -A] [-o json|yaml|wide]   queue, position, state, start estimate
  kubectl aw why NAME [-n NS] [-o json|yaml]         every condition, position and number
  kubectl aw queues [-o json|yaml|wide]              usage, borrowed, pending per queue
  kubectl aw stop QUEUE [--drain] / resume QUEUE     a ClusterAppQueue's stopPolicy

Errors are one line on stderr and exit code 1 (2 for a usage error, as argparse does).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from dispatcher.api.constants import GROUP, LABEL_QUEUE
from dispatcher.plugin.kubeconfig import ApiError, Connection, PluginError, connect

APPWRAPPERS = f"/apis/{GROUP}/v1beta1"
VISIBILITY = "/apis/visibility.workload.codeflare.dev/v1alpha1"

Obj = dict[str, Any]


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kubeconfig")
    common.add_argument("--context")
    common.add_argument("-n", "--namespace")
    common.add_argument("--as", dest="impersonate")
    common.add_argument("--as-group", dest="groups", action="append", default=[])
    common.add_argument("--request-timeout", type=float, default=30.0)
    common.add_argument("-o", "--output", choices=["json", "yaml", "wide"])
    parser = argparse.ArgumentParser(prog="kubectl aw", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", parents=[common], help="AppWrappers, queued first")
    listing.add_argument("-A", "--all-namespaces", action="store_true")
    why = commands.add_parser("why", parents=[common], help="why an AppWrapper is where it is")
    why.add_argument("name")
    commands.add_parser("queues", parents=[common], help="ClusterAppQueues and AppQueues")
    stop = commands.add_parser("stop", parents=[common], help="stop a ClusterAppQueue")
    stop.add_argument("queue")
    stop.add_argument(
        "--drain", action="store_true", help="HoldAndDrain: also requeue what it admitted"
    )
    resume = commands.add_parser("resume", parents=[common], help="resume a ClusterAppQueue")
    resume.add_argument("queue")
    return parser


def _pending(api: Connection, path: str) -> dict[str, Obj] | None:
    """Pending AppWrappers by key from the visibility API; None when it cannot answer
    (not installed, or a standby answered), which `list` says on stderr."""
    try:
        answer = api.get(VISIBILITY + path, limit="100000")
    except ApiError as exc:
        print(f"warning: no positions: {exc}", file=sys.stderr)
        return None
    items = answer.get("items") or []
    return {f"{i['metadata']['namespace']}/{i['metadata']['name']}": i for i in items}


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def _eta(item: Obj | None) -> str:
    if item is None:
        return "-"
    eta = item.get("eta") or {}
    at = eta.get("at")
    if not at:
        return "unknown"
    return ("by " if eta.get("latest") else "~") + str(at)[11:16]


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join(lines)


def _emit(obj: Obj, output: str | None) -> bool:
    if output == "json":
        print(json.dumps(obj, indent=4))
        return True
    if output == "yaml":
        import yaml  # only here: the plugin starts faster without it

        print(yaml.safe_dump(obj, sort_keys=False), end="")
        return True
    return False


def cmd_list(api: Connection, args: argparse.Namespace) -> None:
    if args.all_namespaces:
        appwrappers = api.get(f"{APPWRAPPERS}/appwrappers")
        pending = _pending(api, "/pendingappwrappers")
    else:
        appwrappers = api.get(f"{APPWRAPPERS}/namespaces/{api.namespace}/appwrappers")
        pending = _pending(api, f"/namespaces/{api.namespace}/pendingappwrappers")
    rows: list[tuple[tuple[int, str], Obj, Obj | None]] = []
    for aw in appwrappers.get("items") or []:
        meta = aw.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        item = (pending or {}).get(key)
        order = item["position"] if item else 1 << 30
        rows.append(((order, key), aw, item))
    rows.sort(key=lambda r: r[0])
    if _emit(
        {"kind": "List", "apiVersion": "v1", "items": [_summary(aw, it) for _, aw, it in rows]},
        args.output,
    ):
        return
    if not rows:
        where = "any namespace" if args.all_namespaces else f"namespace {api.namespace}"
        print(f"No AppWrappers found in {where}.", file=sys.stderr)
        return
    head = ["NAME", "STATE", "QUEUE", "POSITION", "ETA"]
    if args.all_namespaces:
        head.insert(0, "NAMESPACE")
    if args.output == "wide":
        head += ["PRIORITY", "WAITING", "REASON", "BASIS"]
    table = [head]
    for _, aw, item in rows:
        summary = _summary(aw, item)
        row = [
            summary["name"],
            summary["state"],
            summary["queue"] or "-",
            f"{item['positionInClusterQueue']}" if item else "-",
            _eta(item),
        ]
        if args.all_namespaces:
            row.insert(0, summary["namespace"])
        if args.output == "wide":
            row += [
                str(summary["priority"]),
                _age(item["waitingSeconds"]) if item else "-",
                summary["reason"] or "-",
                (item or {}).get("eta", {}).get("basis", "-"),
            ]
        table.append(row)
    print(_table(table))


def _summary(aw: Obj, item: Obj | None) -> Obj:
    meta = aw.get("metadata") or {}
    status = aw.get("status") or {}
    admission = status.get("admission") or {}
    labels = meta.get("labels") or {}
    queue = (item or {}).get("clusterQueue") or admission.get("clusterQueue") or ""
    asked = labels.get(LABEL_QUEUE) or labels.get("kueue.x-k8s.io/queue-name") or ""
    latest = _latest(status)
    return {
        "namespace": meta.get("namespace", ""),
        "name": meta.get("name", ""),
        "state": status.get("state") or "Pending",
        "queue": queue or asked,
        "priority": (item or {}).get("priority", aw.get("spec", {}).get("priority", 0)),
        "reason": (item or {}).get("reason") or latest.get("reason", ""),
        "message": (item or {}).get("message") or latest.get("message", ""),
        "pending": item,
    }


def _latest(status: Obj) -> Obj:
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    conditions.sort(
        key=lambda c: str(c.get("lastUpdateMicroTime") or c.get("lastTransitionMicroTime") or "")
    )
    return conditions[-1] if conditions else {}


def cmd_why(api: Connection, args: argparse.Namespace) -> None:
    try:
        aw = api.get(f"{APPWRAPPERS}/namespaces/{api.namespace}/appwrappers/{args.name}")
    except ApiError as exc:
        if exc.code == 404:
            raise PluginError(
                f'appwrapper "{args.name}" not found in namespace {api.namespace}'
            ) from None
        raise
    item: Obj | None = None
    try:
        item = api.get(f"{VISIBILITY}/namespaces/{api.namespace}/pendingappwrappers/{args.name}")
    except ApiError as exc:
        if exc.code != 404:
            print(f"warning: no position: {exc}", file=sys.stderr)
    status = aw.get("status") or {}
    if _emit(
        {"appwrapper": aw.get("metadata", {}), "status": status, "pending": item}, args.output
    ):
        return
    summary = _summary(aw, item)
    lines = [f"{summary['namespace']}/{summary['name']}: {summary['state']}"]
    if summary["queue"]:
        lines.append(f"  queue: {summary['queue']}")
    lines.append(f"  priority: {summary['priority']}")
    if item is not None:
        local = (
            f", {item['positionInAppQueue']} in AppQueue {item['appQueue']}"
            if item["appQueue"]
            else ""
        )
        where = item["clusterQueue"] or "capacity-only work"
        lines.append(
            f"  position: {item['position']} overall,"
            f" {item['positionInClusterQueue']} in {where}{local}"
        )
        lines.append(
            f"  waiting: {_age(item['waitingSeconds'])} ({item['reason']}): {item['message']}"
        )
        lines.append(f"  starts: {item['eta']['basis']}")
    for key in ("clusterName", "requeueCount", "admission"):
        value = status.get(key)
        if value:
            lines.append(f"  {key}: {json.dumps(value) if isinstance(value, dict) else value}")
    lines.append("  conditions:")
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    conditions.sort(key=lambda c: str(c.get("lastTransitionMicroTime") or ""))
    for c in conditions:
        when = str(c.get("lastTransitionMicroTime") or "")[:19]
        lines.append(
            f"    {when}  {c.get('type')}={c.get('status')}"
            f"  {c.get('reason', '')}: {c.get('message', '')}"
        )
    print("\n".join(lines))


def _usage(status: Obj) -> tuple[str, str]:
    used, borrowed = [], []
    for flavor in status.get("flavorsUsage") or []:
        for r in flavor.get("resources") or []:
            used.append(f"{flavor.get('name')}/{r.get('name')}={r.get('total')}")
            if r.get("borrowed") not in (None, "0"):
                borrowed.append(f"{flavor.get('name')}/{r.get('name')}={r.get('borrowed')}")
    return ",".join(used) or "-", ",".join(borrowed) or "-"


def cmd_queues(api: Connection, args: argparse.Namespace) -> None:
    queues = api.get(f"{APPWRAPPERS}/clusterappqueues").get("items") or []
    path = "/appqueues" if args.namespace is None else f"/namespaces/{api.namespace}/appqueues"
    try:
        locals_ = api.get(APPWRAPPERS + path).get("items") or []
    except ApiError:
        locals_ = []  # a user who may not list AppQueues everywhere still sees the cluster queues
    if _emit({"kind": "List", "apiVersion": "v1", "items": [*queues, *locals_]}, args.output):
        return
    # Pending counts from the leader's order where it answers (queue status may lag).
    pending = _pending(api, "/pendingappwrappers")
    per_queue: dict[str, int] = {}
    for item in (pending or {}).values():
        for name in (item["clusterQueue"], f"{item['metadata']['namespace']}/{item['appQueue']}"):
            per_queue[name] = per_queue.get(name, 0) + 1

    def count(name: str, status: Obj) -> str:
        return str(
            per_queue.get(name, 0) if pending is not None else status.get("pendingWorkloads", 0)
        )

    table = [["KIND", "NAME", "STOP", "ACTIVE", "PENDING", "ADMITTED", "USAGE", "BORROWED"]]
    for q in queues:
        status = q.get("status") or {}
        used, borrowed = _usage(status)
        active = next(
            (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Active"),
            "-",
        )
        table.append(
            [
                "ClusterAppQueue",
                q["metadata"]["name"],
                (q.get("spec") or {}).get("stopPolicy", "None"),
                str(active),
                count(q["metadata"]["name"], status),
                str(status.get("admittedWorkloads", 0)),
                used,
                borrowed,
            ]
        )
    for q in locals_:
        status = q.get("status") or {}
        used, _ = _usage(status)
        key = f"{q['metadata'].get('namespace')}/{q['metadata']['name']}"
        target = (q.get("spec") or {}).get("clusterQueue")
        table.append(
            [
                "AppQueue",
                f"{key} -> {target}",
                (q.get("spec") or {}).get("stopPolicy", "None"),
                "-",
                count(key, status),
                str(status.get("admittedWorkloads", 0)),
                used,
                "-",
            ]
        )
    print(_table(table))


def _stop_policy(api: Connection, queue: str, policy: str) -> None:
    try:
        api.request(
            "PATCH",
            f"{APPWRAPPERS}/clusterappqueues/{queue}",
            body={"spec": {"stopPolicy": policy}},
            content_type="application/merge-patch+json",
        )
    except ApiError as exc:
        if exc.code == 404:
            raise PluginError(f'clusterappqueue "{queue}" not found') from None
        raise
    print(f"clusterappqueue/{queue} stopPolicy={policy}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        api = connect(
            kubeconfig=args.kubeconfig,
            context=args.context,
            namespace=args.namespace,
            impersonate=args.impersonate,
            groups=tuple(args.groups),
            timeout=args.request_timeout,
        )
        if args.command == "list":
            cmd_list(api, args)
        elif args.command == "why":
            cmd_why(api, args)
        elif args.command == "queues":
            cmd_queues(api, args)
        elif args.command == "stop":
            _stop_policy(api, args.queue, "HoldAndDrain" if args.drain else "Hold")
        elif args.command == "resume":
            _stop_policy(api, args.queue, "None")
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
