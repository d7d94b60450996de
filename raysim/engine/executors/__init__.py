"""Executors: what runs a round's jobs and evaluations. The same interface
(:class:`raysim.engine.executors.base.Executor`) and the same numbers, in process or on Ray.

- ``base``: the interface;
- ``evaluation``: what the global model must predict and how the workers' parts add up;
- ``serial``: :class:`~raysim.engine.executors.serial.SerialExecutor`, everything in this process;
- ``placement``: clients' home workers and where a round's jobs run;
- ``batching``: which jobs train together, and an algorithm's :class:`~raysim.capabilities.batching.Batching`;
- ``schedule``: the round's calls to the workers, as a pure plan;
- ``actors``: the client-worker and server actors;
- ``recovery``: the pool of client workers, and the replacement of those that die;
- ``session``: starting, joining and stopping Ray;
- ``ray_executor``: :class:`~raysim.engine.executors.ray_executor.RayExecutor`.

The executors are registered by name in :data:`raysim.registry.EXECUTORS`.
"""
