"""`--watch` of `kubectl aw`: the view printed again each time it changes, as `kubectl get
-w` prints on change, until Ctrl-C.

What wakes it: a watch of each listed collection (one thread each, on a connection of its
own, from the resourceVersion of a one-item list, with bookmarks; a 410 Gone or an ended
stream starts again from a new list), and every `every` seconds without an event (positions,
estimates and pending counts come from the visibility API, which a watch does not follow).
A burst of events is one render (`SETTLE` seconds after the first); a render equal to the last
one printed prints nothing. Only imported with `--watch`: `threading` and `queue` cost every
other command nothing.

Side effects: requests to the API server (reads and watches); prints to `out`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import TextIO

from dispatcher.plugin.errors import ApiError, PluginError
from dispatcher.plugin.kubeconfig import Connection

SETTLE = 0.2
"""Seconds a first event waits for the rest of its burst (a dispatch changes many objects)."""
WATCH_SECONDS = 300
"""How long the server keeps one watch open (`timeoutSeconds`); it is then started again."""


EVERY = 10.0
"""Seconds without an event after which the view is rendered again anyway."""


class Source:
    """A collection whose changes wake the view: its path and query (a selector). An
    `optional` one that the user may not watch is not watched (`queues` shows the cluster's
    queues to a user who may not list AppQueues everywhere)."""

    def __init__(
        self, path: str, query: dict[str, str] | None = None, *, optional: bool = False
    ) -> None:
        self.path = path
        self.optional = optional
        self.query = query or {}


def follow(
    render: Callable[[], str],
    sources: Sequence[Source],
    *,
    api: Connection,
    every: float,
    out: TextIO,
    separator: str = "\n",
) -> None:
    """Print `render()`, then again on each change, forever (the caller's Ctrl-C ends it).
    A failure of a watch ends it too, as PluginError."""
    wakes: queue.Queue[PluginError | None] = queue.Queue()
    for source in sources:
        threading.Thread(
            target=_pump, args=(api.clone(), source, wakes), daemon=True, name=source.path
        ).start()
    shown: str | None = None
    while True:
        text = render()
        if text != shown:
            out.write(text if shown is None else separator + text)
            out.flush()
            shown = text
        try:
            first = wakes.get(timeout=every)
        except queue.Empty:
            continue
        _raise(first)
        try:
            _raise(wakes.get(timeout=SETTLE))
            while True:
                _raise(wakes.get_nowait())
        except queue.Empty:
            pass


def _raise(wake: PluginError | None) -> None:
    if wake is not None:
        raise wake


def _pump(api: Connection, source: Source, wakes: queue.Queue[PluginError | None]) -> None:
    """Runs in its own thread: puts None on `wakes` for each change of the collection, or
    the error that ends the watch."""
    try:
        while True:
            listed = api.get(source.path, limit="1", **source.query)
            version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
            for event in api.watch(
                source.path,
                idle_timeout=WATCH_SECONDS + 60,
                resourceVersion=version,
                allowWatchBookmarks="true",
                timeoutSeconds=str(WATCH_SECONDS),
                **source.query,
            ):
                kind = event.get("type")
                if kind == "ERROR":
                    status = event.get("object") or {}
                    if status.get("code") == 410:  # too old: list again, then watch from there
                        break
                    raise ApiError(int(status.get("code") or 500), str(status.get("message")))
                if kind != "BOOKMARK":
                    wakes.put(None)
            wakes.put(None)  # a relist may have missed changes: render once more
    except ApiError as exc:
        if not (source.optional and exc.code in (401, 403, 404)):
            wakes.put(exc)
    except PluginError as exc:
        wakes.put(exc)
