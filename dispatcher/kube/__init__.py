"""Everything that talks to an API server: client, watch caches, events, leases."""
