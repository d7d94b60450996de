"""Errors raysim raises for bad input.

A :class:`ConfigError` means the user asked for something that cannot run (an unknown algorithm, 0
clients, a dataset missing offline, an unreachable Ray address). The CLI turns it into one sentence on
stderr and exit status 2; everything else is a bug and keeps its traceback.
"""


class ConfigError(ValueError):
    """Bad input, found before any work starts. The message is one complete sentence."""
