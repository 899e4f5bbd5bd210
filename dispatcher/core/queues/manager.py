"""Pending work held per line, in order, updated on events. Pure, no I/O.

A *line* is where a pending workload waits its turn: its ClusterAppQueue's name, or ""
for work with no queue (capacity only). Each line keeps its workloads sorted by
`order_key` (rule 3: priority, then age, then key), so the order a cycle takes them in is
kept, not re-sorted, and the first k of a line cost O(k) (`in_line`, for the pending list).

Work that cannot be admitted until something changes is *parked* (Kueue's inadmissible
set): it is left out of the cycles' `active` list until an event that can change its answer
wakes it again:

- capacity freed (`capacity_freed`: a dispatched AppWrapper finished, was requeued or
  evicted, its pods went, a node was added or changed, a cluster stopped being held);
- quota released in a cohort tree (`quota_released`, by the tree's root);
- its line changed (`line_changed`: a queue's spec, or the setup, changed);
- time: one that waits longer than the starvation guard's limit holds clusters every
  cycle, so it is woken when it crosses it (`wake_starving`);
- its line's head gone (admitted, deleted): the next of the line is the head now, which a
  cycle says (`remove`).

Parked work is kept in *buckets* of one line and one gang shape (and placement): workloads
that ask the same question get the same answer, so an event wakes the first of each bucket
only; when that one is admitted, the next of its bucket is woken for the next cycle
(`admitted`). In a StrictFIFO line everything behind a blocking head is parked behind it
and woken when it goes (`blocked`); the head itself is parked by its own question and keeps
blocking while it is; woken to be tried again, it takes the first `LOOKAHEAD` behind it
along (if it is admitted they are next in the same cycle).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from itertools import islice

from sortedcontainers import SortedList

from dispatcher.core.model import Workload

__all__ = ["Line", "QueueManager", "Wake", "order_key"]

OrderKey = tuple[int, float, str]
LOOKAHEAD = 4
"""A StrictFIFO head woken to be tried again takes this many of those behind it along."""


def order_key(workload: Workload) -> OrderKey:
    """Rule 3: higher priority first, then older (created_at), then key."""
    return (-workload.priority, workload.created_at, workload.key)


class Wake(Enum):
    """The kind of event that may change a parked workload's answer."""

    CAPACITY = "capacity"  # refused by capacity: woken when room is freed
    QUOTA = "quota"  # refused by its queue's quota: woken when its cohort tree releases some
    LINE = "line"  # its queue is unusable: woken when a queue changes


@dataclass(slots=True)
class Line:
    """One line's workloads: all of them in order (active and parked), and its buckets."""

    name: str
    keys: SortedList = field(default_factory=SortedList)  # of OrderKey
    buckets: dict[tuple[object, ...], SortedList] = field(default_factory=dict)
    """(wake, shape, placement) -> the parked workloads of that question, in order."""
    behind: str = ""
    """StrictFIFO: the blocked head everything after it waits behind ("" if none)."""
    lookahead: list[OrderKey] = field(default_factory=list)
    """Those behind it woken with it, to be parked behind it again if it still blocks."""


@dataclass(frozen=True, slots=True)
class _Parked:
    line: str
    bucket: tuple[object, ...]  # () when parked behind a StrictFIFO head
    root: str  # the cohort tree's root, for quota-parked work


class QueueManager:
    """The pending workloads per line, which of them the next cycle takes, and which wait
    parked for an event. Mutated by events; `active` is the next cycle's input."""

    def __init__(self) -> None:
        self._lines: dict[str, Line] = {}
        self._workloads: dict[str, Workload] = {}
        self._line_of: dict[str, str] = {}
        self._active = SortedList()  # OrderKeys of the work cycles take, across lines
        self._parked: dict[str, _Parked] = {}
        self._starving: list[tuple[float, str]] = []  # heap of (queued_since, key), parked
        self.changes = 0
        """Counts the workloads' arrivals, changes and departures (who is pending)."""

    # -- events --------------------------------------------------------------------------

    def upsert(self, workload: Workload, line: str) -> None:
        """A workload is pending (new, or changed: its answer may change, so it is active)."""
        if workload.key in self._workloads:
            self.remove(workload.key, changing=True)
        self._workloads[workload.key] = workload
        self.changes += 1
        self._line_of[workload.key] = line
        target = self._lines.get(line)
        if target is None:
            target = self._lines[line] = Line(line)
        key = order_key(workload)
        target.keys.add(key)
        head = target.behind
        if head and key > order_key(self._workloads[head]):
            self._parked[workload.key] = _Parked(line, (), "")
        else:
            self._active.add(key)

    def remove(self, key: str, *, changing: bool = False) -> Workload | None:
        """A workload is no longer pending (admitted, deleted, no longer queued). When it
        was its line's head, the next of the line is woken, whatever its question: it is
        the head now, which a cycle says (`HeadOfLine`). `changing`: it comes back at once
        (`upsert`), so nothing is woken."""
        workload = self._workloads.pop(key, None)
        if workload is None:
            return None
        self.changes += 1
        name = self._line_of.pop(key)
        line = self._lines[name]
        okey = order_key(workload)
        was_first = line.keys[0] == okey
        line.keys.discard(okey)
        parked = self._parked.pop(key, None)
        if parked is None:
            self._active.discard(okey)
        elif parked.bucket:
            line.buckets[parked.bucket].discard(okey)
            if not line.buckets[parked.bucket]:
                del line.buckets[parked.bucket]
        if line.behind == key:
            self._unblock(line)
        if not line.keys:
            del self._lines[name]
        elif was_first and not changing:
            self._wake_if_asking(line.keys[0][2])
        return workload

    def park(self, key: str, wake: Wake, *, root: str = "", starving: bool = False) -> None:
        """`key` cannot be admitted until an event of kind `wake` (quota: in tree `root`).
        `starving`: it is past the starvation guard's limit already, so crossing it is not
        an event that wakes it (`wake_starving`)."""
        workload = self._workloads.get(key)
        if workload is None or key in self._parked:
            return
        name = self._line_of[key]
        line = self._lines[name]
        placement = None if workload.placement.anywhere else workload.placement
        bucket = (wake, root, workload.shape, placement)
        okey = order_key(workload)
        self._active.discard(okey)
        line.buckets.setdefault(bucket, SortedList()).add(okey)
        self._parked[key] = _Parked(name, bucket, root)
        if not starving:
            heapq.heappush(self._starving, (workload.queued_since, key))

    def blocked(self, head: str) -> None:
        """StrictFIFO: `head` blocks its line; park everything after it until it goes."""
        name = self._line_of.get(head)
        if name is None:
            return
        line = self._lines[name]
        okey_head = order_key(self._workloads[head])
        if line.behind == head:
            for okey in line.lookahead:  # it was tried again and still blocks
                if okey[2] in self._workloads and okey[2] not in self._parked:
                    self._active.discard(okey)
                    self._parked[okey[2]] = _Parked(name, (), "")
            line.lookahead = []
            return
        if line.behind and order_key(self._workloads[line.behind]) < okey_head:
            return  # an earlier head blocks it already
        line.behind = head
        line.lookahead = []
        for okey in line.keys.irange(okey_head, inclusive=(False, True)):
            if okey[2] not in self._parked:
                self._active.discard(okey)
                self._parked[okey[2]] = _Parked(name, (), "")

    def admitted(self, key: str, *, preemption: bool = False) -> None:
        """`key` was admitted: it leaves, and the next of its question is woken. With
        `preemption`, the first of every question is woken: what was just admitted may be
        a victim for any of them (a lower priority, or a queue that borrows)."""
        workload = self._workloads.get(key)
        if workload is None:
            return
        placement = None if workload.placement.anywhere else workload.placement
        line = self._lines[self._line_of[key]]
        self.remove(key)
        if preemption:
            self._wake(lambda bucket: bucket[0] is not Wake.LINE)
            return
        for bucket in list(line.buckets):
            if bucket[2] == workload.shape and bucket[3] == placement:
                self._wake_first(line, bucket)

    def capacity_freed(self) -> bool:
        """Room was freed somewhere: wake the first of every capacity-parked question;
        whether any was."""
        return self._wake(lambda bucket: bucket[0] is Wake.CAPACITY)

    def quota_released(self, root: str) -> None:
        """Quota was given back in the cohort tree rooted at `root`: wake its quota-parked
        questions, and its capacity-parked ones (with more quota a workload may get a
        flavor whose nodes have room)."""
        self._wake(lambda bucket: bucket[0] is not Wake.LINE and bucket[1] == root)

    def line_changed(self) -> None:
        """A queue changed: wake everything parked (its answers may all change)."""
        for line in self._lines.values():
            if line.behind:
                self._unblock(line)
            for bucket in list(line.buckets):
                while bucket in line.buckets:
                    self._wake_first(line, bucket)

    def wake_starving(self, before: float) -> None:
        """Wake parked workloads queued since before `before`: the starvation guard makes
        them hold clusters, which only a cycle that tries them does."""
        heap = self._starving
        while heap and heap[0][0] < before:
            _, key = heapq.heappop(heap)
            self._wake_if_asking(key)

    # -- reads ---------------------------------------------------------------------------

    def active(self, per_line: int | None = None, limit: int | None = None) -> list[Workload]:
        """The workloads the next cycle decides about, in order (not parked). With
        `per_line`, at most that many of each line (the first ones): the rest wait for a
        later cycle, so that a cycle costs what its lines' heads cost (Kueue's heads). With
        `limit`, at most that many in all (the first ones)."""
        workloads = self._workloads
        if per_line is None:
            return [workloads[okey[2]] for okey in islice(self._active, limit)]
        taken: dict[str, int] = {}
        line_of = self._line_of
        found: list[Workload] = []
        for okey in self._active:
            if limit is not None and len(found) >= limit:
                break
            key = okey[2]
            line = line_of[key]
            count = taken.get(line, 0)
            if count < per_line:
                taken[line] = count + 1
                found.append(workloads[key])
        return found

    def in_line(self, line: str, limit: int | None = None) -> Iterator[Workload]:
        """The line's pending workloads (active and parked) in the order the scheduler
        takes them; the first `limit` cost O(limit)."""
        found = self._lines.get(line)
        if found is None:
            return iter(())
        workloads = self._workloads
        return (workloads[okey[2]] for okey in islice(found.keys, limit))

    def workload(self, key: str) -> Workload | None:
        return self._workloads.get(key)

    def workloads(self) -> Mapping[str, Workload]:
        """Every pending workload (active and parked), by key (read-only)."""
        return self._workloads

    def line_of(self, key: str) -> str | None:
        return self._line_of.get(key)

    def lines(self) -> list[str]:
        return list(self._lines)

    def is_first(self, key: str) -> bool:
        """Whether `key` is the first of its line: no pending workload, active or parked,
        goes before it (the head of its queue)."""
        name = self._line_of.get(key)
        return name is not None and self._lines[name].keys[0][2] == key

    def is_parked(self, key: str) -> bool:
        return key in self._parked

    def __len__(self) -> int:
        return len(self._workloads)

    def __contains__(self, key: object) -> bool:
        return key in self._workloads

    # -- inside --------------------------------------------------------------------------

    def _wake(self, test: Callable[[tuple[object, ...]], bool]) -> bool:
        woken = False
        for line in self._lines.values():
            for bucket in [b for b in line.buckets if test(b)]:
                self._wake_first(line, bucket)
                woken = True
        return woken

    def _wake_first(self, line: Line, bucket: tuple[object, ...]) -> None:
        keys = line.buckets[bucket]
        self._wake_key(keys[0][2])

    def _wake_if_asking(self, key: str) -> None:
        """Wake `key` if it is parked by its own question (one parked behind a StrictFIFO
        head waits for that head to go)."""
        parked = self._parked.get(key)
        if parked is not None and parked.bucket:
            self._wake_key(key)

    def _wake_key(self, key: str) -> None:
        parked = self._parked.pop(key)
        okey = order_key(self._workloads[key])
        line = self._lines[parked.line]
        if parked.bucket:
            keys = line.buckets[parked.bucket]
            keys.discard(okey)
            if not keys:
                del line.buckets[parked.bucket]
        if line.behind and okey > order_key(self._workloads[line.behind]):
            # A StrictFIFO head blocks it now: it waits for that head to go.
            self._parked[key] = _Parked(parked.line, (), "")
            return
        self._active.add(okey)
        if line.behind == key:
            # The head is tried again: if it is admitted, those behind it are next in the
            # same cycle (as a cycle over all of them would take them), the first LOOKAHEAD
            # of them (the rest in the next cycle); if not, they are parked behind it again.
            for behind in line.keys.irange(okey, inclusive=(False, True)):
                if len(line.lookahead) >= LOOKAHEAD:
                    break
                parked_behind = self._parked.get(behind[2])
                if parked_behind is not None and not parked_behind.bucket:
                    del self._parked[behind[2]]
                    self._active.add(behind)
                    line.lookahead.append(behind)

    def _unblock(self, line: Line) -> None:
        line.behind = ""
        line.lookahead = []
        for okey in line.keys:
            parked = self._parked.get(okey[2])
            if parked is not None and not parked.bucket:
                del self._parked[okey[2]]
                self._active.add(okey)
