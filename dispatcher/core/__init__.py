"""The scheduling core. PURE: no I/O, no asyncio, no clock reads (time comes in as a value)."""
