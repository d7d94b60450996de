"""The engine: the one round loop and what runs it.

- ``experiment``: settings to a checked :class:`~raysim.engine.experiment.Experiment` (the config
  and its algorithm, looked up once in the driver);
- ``hooks``: what the engine asks of an algorithm (a typing protocol);
- ``runner``: the round loop, checkpoints, evaluation and callbacks;
- ``server`` and ``client``: the server host and a worker's client runtime;
- ``executors``: serial and Ray, the same numbers.

The engine imports the toolkit, the capabilities and the results packages, never ``algorithms/``.
"""
