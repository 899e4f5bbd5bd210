"""Test support: local control planes and waiting helpers. Not used by the dispatcher itself."""
