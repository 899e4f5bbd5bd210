"""One member cluster: its connection, watch caches, liveness and capacity accounting."""
