"""What a run leaves behind, written by callbacks on the runner's loop, and the callbacks' protocol.

A callback (:class:`Callback`, :class:`BaseCallback`) is told of the run's start, each round, each
evaluation, each picture and the end; a hook may reply (:class:`Reply`) metrics for the round's row
(or the summary), pictures, and a request to stop the run after the round. :class:`Callbacks` tells
them in order and gathers their replies.

In the run directory: ``config.yaml`` (the resolved config), ``metrics.parquet`` (a row per evaluated
round, with the compute so far), ``clients.parquet`` (a row per client per evaluated round),
``summary.json`` (final, best and last-k mean metrics, and the compute spent) and ``tb/``
(TensorBoard scalars per round: accuracies, loss, round time, bytes down and up, samples trained, and
the algorithm's own scalars).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from raysim.config import ExperimentConfig, dump_yaml
from raysim.errors import ConfigError
from raysim.files import replaced_atomically
from raysim.records import RoundStats

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reply:
    """What a callback's hook may return; None is an empty reply (nothing to add, no stop).

    ``metrics``: from ``on_round`` and ``on_eval``, columns added to the round's row (the row of
    metrics.parquet, TensorBoard's scalars, the trackers' metrics) before the callbacks after this
    one see it, where the round is evaluated (a round's row exists only then); from ``on_end``,
    entries added to the summary (summary.json). A name the row (or summary) has already is
    refused. ``stop``: the run ends after this round, cleanly: its summary is written (from
    ``on_end`` it means nothing). ``images``: pictures the run made, ``tag -> (H, W) or (H, W, 3)
    uint8``, given to every callback's ``on_image`` at this round."""

    metrics: Mapping[str, Any] = field(default_factory=dict)
    stop: bool = False
    images: Mapping[str, np.ndarray] = field(default_factory=dict)


class Callback(Protocol):
    """What the round loop tells (:mod:`raysim.engine.runner`), in the order of the run's list of
    callbacks: ``on_start`` once the run directory is there; after every round's training
    ``on_round`` and, if the round is evaluated, ``on_eval`` with its row;
    ``on_image`` for each picture a callback made; ``on_end`` with the summary. A hook returns
    None or a :class:`Reply`. Derive a callback from :class:`BaseCallback`, which has every hook."""

    def on_start(self, cfg: ExperimentConfig, run_dir: Path) -> Reply | None: ...

    def on_round(self, stats: RoundStats, round_time: float) -> Reply | None: ...

    def on_eval(self, rnd: int, row: dict[str, Any], clients: list[dict[str, Any]]) -> Reply | None: ...

    def on_image(self, tag: str, image: np.ndarray, rnd: int) -> Reply | None: ...

    def on_end(self, summary: dict[str, Any]) -> Reply | None: ...


class BaseCallback:
    """Every hook of :class:`Callback`, each doing nothing."""

    #: told after the run's writers (the tables, TensorBoard, the trackers) rather than before
    #: them: a callback that hands each row on and may not return from it (Ray Tune's report,
    #: where a scheduler stops the trial), so that the row is written first; the metrics it replies
    #: are then in no table
    told_after_writers: ClassVar[bool] = False

    def on_start(self, cfg: ExperimentConfig, run_dir: Path) -> Reply | None:
        return None

    def on_round(self, stats: RoundStats, round_time: float) -> Reply | None:
        return None

    def on_eval(self, rnd: int, row: dict[str, Any], clients: list[dict[str, Any]]) -> Reply | None:
        return None

    def on_image(self, tag: str, image: np.ndarray, rnd: int) -> Reply | None:
        return None

    def on_end(self, summary: dict[str, Any]) -> Reply | None:
        return None


HOOKS = ("on_start", "on_round", "on_eval", "on_image", "on_end")


class Callbacks:
    """A run's callbacks, told in order, each hook's replies gathered: what the round loop calls.
    Every callback is checked to have every hook before the run starts."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        for cb in callbacks:
            missing = [h for h in HOOKS if not callable(getattr(cb, h, None))]
            if missing:
                raise ConfigError(
                    f"The callback {_named(cb)} has no {missing[0]} hook; derive it from "
                    "raysim.results.output.BaseCallback, which has every hook."
                )
        self.callbacks = list(callbacks)
        self.stop = False  # a callback asked the run to stop after the current round
        self.pending: dict[str, Any] = {}  # the metrics replied at the round's on_round

    def start(self, cfg: ExperimentConfig, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        for cb in self.callbacks:
            self._take(cb, "on_start", cb.on_start(cfg, run_dir), {}, 0)

    def round(self, stats: RoundStats, round_time: float) -> None:
        """``on_round``; the metrics replied are kept for the round's row (if it is evaluated)."""
        self.pending = {}
        for cb in self.callbacks:
            self._take(cb, "on_round", cb.on_round(stats, round_time), self.pending, stats.rnd)

    def eval(self, rnd: int, row: dict[str, Any], clients: list[dict[str, Any]]) -> None:
        """``on_eval``, the metrics replied at ``on_round`` joined to ``row`` first."""
        for name, value in self.pending.items():
            if name in row:
                raise ConfigError(f"A callback's on_round replied a metric {name!r} that is already there.")
            row[name] = value
        for cb in self.callbacks:
            self._take(cb, "on_eval", cb.on_eval(rnd, row, clients), row, rnd)

    def end(self, summary: dict[str, Any]) -> None:
        for cb in self.callbacks:
            self._take(cb, "on_end", cb.on_end(summary), summary, summary.get("rounds", 0))

    def _take(self, cb: Callback, hook: str, reply: Reply | None, into: dict[str, Any] | None, rnd: int) -> None:
        if reply is None:
            return
        if not isinstance(reply, Reply):
            raise ConfigError(
                f"The callback {_named(cb)}'s {hook} returned {reply!r}; a hook returns None or a "
                "raysim.results.output.Reply."
            )
        for name, value in reply.metrics.items():
            if into is None:
                continue  # a round without a row: nothing is written for it
            if not isinstance(name, str) or not name or name in into:
                taken = "is already there" if name in into else "is not a name"
                raise ConfigError(f"The callback {_named(cb)}'s {hook} replied a metric {name!r} that {taken}.")
            into[name] = value
        self.stop = self.stop or (reply.stop and hook != "on_end")
        for tag, image in reply.images.items():
            for other in self.callbacks:
                self._take(other, "on_image", other.on_image(tag, image, rnd), None, rnd)


def _named(cb: object) -> str:
    return type(cb).__qualname__


def default_run_dir(cfg: ExperimentConfig) -> Path:
    """``output.out`` where it is set (the user's own folder, or a resumed run's); otherwise a new
    directory ``runs/<algo>-<dataset>-<time>``, claimed by :func:`claim_run_dir`."""
    if cfg.output.out:
        return Path(cfg.output.out)
    return claim_run_dir(Path("runs"), f"{cfg.algo}-{cfg.data.dataset}-{time.strftime('%Y%m%d-%H%M%S')}")


def claim_run_dir(parent: Path, name: str) -> Path:
    """Make and return ``parent/name``, or ``parent/name-2``, ``-3``, ... where it exists: a run
    started in the same second as another, from this process, another one, or another machine
    sharing the folder, gets a directory of its own. Creating a directory is atomic on a local
    file system and on NFS, so of two runs that try one name, exactly one gets it."""
    parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        path = parent / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1


class TableWriter(BaseCallback):
    """config.yaml at the start; the Parquet tables after every evaluation; summary.json at the end.
    ``rows`` and ``client_rows`` are the rows before the first round of this run (a resumed run's,
    from its checkpoint)."""

    def __init__(
        self, rows: list[dict[str, Any]] | None = None, client_rows: list[dict[str, Any]] | None = None
    ) -> None:
        self.rows: list[dict[str, Any]] = list(rows or [])
        self.client_rows: list[dict[str, Any]] = list(client_rows or [])
        self.run_dir = Path(".")

    def on_start(self, cfg: ExperimentConfig, run_dir: Path) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        dump_yaml(cfg, run_dir / "config.yaml")
        if self.rows:  # resumed: the tables go back to the checkpoint's (a killed run may have written more)
            self._write()

    def on_eval(self, rnd: int, row: dict[str, Any], clients: list[dict[str, Any]]) -> None:
        self.rows.append(row)
        self.client_rows.extend(clients)
        self._write()

    def _write(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        for name, rows in (("metrics.parquet", self.rows), ("clients.parquet", self.client_rows)):
            # every column any row has (a scalar an algorithm logs from some round on, say), not
            # only the first row's, which is all from_pylist would keep
            columns = list(dict.fromkeys(k for row in rows for k in row))
            with replaced_atomically(self.run_dir / name) as tmp:
                pq.write_table(pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows]), tmp)

    def on_end(self, summary: dict[str, Any]) -> None:
        with replaced_atomically(self.run_dir / "summary.json") as tmp:
            tmp.write_text(json.dumps(summary, indent=2) + "\n")


class TensorBoardWriter(BaseCallback):
    """TensorBoard: the partition picture (``data/partition``, step 0) once it is drawn;
    ``accuracy/*`` scalars and per-client accuracy histograms at evaluated rounds (with
    ``eval.analyses``, ``analysis/*`` and ``classes/gm_acc/*`` too); ``train/*``, ``time/*``,
    ``comm/*`` and ``algo/*`` scalars every round. Under a simulated deployment (``deployment.*``)
    also ``deployment/*`` every round, and where its devices take time ``sim_time_ms/*``: the
    accuracies with the simulated milliseconds as their step, so that TensorBoard plots them
    against the simulated clock."""

    def __init__(self, purge_step: int | None = None) -> None:
        self.writer: Any = None
        self.purge_step = purge_step
        self.deployed = self.timed = False
        self.picture: Path | None = None  # the partition picture, until it is in TensorBoard

    def on_start(self, cfg: ExperimentConfig, run_dir: Path) -> None:
        from raysim.results.tensorboard import EventWriter

        d = cfg.deployment
        self.timed = d.devices != "ideal"
        self.deployed = d.active

        self.writer = EventWriter(run_dir / "tb")
        if self.purge_step is not None:  # a resumed run: what the stopped one logged after its checkpoint goes
            self.writer.purge_from(self.purge_step)
        self.writer.add_text("config", "```\n" + (run_dir / "config.yaml").read_text() + "\n```", 0)
        from raysim.results.partition_view import PICTURE

        self.picture = run_dir / PICTURE
        self._add_picture()

    def _add_picture(self) -> None:
        """The partition picture (:mod:`raysim.results.partition_view`), once it is there: the run
        draws it beside its workers' start, written whole or not at all, so it is read at the start
        or after a later round (or at the end, when it has been waited for)."""
        if self.picture is not None and self.picture.is_file():
            from raysim.results.partition_view import read_picture

            self.writer.add_image("data/partition", read_picture(self.picture), 0)
            self.picture = None

    def on_round(self, stats: RoundStats, round_time: float) -> None:
        self._add_picture()
        w, r = self.writer, stats.rnd
        w.add_scalar("train/loss", stats.train_loss, r)
        w.add_scalar("train/clients", stats.clients, r)
        w.add_scalar("time/round_s", round_time, r)
        w.add_scalar("comm/bytes_down", stats.bytes_down, r)
        w.add_scalar("comm/bytes_up", stats.bytes_up, r)
        w.add_scalar("compute/samples_trained", stats.samples_trained, r)
        w.add_scalar("compute/client_epochs", stats.client_epochs, r)
        if self.deployed:  # the simulated deployment's round
            w.add_scalar("deployment/round_s", stats.sim_duration_s, r)
            w.add_scalar("deployment/lost", stats.lost, r)
            w.add_scalar("deployment/late", stats.late, r)
        for name, value in stats.scalars:
            w.add_scalar(f"algo/{name}", value, r)
        for name, text in stats.texts:
            w.add_text(f"algo/{name}", text, r)
        for name, image in stats.images:
            w.add_image(f"algo/{name}", image, r)

    def on_eval(self, rnd: int, row: dict[str, Any], clients: list[dict[str, Any]]) -> None:
        from raysim.results.analysis import ANALYSIS_COLUMNS

        for key, value in row.items():
            if value is None:
                continue
            if key == "gm_class_acc":  # eval.analyses: one curve per class
                for c, acc in enumerate(value):
                    if acc is not None:
                        self.writer.add_scalar(f"classes/gm_acc/{c}", acc, rnd)
            elif key in ANALYSIS_COLUMNS:
                self.writer.add_scalar(f"analysis/{key}", value, rnd)
            elif key.startswith(("gm_", "lm_", "updated_lm_", "new_")):
                self.writer.add_scalar(f"accuracy/{key}", value, rnd)
                if self.timed:  # the same curve against the simulated clock (a step is a whole number)
                    self.writer.add_scalar(f"sim_time_ms/{key}", value, round(1000 * row["sim_time_s"]))
        for m in ("gm_ptest", "lm_ptest", "updated_lm_ptest"):
            values = [c[m] for c in clients if c.get(m) is not None and not c.get("new")]
            if values:
                self.writer.add_histogram(f"clients/{m}", np.array(values), rnd)
        self.writer.add_scalar("time/eval_s", row["eval_time_s"], rnd)
        self.writer.flush()

    def on_image(self, tag: str, image: np.ndarray, rnd: int) -> None:
        """A picture the run made (e.g. ``eval.features``' t-SNE, ``features/tsne``)."""
        self.writer.add_image(tag, image, rnd)

    def on_end(self, summary: dict[str, Any]) -> None:
        self._add_picture()
        self.writer.close()


class ProgressBar(BaseCallback):
    """A tqdm bar over rounds with the latest loss and accuracies."""

    def __init__(self, done: int = 0) -> None:
        self.bar: Any = None
        self.done = done  # rounds done before this run (a resumed run's)
        self.post: dict[str, str] = {}

    def on_start(self, cfg: ExperimentConfig, run_dir: Path) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=cfg.rounds,
            initial=self.done,
            desc="rounds",
            unit="round",
            file=sys.stderr,
            dynamic_ncols=True,
        )

    def on_round(self, stats: Any, round_time: float) -> None:
        self.post["loss"] = f"{stats.train_loss:.3f}"
        self.bar.set_postfix(self.post, refresh=False)
        self.bar.update(1)

    def on_eval(self, rnd: int, row: dict[str, Any], clients: list[dict[str, Any]]) -> None:
        for m in ("gm_gtest", "gm_ptest", "lm_ptest"):
            if row.get(m) is not None:
                self.post[m] = f"{row[m]:.4f}"
        self.bar.set_postfix(self.post)

    def on_end(self, summary: dict[str, Any]) -> None:
        self.bar.close()
