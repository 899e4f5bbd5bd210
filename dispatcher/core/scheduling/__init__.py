"""The scheduling core: one cycle's decisions from pending workloads and cluster snapshots.

Pure, no I/O. `schedule` orders the queue and decides, for every pending workload, admit
(where) or wait (why), maybe preempting (`decisions`: what it returns). `placement` fits a
gang into one cluster (nodes ranked by `nodeorder`), `kept` keeps each cluster's state from
one cycle to the next, `evictions` tries evicting AppWrappers on a cluster's state,
`preemption` chooses victims, `reservation` reserves nodes for a head and fences them.
"""

from dispatcher.core.scheduling.cycle import queue_order_key, schedule
from dispatcher.core.scheduling.decisions import Admit, CycleResult, Preempt, Wait
from dispatcher.core.scheduling.preemption import (
    HonourClaims,
    LowestPriorityFirst,
    PreemptionPolicy,
    PreemptorClaim,
)

__all__ = [
    "Admit",
    "CycleResult",
    "HonourClaims",
    "LowestPriorityFirst",
    "Preempt",
    "PreemptionPolicy",
    "PreemptorClaim",
    "Wait",
    "queue_order_key",
    "schedule",
]
