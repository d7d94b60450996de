"""The commands: thin layers over the Python API (:mod:`raysim.api`) that parse text.

- ``run``: ``python scripts/run.py`` / ``raysim run``, one experiment;
- ``sweep``: ``python scripts/sweep.py`` / ``raysim sweep``, a suite on Ray Tune;
- ``report``: ``raysim report``, plots and tables of run or suite directories;
- ``partition``: ``raysim partition``, a partition's picture without training;
- ``console``: the ``raysim`` command, which dispatches to the others;
- ``flags``: the flag parser and ``--set`` handling they share.
"""
