"""Each member cluster's free room kept from one cycle to the next. Pure, no I/O.

Building a `ClusterRoom` charges every reservation (the pods of dispatched AppWrappers
not bound yet) node by node: with about 900 reservations on 3 x 1,000 nodes that is some
25 ms a cycle, whatever is pending. `KeptRooms` keeps each cluster's state of the last
snapshot and brings it to the next one by what differs between the two: a reservation gone
(or changed) is given back where it was charged, a new one is charged, a node whose bound
pods changed (`requested`) has the difference applied. Any other change to the nodes (one
added or removed, labels, taints, readiness, allocatable) builds the state afresh. Each
cycle places on a copy (`ClusterRoom.copy`), so the kept state stays the snapshot's.

Kept, a reservation stays on the nodes it was charged to when an older one goes; built
afresh, the later ones could land elsewhere. Both are guesses at where kube-scheduler will
bind those pods, and the aggregate is the same either way. Preemption confirms its victims
on a state built afresh (`preemption._Afresh`), which gives the victims' room to the
preemptor no more readily than the kept state does.
"""

from __future__ import annotations

from collections.abc import Sequence

from dispatcher.core.model import ClusterSnapshot, NodeSnapshot, Reservation
from dispatcher.core.scheduling.placement import ClusterRoom

__all__ = ["KeptRooms"]

REBUILD_AFTER = 500
"""A kept state is built afresh after this many cycles brought it up to date: what it
remembers by gang shape (and the copies add to) then starts again instead of growing with
every shape ever seen; one build in 500 cycles costs each about 0.05 ms."""


class KeptRooms:
    """Per cluster, the `ClusterRoom` of its last snapshot."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[ClusterSnapshot, ClusterRoom, int]] = {}
        self.built = 0  # states built afresh: the rest were brought up to date

    def state(self, snapshot: ClusterSnapshot) -> ClusterRoom:
        """A state of `snapshot` for the caller to place on."""
        kept = self._kept.get(snapshot.name)
        if kept is not None and kept[0] is snapshot:
            return kept[1].copy()
        if kept is not None and kept[2] < REBUILD_AFTER and _follow(kept[1], kept[0], snapshot):
            state, follows = kept[1], kept[2] + 1
            state.snapshot = snapshot
        else:
            state, follows = ClusterRoom(snapshot), 0
            self.built += 1
        self._kept[snapshot.name] = (snapshot, state, follows)
        return state.copy()

    def keep_only(self, names: Sequence[str]) -> None:
        """Forget the clusters not named (members that left)."""
        for name in set(self._kept) - set(names):
            del self._kept[name]


def _follow(state: ClusterRoom, old: ClusterSnapshot, new: ClusterSnapshot) -> bool:
    """Bring `state` (of `old`) to `new`; False, with `state` untouched, when it must be
    built afresh."""
    moved = _requested_moves(old.nodes, new.nodes)
    if moved is None:
        return False
    before, after = _by_key(old.reservations), _by_key(new.reservations)
    if before is None or after is None:
        return False  # a key twice: charged twice, not one by one
    for key, reservation in before.items():
        now = after.get(key)
        if now is None or (now is not reservation and now != reservation):
            state.release(key)
    for old_node, new_node in moved:
        taken: dict[str, int] = {}
        for resource in set(old_node.requested) | set(new_node.requested):
            change = new_node.requested.get(resource, 0) - old_node.requested.get(resource, 0)
            if change:
                taken[resource] = -change
        state.give_back({state.index[new_node.name]: taken}, taken)
    if moved:
        state.nodes = [n for n in new.nodes if n.schedulable]
    added = [r for key, r in after.items() if key not in state.reserved]
    for reservation in sorted(added, key=lambda r: (r.dispatched_at, r.key)):
        state.reserve(reservation)
    return True


def _requested_moves(
    old: tuple[NodeSnapshot, ...], new: tuple[NodeSnapshot, ...]
) -> list[tuple[NodeSnapshot, NodeSnapshot]] | None:
    """The schedulable nodes whose bound pods changed, or None when anything else about
    the nodes did."""
    if old is new:
        return []
    if len(old) != len(new):
        return None
    moved = []
    for a, b in zip(old, new, strict=True):
        if a is b:
            continue
        if (
            a.name != b.name
            or a.ready != b.ready
            or a.unschedulable != b.unschedulable
            or (a.allocatable is not b.allocatable and a.allocatable != b.allocatable)
            or (a.labels is not b.labels and a.labels != b.labels)
            or a.taints != b.taints
        ):
            return None
        if b.schedulable and a.requested is not b.requested and a.requested != b.requested:
            moved.append((a, b))
    return moved


def _by_key(reservations: tuple[Reservation, ...]) -> dict[str, Reservation] | None:
    keyed = {r.key: r for r in reservations}
    return keyed if len(keyed) == len(reservations) else None
