"""Errors raysim raises for bad input.

A :class:`ConfigError` means the user asked for something that cannot run (an unknown algorithm, 0
clients, a dataset missing offline, an unreachable Ray address). The CLI turns it into one sentence on
stderr and exit status 2. A :class:`RunAborted` means the run could not go on (its server actor died,
its Ray cluster went away); the CLI says so in one message, naming the checkpoint to resume from, and
exits with status 1. Everything else is a bug and keeps its traceback.
"""


class ConfigError(ValueError):
    """Bad input, found before any work starts. The message is one complete sentence."""


class RunAborted(RuntimeError):
    """The run cannot go on (a dead server actor, a lost cluster). The message is complete and says
    how to resume."""
