"""Per-cluster capacity accounting fed by watch events. No I/O of its own."""
