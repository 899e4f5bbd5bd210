"""Which hub namespaces a member's `"*"` mapping key takes. Pure, no I/O.

`"*"` trusts namespace names across clusters: whoever owns a hub namespace named like one
that exists only in a member (`gpu-operator`, `istio-system`) would land pods there. So a
`"*"` key takes a namespace only when the operator's `wildcard_allowed` patterns name it
(all, when none are given) and no `wildcard_reserved` pattern does; the control plane's own
namespaces (`SYSTEM_NAMESPACES`) are never taken by `"*"`, whatever the settings. An entry
that names the namespace itself is the operator's explicit choice and is not checked here.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

__all__ = ["SYSTEM_NAMESPACES", "Wildcard"]

SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")
"""Never taken by `"*"`: what runs there has the cluster's own rights."""


@dataclass(frozen=True, slots=True)
class Wildcard:
    """The namespaces a `"*"` key may take: glob patterns (`fnmatch`, case-sensitive)."""

    allowed: tuple[str, ...] = ()
    """Empty: any namespace that is not reserved."""
    reserved: tuple[str, ...] = ()

    def refusal(self, namespace: str) -> str:
        """Why `"*"` does not take hub namespace `namespace` ("" when it does)."""
        if namespace in SYSTEM_NAMESPACES:
            return f'"*" never takes {namespace} (a Kubernetes system namespace)'
        reserved = next((p for p in self.reserved if fnmatchcase(namespace, p)), None)
        if reserved is not None:
            return f'"*" does not take it: reserved by {reserved!r} (members[].wildcard_reserved)'
        if self.allowed and not any(fnmatchcase(namespace, p) for p in self.allowed):
            return '"*" takes only the namespaces members[].wildcard_allowed names'
        return ""

    def takes(self, namespace: str) -> bool:
        return not self.refusal(namespace)
