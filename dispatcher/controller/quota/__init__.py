"""The quota objects (ours and Kueue's): their caches, the quota tree, their status."""
