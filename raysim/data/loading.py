"""A run's data, loaded in a thread beside the cluster's start, with its files found first.

Loading a dataset is finding its files (downloading them if need be) and then reading them. A run
waits for the first part before it starts Ray, so that a missing dataset is refused before any work,
and lets the second overlap Ray's start, which is mostly waiting too. A loader says
when its files are found with :func:`raysim.data.datasets.files_found`; one that never says so (a
user's own) is waited for to its end, and a generated dataset not at all.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from raysim.config import DataConfig
from raysim.data.datasets import load_dataset, on_files_found
from raysim.data.federated import FederatedData, build_federated_data


class _Found(Exception):
    """Raised by :func:`check_files`' callback to stop a loader once its files are found."""


def check_files(cfg: DataConfig) -> None:
    """Find ``cfg.dataset``'s files (downloading them where allowed) without reading them: a
    missing dataset raises its ConfigError. For a suite's driver, which loads no data itself."""
    from raysim.registry import DATASETS

    if not DATASETS.get(cfg.dataset).reads_files:
        return

    def stop() -> None:
        raise _Found

    on_files_found(stop)
    try:
        load_dataset(cfg, 0)  # a loader that never says it found its files loads them all
    except _Found:
        pass
    finally:
        on_files_found(None)


class DataLoad:
    """``build_federated_data(cfg, clients, seed)`` running in a thread of its own."""

    def __init__(self, cfg: DataConfig, clients: int, seed: int) -> None:
        self._found = threading.Event()
        self._threads = ThreadPoolExecutor(1, thread_name_prefix="raysim-data")

        def load() -> FederatedData:
            on_files_found(self._found.set)
            try:
                return build_federated_data(cfg, clients, seed)
            finally:
                on_files_found(None)

        self._future = self._threads.submit(load)
        self._future.add_done_callback(lambda _: self._found.set())  # after its result is set
        self._threads.shutdown(wait=False)

    def wait_found(self) -> None:
        """Return once the files are found (or the load has ended); raise the load's error if it
        ended in one by then (a missing dataset)."""
        self._found.wait()
        if self._future.done():
            self._future.result()

    def result(self) -> FederatedData:
        """The data, once loaded (the load's error, if it failed)."""
        return self._future.result()


__all__ = ["DataLoad", "check_files"]
