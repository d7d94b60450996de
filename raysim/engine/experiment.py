"""From settings to a checked experiment, in the driver and before any work.

:func:`resolve_config` puts the algorithm's paper setup beneath the given settings;
:func:`validate` checks the whole config against the registries (:mod:`raysim.registry`): every
setting's range, the names, the model against the dataset's input, the partition against the
dataset's size and class count, the data directory and the algorithm's own parameters. None of it
needs the data, Ray or PyTorch, so bad input ends in well under a second with one sentence.
:func:`validate` returns an :class:`Experiment`: the config with the algorithm class and typed
settings it found, which the runner and the executors take, so that a run looks the algorithm up
and checks its config once in the driver (a server or worker process, which has only the config,
builds its algorithm object with :func:`make_algorithm`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raysim.capabilities.asynchronous import Asynchronous
from raysim.capabilities.batching import Batching
from raysim.capabilities.finetune import FineTune
from raysim.capabilities.regularizers import Regularizable
from raysim.capabilities.server_opt import ServerOptimizer
from raysim.capabilities.settings import FT_PARAMS, OPT_PARAMS, REG_PARAMS, config_fields, engine_settings
from raysim.config import ExperimentConfig, from_dict, merge, set_dotted
from raysim.deployment.model import apply_preset, preset_settings
from raysim.deployment.model import check as check_deployment
from raysim.engine.hooks import AlgorithmHooks
from raysim.engine.targets import check_target
from raysim.errors import ConfigError
from raysim.internals import internals_on
from raysim.plugins import load_plugins
from raysim.registry import (
    ALGORITHMS,
    DATASETS,
    EXECUTORS,
    MODELS,
    PARTITIONS,
    TEST_MODES,
    DatasetInfo,
    dataset_info,
    load_ref,
    parse_partition,
    parse_test_mode,
)
from raysim.results.trackers import check_trackers
from raysim.rng import new_client_count


def algorithm_class(name: str) -> type[AlgorithmHooks]:
    """The registered algorithm ``name``, or a user's own class named ``package.module:Class``
    (importable on every worker), so a new algorithm needs no change to raysim."""
    if ":" not in name:
        cls: type[AlgorithmHooks] = ALGORITHMS.get(name)
        return cls
    try:
        obj = load_ref(name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"The algorithm {name!r} cannot be imported ({e}).") from None
    hooks = ("init", "plan", "aggregate", "local_update")
    if not (isinstance(obj, type) and all(callable(getattr(obj, h, None)) for h in hooks)):
        raise ConfigError(f"{name!r} is not an algorithm class (an algorithms.base.Algorithm subclass).")
    return obj


def engine_params(cls: type) -> tuple[str, ...]:
    """The ``algo.*`` settings the engine's mechanisms take for the algorithm class ``cls``; a name
    the algorithm's own Config has stays the algorithm's (MOON's and FedNTD's ``tau``: their server
    optimiser's adaptivity is ``server_tau``)."""
    own = config_fields(cls)
    return (
        (FT_PARAMS if FineTune.of(cls).declared else ())
        + (REG_PARAMS if Regularizable.of(cls).declared else ())
        + (tuple(k for k in OPT_PARAMS if k not in own) if ServerOptimizer.applies(cls) else ())
    )


#: parameter names that cannot be Config fields (Python keywords), and the field each one sets
KEYWORD_PARAMS = {"lambda": "lam"}


@dataclass(frozen=True)
class Experiment:
    """A config as the driver resolved it, once: the algorithm's class and its typed settings
    (``params``, the class's ``check`` passed). :func:`validate` makes one after checking
    everything else; :meth:`of` only resolves the algorithm (what building it needs)."""

    cfg: ExperimentConfig
    algorithm: type[AlgorithmHooks]
    params: Any

    @classmethod
    def of(cls, cfg: ExperimentConfig | Experiment) -> Experiment:
        """``cfg`` itself when it is an experiment already, else its algorithm resolved."""
        if isinstance(cfg, Experiment):
            return cfg
        load_plugins(cfg.plugins)  # what they register may be the algorithm (raysim.plugins)
        algo = algorithm_class(cfg.algo)
        return cls(cfg, algo, algorithm_params(cfg, algo))

    def make_algorithm(self) -> AlgorithmHooks:
        """A new algorithm object for this experiment (a server's, a client runtime's)."""
        return self.algorithm(self.cfg, self.params)


def algorithm_params(cfg: ExperimentConfig, cls: type[AlgorithmHooks]) -> Any:
    """The typed, frozen config of the algorithm class ``cls`` from ``cfg.algo_params`` (unknown
    keys rejected), checked against the rest of ``cfg``. ``algo.lambda`` sets the field ``lam``,
    and the class's ``aliases`` name other fields."""
    names = {**KEYWORD_PARAMS, **cls.aliases}
    raw = {names.get(k, k): v for k, v in cfg.algo_params.items()}
    # taken by the engine's mechanisms ("-FT", added regularisers, server optimisers), not by the Config
    _check_engine_params({k: raw.pop(k) for k in engine_params(cls) if k in raw}, cls)
    params = from_dict(cls.Config, raw, where="algo")
    cls.check(cfg, params)
    return params


def resolved_params(exp: Experiment) -> dict[str, Any]:
    """The algorithm's settings as the run used them, defaults included, by the names a user sets
    them (``lambda`` for the field ``lam``): its Config's, then the engine's that apply to it (the
    "-FT" epochs and rate, the server optimiser's, the added regularisers'). A run's summary records
    them, so that its numbers name the settings they came from even where a default changes later."""
    from raysim.config import to_dict

    cls, cfg = exp.algorithm, exp.cfg
    fields = {v: k for k, v in KEYWORD_PARAMS.items()}
    own = to_dict(exp.params) if dataclasses.is_dataclass(exp.params) else {}
    engine: dict[str, Any] = {}
    if FineTune.of(cls).declared:
        engine["ft_epochs"], engine["ft_lr"] = FineTune.of(cls).setting(cfg)
    if ServerOptimizer.applies(cls):
        opt = ServerOptimizer.of(cls).settings(cfg, cls)
        engine.update(server_opt=opt.opt, server_lr=opt.lr, server_momentum=opt.momentum)
        engine.update({"beta1": opt.beta1, "beta2": opt.beta2, "server_tau" if "tau" in own else "tau": opt.tau})
    if Regularizable.of(cls).declared:
        reg = engine_settings({k: v for k, v in cfg.algo_params.items() if k in REG_PARAMS})
        engine.update(regularizers=list(reg.regularizers), reg_beta=reg.reg_beta, reg_tau=reg.reg_tau)
    # a name the algorithm's own Config has is the algorithm's (MOON's tau, SCAFFOLD's server_lr)
    out = {**{fields.get(k, k): v for k, v in own.items()}, **{k: v for k, v in engine.items() if k not in own}}
    return {k: _json_value(v) for k, v in out.items()}


def _json_value(v: Any) -> Any:
    """``v`` as JSON writes it: a plugin's Config may hold a value JSON has no type for (a path, an
    enum), written as its text rather than failing the run's summary at its end."""
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    return str(v)


def _check_engine_params(given: Mapping[str, Any], cls: type) -> None:
    names = engine_settings(given).regularizers  # each setting's own range is declared with it
    if len(set(names)) < len(names):
        raise ConfigError(f"algo.regularizers lists each regulariser once, not {list(names)!r}.")
    if ServerOptimizer.applies(cls):
        from raysim.capabilities.server_opt import ADAPTIVE

        opt = engine_settings(given).server_opt or ServerOptimizer.of(cls).opt
        if "tau" in given and "server_tau" in given:
            raise ConfigError("Give algo.tau or algo.server_tau, not both: they are the same adaptivity.")
        unused = [k for k in ("server_momentum",) if k in given and opt != "sgdm"]
        unused += [k for k in ("beta1", "beta2", "tau", "server_tau") if k in given and opt not in ADAPTIVE]
        if unused:
            raise ConfigError(
                f"algo.{unused[0]} is not a setting of the server optimiser {opt} (algo.server_opt): "
                "server_momentum is sgdm's, beta1, beta2 and tau are adam's, yogi's and adagrad's."
            )


def make_algorithm(cfg: ExperimentConfig) -> AlgorithmHooks:
    """The algorithm object of a process that has only the config (a server actor, a client
    worker): the one place outside :func:`validate` that looks the algorithm up."""
    return Experiment.of(cfg).make_algorithm()  # a worker's first read of the registries


def resolve_config(settings: Mapping[str, Any]) -> ExperimentConfig:
    """Nested settings (a config file merged with the command line) -> the experiment config, with
    the algorithm's paper setup for the chosen dataset beneath them unless they say
    ``paper_setup: false``, beneath that the dataset's own model (``DatasetEntry.model``) when
    neither names one, and the settings of the deployment ``deployment.preset`` names (a file or a
    registered deployment) beneath the ``deployment.*`` settings given."""
    given: ExperimentConfig = from_dict(ExperimentConfig, settings)
    load_plugins(given.plugins)  # what they register may be named below (an algorithm, a dataset)
    base: dict[str, Any] = {}
    if "model" not in settings:  # a model that fits the dataset, unless the paper setup names one
        fits = DATASETS.get(given.data.dataset).model if given.data.dataset in DATASETS else ""
        if fits:
            base["model"] = fits
    if given.paper_setup:
        setup = algorithm_class(given.algo).paper_setup(dataset_info(given.data))
        for key, value in setup.items():
            set_dotted(base, key, value)
    if given.deployment.preset is not None:  # --deployment: its settings beneath the deployment.* given
        for key, value in preset_settings(given.deployment.preset).items():
            set_dotted(base, f"deployment.{key}", value)
        set_dotted(base, "deployment.preset", None)  # applied: it stays beneath what was given
        settings = {**settings, "deployment": {k: v for k, v in settings["deployment"].items() if k != "preset"}}
    if not base:
        return given
    resolved: ExperimentConfig = from_dict(ExperimentConfig, merge(base, settings))
    return resolved


def validate(cfg: ExperimentConfig) -> Experiment:
    """Raise :class:`ConfigError` with one clear sentence for the first bad setting; everything
    that can be known without the data, Ray or PyTorch. Returns the checked :class:`Experiment`."""
    load_plugins(cfg.plugins)
    cfg = apply_preset(cfg)  # a config object's --deployment (one from settings has it resolved)
    _check_training(cfg)
    _check_ray(cfg)
    _check_output(cfg)
    check_deployment(cfg)
    EXECUTORS.get(cfg.ray.executor)
    info = _check_data(cfg)
    MODELS.get(cfg.model).check_input(cfg.model, info.input_shape)
    if cfg.data.augment != "none" and len(info.input_shape) != 3:
        raise ConfigError(
            f"data.augment={cfg.data.augment} crops and flips images (channels, height, width); "
            f"{cfg.data.dataset}'s samples have the shape {tuple(info.input_shape)}."
        )
    exp = Experiment.of(cfg)  # the algorithm's name, its parameters, and its own checks (check())
    cls = exp.algorithm
    check_target(cfg, cls)
    if cfg.eval.updated_lm and cfg.train.batch_clients > 1 and cls.evaluates_personal(cfg):
        raise ConfigError(
            "eval.updated_lm with train.batch_clients > 1 reads only what a client uploads, and "
            f"{cfg.algo} keeps personal parts (as this run is set): train its clients one by one."
        )
    if cfg.deployment.time_budget_s is not None:
        _check_time_budget(cfg, cls)
    if cfg.deployment.mode == "async" and not Asynchronous.of(cls).possible:
        raise ConfigError(f"{cfg.algo} cannot aggregate asynchronously (deployment.mode=async): {Asynchronous.of(cls).why_not}")
    if cfg.privacy.clip != "none" or cfg.privacy.example_clip is not None:
        from raysim.engine.private import check_client_level, check_sample_level, released_statistics
        from raysim.privacy.accounting import check_privacy
        from raysim.privacy.client_level import calibrated

        statistics = released_statistics(cfg, cls, exp.params)
        check_privacy(cfg, statistics)
        check_client_level(cfg, cls)
        check_sample_level(cfg, cls)
        # client-level sigma calibrated once, before any work
        exp = dataclasses.replace(exp, cfg=calibrated(exp.cfg, statistics))
    if cfg.train.batch_clients > 1:
        batching = Batching.of(cls)
        if not batching.possible:
            raise ConfigError(f"{cfg.algo} cannot train clients batched (train.batch_clients): {batching.why_not}")
        if not MODELS.get(cfg.model).batchable:
            raise ConfigError(
                f"The model {cfg.model} cannot train clients batched (train.batch_clients): it has BatchNorm "
                "layers, whose statistics one batched step cannot keep per client."
            )
    return exp


def _check_time_budget(cfg: ExperimentConfig, cls: Any) -> None:
    """A run that stops when its clock reaches ``deployment.time_budget_s`` does not know its last
    round in advance, so what runs only after the last round (``cfg.rounds``) is refused."""
    from raysim.capabilities.extra_rounds import ExtraRounds
    from raysim.capabilities.finetune import FineTune

    why = None
    if ExtraRounds.of(cls).epilogue:
        why = f"{cfg.algo}'s pass over every client after the last round"
    elif FineTune.of(cls).on(cfg):
        why = "the fine-tuning after the last round (algo.ft_epochs; set it to 0)"
    elif cfg.eval.features > 0:
        why = "eval.features, exported after the last round"
    if why is not None:
        raise ConfigError(
            f"deployment.time_budget_s (--sim-time) stops a run at a round not known in advance, so it cannot run {why}."
        )


def _check_training(cfg: ExperimentConfig) -> None:
    """What relates several settings, or the items of one (each setting's own range is declared
    with it in raysim/config.py and checked as the config is built)."""
    if any(not 0 < m < 1 for m in cfg.train.lr_milestones):
        raise ConfigError("Learning-rate milestones are fractions of the rounds, each in (0, 1).")
    held = new_client_count(cfg.clients, cfg.eval.new_clients)
    if held >= cfg.clients:
        raise ConfigError(
            f"eval.new_clients={cfg.eval.new_clients} holds out {held} of the {cfg.clients} clients, "
            "leaving none to train: hold out a smaller share."
        )


def _check_output(cfg: ExperimentConfig) -> None:
    """A run directory given (``output.out``) is one, or can be made: neither it nor a folder
    above it is a file."""
    if not cfg.output.out:
        return
    path = Path(cfg.output.out).expanduser()
    for above in (path, *path.parents):
        if above.exists():
            if not above.is_dir():
                where = "is a file" if above == path else f"cannot be made: {above} is a file"
                raise ConfigError(f"The run directory {cfg.output.out} {where}, not a directory.")
            return


def _check_ray(cfg: ExperimentConfig) -> None:
    internals_on()  # a mistyped RAYSIM_INTERNALS is refused here, before any work
    check_trackers(cfg)  # output.log and its settings, and the trackers' packages
    if cfg.ray.cpus_per_worker == 0 and cfg.ray.gpus_per_worker == 0:
        raise ConfigError("A client worker needs a share of a CPU or of a GPU.")


def _check_data(cfg: ExperimentConfig) -> DatasetInfo:
    d = cfg.data
    entry = DATASETS.get(d.dataset)
    if entry.reads_files and d.data_dir is not None and Path(d.data_dir).expanduser().exists():
        if not Path(d.data_dir).expanduser().is_dir():
            raise ConfigError(f"The data directory {d.data_dir} is a file, not a directory.")
    info = entry.info(d.dataset, d)
    if info.num_classes < 1 or info.train_size < 1 or info.test_size < 1 or not info.input_shape:
        raise ConfigError(f"The {d.dataset} dataset needs at least 1 class, 1 training and 1 test sample.")
    if any(s < 1 for s in info.input_shape):
        raise ConfigError(f"The {d.dataset} samples' shape must be positive sizes, not {info.input_shape}.")
    partition = parse_partition(d.partition)
    test_mode = parse_test_mode(d.test_mode)
    if test_mode.kind == "natural":
        if entry.natural_clients == 0:
            raise ConfigError(
                f"The natural test mode needs data with clients of its own; {d.dataset} has none (femnist has)."
            )
        if partition.kind != "natural":
            raise ConfigError("The natural test mode needs the natural partition (--partition natural).")
    pool = info.train_size + (info.test_size if TEST_MODES.get(test_mode.kind).pools_test_set else 0)
    feasible = load_ref(PARTITIONS.get(partition.kind).feasible)
    feasible(partition.param, cfg.clients, info.num_classes, pool, d)
    from raysim.data.feature_shift import check_feature_shift

    check_feature_shift(d, cfg.clients)  # data.feature_shift: its domains and the samples' shape
    if not entry.reads_files:
        # a generated dataset costs little to make (the synthetic set's default size in tens of
        # milliseconds): made and split here, whatever its split cannot do (a Dirichlet draw that
        # leaves a client too few samples) is refused before Ray starts, not seconds into a run
        from raysim.data.federated import build_federated_data

        build_federated_data(d, cfg.clients, cfg.seed, quiet=True)
    return info


__all__ = [
    "Experiment",
    "engine_params",
    "algorithm_class",
    "algorithm_params",
    "dataset_info",
    "make_algorithm",
    "resolve_config",
    "validate",
]
