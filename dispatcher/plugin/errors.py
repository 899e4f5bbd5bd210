"""What `kubectl aw` says went wrong (dispatcher/plugin). Pure."""

from __future__ import annotations


class PluginError(Exception):
    """Said to the user in one line; the command exits non-zero."""


class ApiError(PluginError):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
