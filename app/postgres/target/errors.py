"""The exceptions of the target controller (app/postgres/target/): what failed on the target.

Not to be confused with app/postgres/errors.py, which decides how much of a server's
error text reaches an API caller.
"""

from __future__ import annotations


class TargetError(Exception):
    """Base of target failures; messages never contain a password."""


class ConnectError(TargetError):
    """The target does not accept our connection (message from the driver, password masked)."""


class PrivilegeError(TargetError):
    """The target's user lacks a privilege knobtune needs; the message names it."""


class ApplyError(TargetError):
    """A config was rejected or did not take effect; previous entries were restored."""


class RestartUnavailable(TargetError):
    """A knob needs a restart and the target has no restart method; nothing was changed."""
