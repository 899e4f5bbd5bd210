"""How an AppWrapper's own status messages and Events name other AppWrappers. Pure, no I/O.

Whoever may read an AppWrapper (`kubectl describe`, `get -o yaml`) reads its conditions and
Events, so what the dispatcher writes there for one AppWrapper is for its own namespace's
eyes: another AppWrapper is named only when it is of the same namespace; one of another
namespace is `OTHER` (the phrase the visibility API uses for what a user may not see). How
many there are, priorities and resource figures stay. The dispatcher's logs keep every name.

An eviction message on the victim gives the preemptor's uid when it is of another namespace,
as Kueue's "Preempted to accommodate a workload (UID: ...)" does: it tells the victim's owner
nothing, and lets an administrator find the preemptor (`kubectl get aw -A -o
jsonpath=...metadata.uid`).

Every message builder names another AppWrapper through `mention` or `mention_all` when it
knows whom the message is for, or, for a text built once and read by many (a held
cluster, a StrictFIFO head), through `for_reader` when the message gets its owner.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Sequence

__all__ = [
    "KEY",
    "OTHER",
    "for_reader",
    "hide",
    "mention",
    "mention_all",
    "namespace_of",
    "recorded_preemptor",
]

OTHER = "another namespace's AppWrapper"
"""What a user reads instead of the name of an AppWrapper of a namespace not theirs."""

KEY = re.compile(
    r"(?<![\w./-])([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)/([a-z0-9](?:[-a-z0-9.]*[a-z0-9])?)(?![\w/-])"
)
"""A "namespace/name" as a message names an AppWrapper (both are DNS names; a resource such
as nvidia.com/gpu has a dot in its prefix and is no key)."""


def namespace_of(key: str) -> str:
    """The namespace of "namespace/name" (a bare namespace is its own)."""
    return key.partition("/")[0]


def mention(key: str, *, to: str, uid: str = "") -> str:
    """AppWrapper `key` as a message for `to` (a key or a namespace) names it: itself when
    both are of one namespace, else `OTHER`, with its `uid` when one is given."""
    if namespace_of(key) == namespace_of(to):
        return key
    return f"{OTHER} (UID: {uid})" if uid else OTHER


def recorded_preemptor(preemptor: str, *, uid: str, victim: str) -> str:
    """What a victim's `status.preemptedBy` holds: the preemptor's key when both are of one
    namespace, else its uid (what the dispatcher needs to find it again; nothing a tenant
    can read a name from). Without a uid (never seen), its key: a claim lost is an
    eviction too many, worse than a name shown."""
    if namespace_of(preemptor) == namespace_of(victim) or not uid:
        return preemptor
    return uid


def mention_all(keys: Sequence[str], *, to: str) -> str:
    """Several AppWrappers, for `to`: those of its namespace by name (in order), then how
    many of other namespaces ("a/x, a/y and 2 AppWrappers of other namespaces")."""
    own = namespace_of(to)
    named = [k for k in keys if namespace_of(k) == own]
    others = len(keys) - len(named)
    if others == 1:
        named.append(OTHER)
    elif others:
        named.append(f"{others} AppWrappers of other namespaces")
    if len(named) > 1 and others:
        return f"{', '.join(named[:-1])} and {named[-1]}"
    return ", ".join(named)


def hide(text: str, *, known: Callable[[str], bool], visible: Container[str]) -> str:
    """`text` with each AppWrapper key it names (`known` tells one from any other "a/b")
    whose namespace is not in `visible` replaced by `OTHER`."""
    return KEY.sub(lambda m: m[0] if m[1] in visible or not known(m[0]) else OTHER, text)


def for_reader(text: str, *, to: str, named: Container[str]) -> str:
    """A text built once and read by many (`named`: the AppWrappers it may name), as the
    message of `to` says it."""
    return hide(text, known=named.__contains__, visible=(namespace_of(to),))
