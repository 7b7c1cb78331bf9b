"""Sandbox errors."""

from __future__ import annotations


class SandboxUnavailableError(RuntimeError):
    """The requested isolation cannot be provided on this machine (the message says why and
    what to install or configure). Raised before any program runs, never after."""
