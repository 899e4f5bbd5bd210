"""`kubectl aw`: the AppWrapper queue from a terminal (installed as the `kubectl-aw` script).

Side effects: reads the kubeconfig; requests to the API server (reads, watches with `-w`
(dispatcher/plugin/watch.py), and for `stop` / `resume` a merge patch of a ClusterAppQueue's
`spec.stopPolicy`), through the kubeconfig's or the environment's proxy
(dispatcher/plugin/proxy.py); prints to stdout.

  kubectl aw list [-n NS | -A] [-l SEL] [-w] [-o json|yaml|wide]  queue, position, state, ETA
  kubectl aw why NAME [-n NS] [-w] [-o json|yaml]      every condition, position and number
  kubectl aw queues [-n NS | -A] [-l SEL] [-w] [-o json|yaml|wide]  usage, pending per queue
  kubectl aw stop QUEUE [--drain] / resume QUEUE       a ClusterAppQueue's stopPolicy
  kubectl aw version [--client]                        the plugin's and the API server's
  kubectl aw completion bash|zsh                       a shell completion script

Errors are one line on stderr and exit code 1 (2 for a usage error, as argparse does).

Every string it prints comes from the API server, and most of it was written by tenants
(names, RayCluster worker group names, node-selector values, the messages that repeat them).
Text output goes through `_show`, which writes each control character as an escape
(`terminal_safe`): a tenant cannot move the cursor, rewrite earlier lines, set the window
title or forge a line of someone else's output. `-o json` and `-o yaml` keep the data exact:
both encoders already write control characters as escapes of their own syntax (JSON with
ensure_ascii, YAML in double-quoted scalars), so a terminal shows them as text and a parser
gets them back.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from dispatcher.api.constants import GROUP, LABEL_QUEUE
from dispatcher.plugin.errors import ApiError, PluginError
from dispatcher.plugin.kubeconfig import Connection, connect
from dispatcher.plugin.queuetables import budget_left, heaviest_users, usage

APPWRAPPERS = f"/apis/{GROUP}/v1beta1"
VISIBILITY = "/apis/visibility.workload.codeflare.dev/v1alpha1"

Obj = dict[str, Any]


Parser = argparse.ArgumentParser


def _parser() -> tuple[Parser, dict[str, Parser]]:
    """The parser, and each command's own (shell completion reads their flags)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kubeconfig")
    common.add_argument("--context")
    common.add_argument("-n", "--namespace")
    common.add_argument("--as", dest="impersonate")
    common.add_argument("--as-group", dest="groups", action="append", default=[])
    common.add_argument("--request-timeout", type=float, default=30.0)
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("-o", "--output", choices=["json", "yaml", "wide"])
    listing = argparse.ArgumentParser(add_help=False)
    listing.add_argument("-A", "--all-namespaces", action="store_true")
    listing.add_argument("-l", "--selector", type=_selector, help="label selector (as kubectl's)")
    watching = argparse.ArgumentParser(add_help=False)
    watching.add_argument(
        "-w", "--watch", action="store_true", help="print again on each change (Ctrl-C ends)"
    )
    parser = argparse.ArgumentParser(prog="kubectl aw", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    def add(name: str, *, help: str, parents: Sequence[argparse.ArgumentParser] = ()) -> Parser:
        return commands.add_parser(name, parents=parents, help=help, description=help)

    each = {
        "list": add(
            "list", parents=[common, output, listing, watching], help="AppWrappers, queued first"
        ),
        "why": add(
            "why", parents=[common, output, watching], help="why an AppWrapper is where it is"
        ),
        "queues": add(
            "queues",
            parents=[common, output, listing, watching],
            help="ClusterAppQueues and AppQueues",
        ),
        "stop": add("stop", parents=[common], help="stop a ClusterAppQueue"),
        "resume": add("resume", parents=[common], help="resume a ClusterAppQueue"),
        "version": add(
            "version", parents=[common, output], help="the plugin's and the cluster's versions"
        ),
        "completion": add("completion", help="a shell completion script (bash, zsh)"),
    }
    each["why"].add_argument("name")
    each["stop"].add_argument("queue")
    each["stop"].add_argument(
        "--drain", action="store_true", help="HoldAndDrain: also requeue what it admitted"
    )
    each["resume"].add_argument("queue")
    each["version"].add_argument(
        "--client", action="store_true", help="the plugin's version only (no request)"
    )
    each["completion"].add_argument("shell", choices=["bash", "zsh"])
    return parser, each


def _selector(text: str) -> str:
    from dispatcher.plugin.selector import check_selector

    try:
        return check_selector(text)
    except PluginError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _query(args: argparse.Namespace) -> dict[str, str]:
    """The list's query: the label selector, where one was given."""
    return {"labelSelector": args.selector} if args.selector else {}


def _check_namespace(api: Connection, namespace: str) -> None:
    """PluginError if `namespace` does not exist (asked only once something came back
    empty or missing: a namespaced list in a namespace that does not exist is just empty).
    A user who may not read namespaces is told nothing more."""
    try:
        api.get(f"/api/v1/namespaces/{namespace}")
    except ApiError as exc:
        if exc.code == 404:
            raise PluginError(f'namespace "{namespace}" not found') from None


def _pending(api: Connection, path: str) -> dict[str, Obj] | None:
    """Pending AppWrappers by key from the visibility API; None when it cannot answer
    (not installed, or a standby answered), which `list` says on stderr."""
    try:
        answer = api.get(VISIBILITY + path, limit="100000")
    except ApiError as exc:
        _warn(f"warning: no positions: {exc}")
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


_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f"  # C0, DEL, C1: ESC and CSI start every ANSI escape sequence
    "\u200e\u200f\u202a-\u202e\u2066-\u2069"  # bidirectional controls: reorder what is shown
    "\u2028\u2029]"  # line and paragraph separators: a line break to some terminals
)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """`text` with every character a terminal would act on instead of show written as a
    Python-style escape (ESC as `\\x1b`, a newline as `\\x0a`). Backslashes are left as they
    are, so applying it twice changes nothing."""
    return _UNSAFE.sub(_escaped, text)


def _show(rows: Sequence[Sequence[object]], *, file: TextIO | None = None) -> None:
    """The one place text output is formatted: each row is a line, its cells escaped
    (`terminal_safe`) and, where rows have several, aligned in columns. A message on one
    line stays on one line whatever it holds. `file` is stdout unless given."""
    cells = [[terminal_safe(str(cell)) for cell in row] for row in rows]
    if not cells:
        return
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = [
        "   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    print("\n".join(lines), file=file or sys.stdout)


def _warn(message: str) -> None:
    _show([[message]], file=sys.stderr)


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
    appwrappers = api.get(_appwrappers(api, args), **_query(args))
    if not appwrappers.get("items") and not args.all_namespaces:
        _check_namespace(api, api.namespace)
    if args.all_namespaces:
        pending = _pending(api, "/pendingappwrappers")
    else:
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
        matching = f" matching {args.selector}" if args.selector else ""
        _warn(f"No AppWrappers{matching} found in {where}.")
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
    _show(table)


def _appwrappers(api: Connection, args: argparse.Namespace) -> str:
    if args.all_namespaces:
        return f"{APPWRAPPERS}/appwrappers"
    return f"{APPWRAPPERS}/namespaces/{api.namespace}/appwrappers"


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
            _check_namespace(api, api.namespace)
            raise PluginError(
                f'appwrapper "{args.name}" not found in namespace {api.namespace}'
            ) from None
        raise
    item: Obj | None = None
    try:
        item = api.get(f"{VISIBILITY}/namespaces/{api.namespace}/pendingappwrappers/{args.name}")
    except ApiError as exc:
        if exc.code != 404:
            _warn(f"warning: no position: {exc}")
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
        reservation = item.get("reservation")
        if isinstance(reservation, dict):
            nodes = [str(n) for n in reservation.get("nodes") or []]
            lines.append(
                f"  reserved: {len(nodes)} node{'' if len(nodes) == 1 else 's'} in cluster"
                f" {reservation.get('cluster')} ({', '.join(nodes)}), expected from"
                f" {reservation.get('expectedFrom')}, at the latest {reservation.get('latestFrom')}"
            )
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
    _show([[line] for line in lines])


def cmd_queues(api: Connection, args: argparse.Namespace) -> None:
    queues = api.get(f"{APPWRAPPERS}/clusterappqueues", **_query(args)).get("items") or []
    try:
        locals_ = api.get(_app_queues(api, args), **_query(args)).get("items") or []
    except ApiError:
        locals_ = []  # a user who may not list AppQueues everywhere still sees the cluster queues
    if not locals_ and _namespaced(args):
        _check_namespace(api, api.namespace)
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

    table = [
        ["KIND", "NAME", "STOP", "ACTIVE", "PENDING", "ADMITTED", "USAGE", "BORROWED", "BUDGET"]
    ]
    for q in queues:
        status = q.get("status") or {}
        used, borrowed = usage(status)
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
                budget_left(q),
            ]
        )
    for q in locals_:
        status = q.get("status") or {}
        used, _ = usage(status)
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
                "-",
            ]
        )
    _show(table)
    users = heaviest_users(queues)
    if len(users) > 1:
        print()
        _show(users)


def _namespaced(args: argparse.Namespace) -> bool:
    """`queues` shows AppQueues of every namespace unless `-n` names one (`-A` wins)."""
    return args.namespace is not None and not args.all_namespaces


def _app_queues(api: Connection, args: argparse.Namespace) -> str:
    if _namespaced(args):
        return f"{APPWRAPPERS}/namespaces/{api.namespace}/appqueues"
    return f"{APPWRAPPERS}/appqueues"


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
    _show([[f"clusterappqueue/{queue} stopPolicy={policy}"]])


def cmd_version(api: Connection | None, args: argparse.Namespace, *, plugin: str) -> None:
    """The plugin's version; with a connection, the API server's (`/version`) and whether
    the dispatcher's visibility API answers (the dispatcher publishes no version of its own
    there)."""
    versions: Obj = {"plugin": plugin}
    if api is not None:
        server = api.get("/version")
        versions["server"] = server.get("gitVersion", "unknown")
        try:
            api.get(VISIBILITY)
            versions["visibilityAPI"] = VISIBILITY.removeprefix("/apis/")
        except ApiError as exc:
            versions["visibilityAPI"] = None
            versions["visibilityError"] = str(exc)
    if _emit(versions, args.output):
        return
    lines = [["Plugin Version:", plugin]]
    if api is not None:
        lines.append(["Server Version:", versions["server"]])
        served = versions["visibilityAPI"]
        lines.append(["Visibility API:", served or f"not served ({versions['visibilityError']})"])
    _show(lines)


def _watch(api: Connection, args: argparse.Namespace) -> None:
    """`--watch`: the command's output printed again on each change (dispatcher/plugin/watch.py)."""
    import io
    from contextlib import redirect_stdout

    from dispatcher.plugin.watch import EVERY, Source, follow

    run = _COMMANDS[args.command]

    def render() -> str:
        buffer = io.StringIO()
        with redirect_stdout(buffer):
            run(api, args)
        return buffer.getvalue()

    query = _query(args) if args.command != "why" else {}
    if args.command == "list":
        sources = [Source(_appwrappers(api, args), query)]
    elif args.command == "why":
        path = f"{APPWRAPPERS}/namespaces/{api.namespace}/appwrappers"
        sources = [Source(path, {"fieldSelector": f"metadata.name={args.name}"})]
    else:
        sources = [
            Source(f"{APPWRAPPERS}/clusterappqueues", query),
            Source(_app_queues(api, args), query, optional=True),
        ]
    separator = {"json": "", "yaml": "---\n"}.get(args.output or "", "\n")
    follow(render, sources, api=api, every=EVERY, out=sys.stdout, separator=separator)


_COMMANDS = {"list": cmd_list, "why": cmd_why, "queues": cmd_queues}


def main(argv: Sequence[str] | None = None, *, version: str | None = None) -> int:
    """`kubectl aw ARGS`; `version` is the plugin's where the caller knows it (the zipapp
    is built with it), else the installed package's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, commands = _parser()
    if argv[:1] == ["__complete"]:  # kubectl's plugin completion (kubectl_complete-aw)
        from dispatcher.plugin.complete import complete

        return complete(argv[1:], commands=commands, connect=connect, out=sys.stdout)
    args = parser.parse_args(argv)
    if args.command == "completion":
        from dispatcher.plugin.complete import script

        print(script(args.shell), end="")
        return 0
    try:
        if args.command == "version":
            plugin = version or _installed_version()
            if args.client:
                cmd_version(None, args, plugin=plugin)
                return 0
        api = connect(
            kubeconfig=args.kubeconfig,
            context=args.context,
            namespace=args.namespace,
            impersonate=args.impersonate,
            groups=tuple(args.groups),
            timeout=args.request_timeout,
        )
        if args.command == "version":
            cmd_version(api, args, plugin=plugin)
        elif args.command == "stop":
            _stop_policy(api, args.queue, "HoldAndDrain" if args.drain else "Hold")
        elif args.command == "resume":
            _stop_policy(api, args.queue, "None")
        elif args.watch:
            _watch(api, args)
        else:
            _COMMANDS[args.command](api, args)
    except PluginError as exc:
        _warn(f"error: {exc}")
        return 1
    except KeyboardInterrupt:  # Ctrl-C ends a watch: no traceback
        return 130
    return 0


def _installed_version() -> str:
    import dispatcher

    return str(dispatcher.__version__)


def complete_main() -> int:
    """`kubectl_complete-aw ARGS... WORD`: what kubectl runs to complete `kubectl aw`."""
    return main(["__complete", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
