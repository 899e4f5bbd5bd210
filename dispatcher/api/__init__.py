"""The AppWrapper API: pydantic models, quantities and resource arithmetic. Pure, no I/O."""
