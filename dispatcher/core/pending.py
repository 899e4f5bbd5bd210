"""Whether a pending AppWrapper is `active` or `inadmissible` (the `status` label of the
pending-work metrics, as Kueue's `pending_workloads{status}` splits them).

- inadmissible: it waits for something only a change from outside cures: its queue's quota
  (QuotaExceeded), a queue that is missing, stopped or inactive (QueueNotReady), or a
  placement (clusterScheduling) that no member cluster matches. Room freed by other work
  does not admit it by itself; an administrator, or the user, has to act.
- active: it could be taken as soon as room frees (InsufficientResources, waiting behind
  the head of its line), or no cycle has judged it yet.
"""

from __future__ import annotations

from enum import StrEnum

from dispatcher.api.models import Reason


class PendingStatus(StrEnum):
    ACTIVE = "active"
    INADMISSIBLE = "inadmissible"


INADMISSIBLE_REASONS = frozenset({Reason.QUOTA_EXCEEDED, Reason.QUEUE_NOT_READY})
NO_CLUSTER_MATCHES = "no member cluster matches the placement"
"""How the cycle's message begins when the placement names no member cluster it knows
(core/scheduling/clusters.py): capacity alone never admits such an AppWrapper."""


def pending_status(reason: Reason | None, message: str = "") -> PendingStatus:
    """`reason` and `message` of the last wait the scheduler gave it (None: not judged yet)."""
    if reason in INADMISSIBLE_REASONS or NO_CLUSTER_MATCHES in message:
        return PendingStatus.INADMISSIBLE
    return PendingStatus.ACTIVE
