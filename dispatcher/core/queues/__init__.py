"""Pending work kept in order between cycles. Pure, no I/O.

`manager.QueueManager` holds the pending workloads per line (ClusterAppQueue, or "" for
capacity-only work) in order, and parks those that cannot be admitted until an event;
`taking.take` runs one scheduling cycle over the active ones and parks what it refused.
"""

from dispatcher.core.queues.manager import QueueManager, Wake, order_key
from dispatcher.core.queues.taking import take

__all__ = ["QueueManager", "Wake", "order_key", "take"]
