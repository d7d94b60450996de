"""A suite's specification: its configurations, grid, seeds, search and scheduler, read from a file
or made from flags, and checked before any work (every trial's config, each searched setting at the
ends of its range, the search algorithm, the scheduler and the metric, which every trial must
report); its trials and their experiments."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysim.config import ExperimentConfig, load_config_file, set_dotted
from raysim.errors import ConfigError

if TYPE_CHECKING:
    from raysim.engine.experiment import Experiment
    from raysim.suite.claims import Claim

SUITE_FILE = "suite.yaml"
#: a line each time a trial's experiment starts, resumes or ends: name, start|resume|end, time, pid
STARTS_FILE = "trial_starts.log"
TRIAL_FILE = "trial.json"  # in a trial's run directory: its configuration, seed and sampled settings
#: range syntax for a searched setting: ``loguniform(1e-3, 1e-1)``, ``choice(3, 5, 10)``, ...
RANGE = re.compile(r"^\s*(uniform|loguniform|randint|qrandint|choice|quniform)\s*\((.*)\)\s*$")
RANGE_FORMS = (
    "uniform(a, b), loguniform(a, b), randint(a, b), quniform(a, b, q), qrandint(a, b, q) or choice(x, y, ...)"
)
#: Tune's search algorithms (``tune.search.SEARCH_ALG_IMPORT``) and the packages each needs beside Ray
SEARCHERS: dict[str, tuple[str, ...]] = {
    "random": (),
    "variant_generator": (),
    "ax": ("ax",),
    "bayesopt": ("bayes_opt",),
    "bohb": ("hpbandster", "ConfigSpace"),
    "hebo": ("hebo",),
    "hyperopt": ("hyperopt",),
    "nevergrad": ("nevergrad",),
    "optuna": ("optuna",),
    "zoopt": ("zoopt",),
}
#: Tune's trial schedulers (``tune.schedulers.SCHEDULER_IMPORT``) that raysim's trials run under, and
#: ``asha``, a name easier to remember than Tune's own
SCHEDULERS = {
    "asha": "async_hyperband",
    "async_hyperband": "async_hyperband",
    "asynchyperband": "asynchyperband",
    "hyperband": "hyperband",
    "hb_bohb": "hb_bohb",
    "median_stopping_rule": "median_stopping_rule",
    "medianstopping": "medianstopping",
    "fifo": "fifo",
}
#: Tune's schedulers that need what raysim's trials do not give: Tune checkpoints to exploit and
#: settings to mutate (population-based training), or a scheduler beneath (resource changing)
UNSCHEDULABLE = ("pbt", "pb2", "pbt_replay", "resource_changing")
#: what a trial reports to Tune at each evaluation that a search or scheduler can optimise
SEARCH_METRICS = (
    "gm_gtest",
    "gm_ptest",
    "gm_ptest_weighted",
    "lm_ptest",
    "lm_ptest_weighted",
    "updated_lm_ptest",
    "updated_lm_ptest_weighted",
    "new_gm_ptest",
    "new_gm_ptest_weighted",
    "new_lm_ptest",
    "new_lm_ptest_weighted",
    "train_loss",
)


@dataclass(frozen=True)
class SuiteConfig:
    """One configuration of a suite (a row of its table): settings over the suite's base."""

    name: str
    settings: Mapping[str, Any] = field(default_factory=dict)  # dotted keys
    paper: str = ""  # the paper's figure for this row, shown beside it


@dataclass(frozen=True)
class SearchSpec:
    """A search over ranges of settings (beyond grids): a Tune search algorithm and scheduler."""

    space: Mapping[str, str]  # dotted key -> range, e.g. "loguniform(1e-3, 1e-1)"
    algorithm: str = "random"  # any of Tune's create_searcher names
    samples: int = 4
    scheduler: str | None = None  # any of Tune's create_scheduler names, or "asha"
    metric: str = "gm_gtest"
    mode: str = "max"


@dataclass(frozen=True)
class SchedulerSpec:
    """A Tune trial scheduler over a suite's grid and seeds (no search): e.g. ASHA, stopping the
    trials that trail the others on ``metric`` (in ``mode``) at its rungs."""

    name: str  # any of Tune's create_scheduler names, or "asha"
    metric: str = "gm_gtest"
    mode: str = "max"


@dataclass(frozen=True)
class Suite:
    name: str
    base: Mapping[str, Any]  # dotted settings of every trial
    configs: tuple[SuiteConfig, ...]
    seeds: tuple[int, ...] = (0,)
    search: SearchSpec | None = None
    #: a scheduler over the trials of a suite without a search (a search has its own)
    scheduler: SchedulerSpec | None = None
    #: CPUs reserved for a trial's driver and server (the head bundle); 0: none, as a run.py driver
    driver_cpus: float = 0.0
    description: str = ""
    #: a baseline (e.g. FedAvg) each configuration is paired with at equal compute: its rounds and
    #: epochs, and the clients a round that train as many client-epochs
    equal_compute: SuiteConfig | None = None
    #: the paper's claims the suite tests, judged on its page (raysim.suite.claims)
    claims: tuple[Claim, ...] = ()
    #: the paper's setting for what the suite reproduces (dotted settings); the page lists every
    #: difference from what ran
    paper_setting: Mapping[str, Any] = field(default_factory=dict)
    #: the page's series against a setting, the suite file's entry as checked (raysim.suite.against)
    against: Mapping[str, Any] | None = None
    #: the page's tables by regime, the suite file's entry as checked (raysim.suite.regimes)
    regimes: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Trial:
    """One experiment of a suite: a configuration with a seed (and sampled settings, if searched)."""

    config: str
    seed: int
    settings: Mapping[str, Any]  # dotted: the suite's base, then the configuration's

    @property
    def name(self) -> str:
        return f"{self.config}-seed{self.seed}"


# --------------------------------------------------------------------------------------------------
# reading a suite


def setting_key(name: str) -> str:
    """A setting as a dotted config key: ``train.lr`` stays, a flag's name (``rounds``,
    ``local_epochs``, ``dataset``) becomes its key."""
    from raysim.keywords import FLAGS

    if "." in name:
        return name
    if name in FLAGS:  # e.g. deployment: stragglers, the flag --deployment (deployment.preset)
        return FLAGS[name][0]
    if name in {f.name for f in dataclasses.fields(ExperimentConfig)}:
        return name
    if name.replace("-", "_") in FLAGS:
        return FLAGS[name.replace("-", "_")][0]
    raise ConfigError(f"{name!r} is neither a setting (e.g. train.lr) nor a flag of run.py.")


def dotted(settings: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    if settings is None:
        return {}
    if not isinstance(settings, Mapping):
        raise ConfigError(f"{where} must be a table of settings, not {settings!r}.")
    # a table (deployment: {dropout: 0.3}) is the config's own; a value under a flag's name is the flag's
    return {str(k) if isinstance(v, Mapping) else setting_key(str(k)): v for k, v in settings.items()}


def parse_seeds(text: str | int | Sequence[int]) -> tuple[int, ...]:
    """``3`` -> (3,); ``0-4`` -> (0, ..., 4); ``0,2,5`` -> (0, 2, 5); a list as it is."""
    if isinstance(text, int):
        return (text,)
    if not isinstance(text, str):
        return tuple(int(s) for s in text)
    seeds: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            seeds += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
        except ValueError:
            raise ConfigError(f"Seeds are numbers and ranges like 0-4,7, not {text!r}.") from None
    if not seeds:
        raise ConfigError("A suite needs at least one seed.")
    return tuple(dict.fromkeys(seeds))


def expand_grid(
    configs: Sequence[SuiteConfig], grid: Mapping[str, Sequence[Any]], base_algo: str = "fedavg"
) -> tuple[SuiteConfig, ...]:
    """Every configuration times every combination of the grid's values. A grid key of an
    algorithm's parameters (``algo.X``) applies to the algorithms that have it (a configuration's,
    else ``base_algo``); for the others it is left out, so they run once instead of once per value.
    A configuration's ``paper`` of as many figures separated by " / " as there are combinations
    (``"78.44 / 84.56"`` for a grid of two partitions) gives each combination its own figure."""
    if not grid:
        return tuple(configs)
    keys = list(grid)
    out: dict[str, SuiteConfig] = {}
    for config in configs or [SuiteConfig("")]:
        combinations = list(itertools.product(*(grid[k] for k in keys)))
        figures = [f.strip() for f in config.paper.split(" / ")]
        for i, values in enumerate(combinations):
            paper = figures[i] if len(figures) == len(combinations) > 1 else config.paper
            settings = dict(config.settings)
            label = []
            for k, v in zip(keys, values, strict=True):
                settings[k] = v
            algo = str(settings.get("algo", base_algo))
            for k, v in zip(keys, values, strict=True):
                if k.startswith("algo.") and not _algorithm_has(algo, k.split(".", 1)[1]):
                    del settings[k]
                else:  # fed3p2, or local_epochs=2 (a key's last part), or regularizers=kd+fd
                    text = ("+".join(map(str, v)) or "none") if isinstance(v, (list, tuple)) else str(v)
                    label.append(text if k == "algo" else f"{k.rsplit('.', 1)[-1]}={text}")
            name = "_".join(x for x in [config.name, *label] if x) or "run"
            out.setdefault(_safe(name), SuiteConfig(_safe(name), settings, paper))
    return tuple(out.values())


def _algorithm_has(algo: str, param: str) -> bool:
    from raysim.engine.experiment import KEYWORD_PARAMS, algorithm_class, engine_params

    cls = algorithm_class(algo)
    names = {f.name for f in dataclasses.fields(cls.Config)}
    if param in engine_params(cls):
        return True
    return param in names or KEYWORD_PARAMS.get(param) in names or param in cls.aliases


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", name).strip("_") or "run"


def yaml_safe_load(path: Path) -> dict[str, Any]:
    """A YAML file's mapping: {} where the file is missing or holds something else."""
    import yaml

    data = yaml.safe_load(path.read_text()) if path.exists() else {}
    return data if isinstance(data, dict) else {}


def load_suite(path: str | Path) -> Suite:
    """A suite from its YAML (or TOML/JSON) file: ``name``, ``description``, ``base`` (settings
    of every trial), ``configs`` (a list of ``{name, set, paper}``), ``grid`` (settings to cross
    every configuration with), ``seeds``, ``search``, ``scheduler`` (for a suite without a search:
    a name, or ``{name, metric, mode}``), ``driver_cpus``, and for its page ``claims``,
    ``paper_setting`` (:mod:`raysim.suite.claims`) and ``against`` (:mod:`raysim.suite.against`)."""
    data = load_config_file(path)
    known = {
        "name", "description", "base", "configs", "grid", "seeds", "search", "scheduler", "driver_cpus",
        "equal_compute", "claims", "paper_setting", "against", "regimes",
    }  # fmt: skip
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"Unknown suite entry {unknown[0]!r} in {path} (known: {', '.join(sorted(known))}).")
    if not data.get("configs") and not data.get("grid"):
        raise ConfigError(
            f"The suite file {path} lists no configurations: give configs (a list of a name and its settings "
            "under set) or a grid."
        )
    configs = []
    for i, entry in enumerate(data.get("configs") or []):
        if not isinstance(entry, Mapping) or "name" not in entry:
            raise ConfigError(f"Configuration {i + 1} of {path} needs a name (and its settings under 'set').")
        configs.append(
            SuiteConfig(_safe(str(entry["name"])), dotted(entry.get("set"), f"{entry['name']}.set"), str(entry.get("paper", "")))
        )
    grid = {k: _as_list(v) for k, v in dotted(data.get("grid"), "grid").items()}
    search = data.get("search")
    scheduler = data.get("scheduler")
    if search and scheduler is not None:
        raise ConfigError(f"{path} has a search: give its scheduler under search (search.scheduler), not beside it.")
    pair = data.get("equal_compute")
    if pair is not None and (not isinstance(pair, Mapping) or "name" not in pair):
        raise ConfigError(f"equal_compute in {path} is a configuration: a name and its settings under 'set'.")
    suite = make_suite(
        name=str(data.get("name") or Path(path).stem),
        base=dotted(data.get("base"), "base"),
        configs=configs,
        grid=grid,
        seeds=parse_seeds(data.get("seeds", 0)),
        search=_search(search) if search else None,
        scheduler=_scheduler(scheduler, path) if scheduler is not None else None,
        driver_cpus=float(data.get("driver_cpus", 0.0)),
        description=str(data.get("description", "")),
        equal_compute=SuiteConfig(_safe(str(pair["name"])), dotted(pair.get("set"), "equal_compute.set"))
        if pair is not None
        else None,
    )
    if data.get("against") is not None:  # the page's series against a setting (raysim.suite.against)
        from raysim.suite.against import parse_against

        parse_against(data["against"], [c.name for c in suite.configs], str(path))
        suite = dataclasses.replace(suite, against=dict(data["against"]))
    if data.get("regimes") is not None:  # the page's tables by regime (raysim.suite.regimes)
        from raysim.suite.regimes import parse_regimes

        parse_regimes(data["regimes"], [c.name for c in suite.configs], str(path))
        suite = dataclasses.replace(suite, regimes=dict(data["regimes"]))
    return paper_of(suite, data, str(path))


def paper_of(suite: Suite, data: Mapping[str, Any], path: str) -> Suite:
    """``suite`` with the paper's claims and setting of the suite file's ``data`` (``claims``,
    ``paper_setting``: :mod:`raysim.suite.claims`), checked against its configurations."""
    from raysim.suite.claims import parse_claims

    claims = parse_claims(data.get("claims"), [c.name for c in suite.configs], path)
    setting = dotted(data.get("paper_setting"), "paper_setting")
    return dataclasses.replace(suite, claims=claims, paper_setting=setting)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _search(data: Mapping[str, Any]) -> SearchSpec:
    if not isinstance(data, Mapping) or "space" not in data:
        raise ConfigError("A suite's search needs a space: ranges of settings, e.g. train.lr: loguniform(1e-3, 0.1).")
    space = {k: str(v) for k, v in dotted(data["space"], "search.space").items()}
    return SearchSpec(
        space=space,
        algorithm=str(data.get("algorithm", "random")),
        samples=int(data.get("samples", 4)),
        scheduler=data.get("scheduler"),
        metric=str(data.get("metric", "gm_gtest")),
        mode=str(data.get("mode", "max")),
    )


def _scheduler(data: Any, path: str | Path) -> SchedulerSpec:
    """A suite file's ``scheduler``: its name, or a table of its name, metric and mode."""
    if isinstance(data, str):
        return SchedulerSpec(data)
    fields = ("name", "metric", "mode")
    if not isinstance(data, Mapping) or "name" not in data or set(data) - set(fields):
        raise ConfigError(
            f"The scheduler in {path} is a name (e.g. asha) or a table of name, metric and mode, not {data!r}."
        )
    return SchedulerSpec(**{k: str(data[k]) for k in fields if k in data})


def make_suite(
    name: str,
    base: Mapping[str, Any],
    configs: Sequence[SuiteConfig],
    grid: Mapping[str, Sequence[Any]],
    seeds: Sequence[int],
    search: SearchSpec | None = None,
    driver_cpus: float = 0.0,
    description: str = "",
    equal_compute: SuiteConfig | None = None,
    scheduler: SchedulerSpec | None = None,
) -> Suite:
    """The suite, checked: every trial's config validates (as run.py's would) before any work, and
    so do the search or scheduler and the metric they optimise, which every trial must report."""
    if not configs and not grid:  # one configuration: the base settings alone
        configs = [SuiteConfig(_safe(str(base.get("algo", "fedavg"))))]
    suite = Suite(
        name=_safe(name),
        base=dict(base),
        configs=expand_grid(configs, grid, str(base.get("algo", "fedavg"))),
        seeds=tuple(seeds),
        search=search,
        scheduler=scheduler,
        driver_cpus=driver_cpus,
        description=description,
        equal_compute=equal_compute,
    )
    if not suite.configs:
        raise ConfigError(f"The suite {name} has no configuration to run.")
    names = [c.name for c in suite.configs]
    if len(set(names)) != len(names):
        raise ConfigError(f"The suite {name} names two configurations alike: {sorted(names)}.")
    if driver_cpus < 0:
        raise ConfigError(f"driver_cpus must be at least 0, not {driver_cpus}.")
    if search is not None and scheduler is not None:
        raise ConfigError(f"The suite {name} searches: its scheduler is the search's (search.scheduler), not its own.")
    if search is not None:
        _check_search(search)
    if scheduler is not None:
        _check_objective(scheduler.metric, scheduler.mode, "schedule")
        _check_scheduler(scheduler.name, None)
    # every trial validates now, not after hours of others
    checked = [(trial, trial_experiment(trial, Path("."))) for trial in trials(suite)]
    if search is not None:
        _check_sampled(suite)
        _check_reported(checked, search.metric, "search")
    if scheduler is not None:
        _check_reported(checked, scheduler.metric, "schedule")
    if equal_compute is not None:
        pair = {**base_for(suite.base, equal_compute.settings), **equal_compute.settings}
        trial_experiment(Trial(equal_compute.name, suite.seeds[0], pair), Path("."))
    return suite


def suite_of(
    suite_file: str | Path | None = None,
    *,
    base: Mapping[str, Any] | None = None,
    grid: Mapping[str, Sequence[Any]] | None = None,
    space: Mapping[str, str] | None = None,
    seeds: str | int | Sequence[int] | None = None,
    name: str | None = None,
    search: str | None = None,
    samples: int = 4,
    scheduler: str | None = None,
    metric: str | None = None,
    mode: str | None = None,
    driver_cpus: float | None = None,
) -> Suite:
    """The suite a suite file (or none) with these settings over every trial gives, checked: what
    ``scripts/sweep.py`` and ``raysim.sweep`` both build. ``base``: one value per dotted setting;
    ``grid``: several, each a configuration; ``space``: a range per setting, sampled by the
    ``search`` algorithm (``samples`` times). ``scheduler`` (e.g. asha) stops trials early, the
    search's or, without one, the grid's and seeds', optimising ``metric`` (default gm_gtest) in
    ``mode`` (default max). The file's settings, its search and scheduler too, go beneath these."""
    base, grid, space = dict(base or {}), dict(grid or {}), dict(space or {})
    if space and not search:
        raise ConfigError(f"{next(iter(space))} is given a range; name a search with --search (e.g. random).")
    if search and not space:
        raise ConfigError("--search needs a range for at least one setting, e.g. --set 'train.lr=loguniform(0.001,0.1)'.")
    file_suite = load_suite(suite_file) if suite_file is not None else None
    spec = SearchSpec(space, search, samples) if search else file_suite.search if file_suite else None
    # what the file schedules, beneath the arguments: its search's scheduler, or its own
    below: tuple[str | None, str | None, str | None] = (None, None, None)
    if file_suite is not None and file_suite.search is not None:
        below = (file_suite.search.scheduler, file_suite.search.metric, file_suite.search.mode)
    elif file_suite is not None and file_suite.scheduler is not None:
        below = (file_suite.scheduler.name, file_suite.scheduler.metric, file_suite.scheduler.mode)
    chosen = scheduler if scheduler is not None else below[0]
    metric = metric if metric is not None else below[1] or "gm_gtest"
    mode = mode if mode is not None else below[2] or "max"
    if spec is None and chosen is None and (metric, mode) != ("gm_gtest", "max"):
        given = f"--metric {metric!r}" if metric != "gm_gtest" else f"--mode {mode!r}"
        raise ConfigError(
            f"{given} is for a search or a scheduler to optimise, and this suite has neither: name one "
            "(--search or --scheduler), or leave it out."
        )
    sched = SchedulerSpec(chosen, metric, mode) if spec is None and chosen is not None else None
    if spec is not None:
        spec = dataclasses.replace(spec, scheduler=chosen, metric=metric, mode=mode)
    if file_suite is None:
        return make_suite(
            name=name or "sweep",
            base=base,
            configs=[],
            grid=grid,
            seeds=parse_seeds(seeds if seeds is not None else 0),
            search=spec,
            scheduler=sched,
            driver_cpus=driver_cpus or 0.0,
        )
    return make_suite(
        name=name or file_suite.name,
        base={**file_suite.base, **base},
        configs=file_suite.configs,
        grid=grid,
        seeds=parse_seeds(seeds) if seeds is not None else file_suite.seeds,
        search=spec,
        scheduler=sched,
        driver_cpus=driver_cpus if driver_cpus is not None else file_suite.driver_cpus,
        description=file_suite.description,
        equal_compute=file_suite.equal_compute,
    )


def parse_range(key: str, text: str) -> tuple[str, list[Any]]:
    """A searched setting's range: its kind and its values (numbers; a choice's may be words),
    checked: two bounds, the low one below the high one, positive for ``loguniform``, whole
    numbers for ``randint``, a positive step ``q``, at least one choice."""
    m = RANGE.match(text)
    if m is None:
        raise ConfigError(f"The search range of {key} is {text!r}; write {RANGE_FORMS}.")
    kind, args = m.group(1), [a.strip() for a in m.group(2).split(",") if a.strip()]
    if kind == "choice":
        if not args:
            raise ConfigError(f"The search range of {key}, {text!r}, chooses from nothing; name the values.")
        return kind, [_number(a) for a in args]
    want = 3 if kind.startswith("q") else 2
    if len(args) != want:
        form = f"{kind}(a, b, q)" if want == 3 else f"{kind}(a, b)"
        raise ConfigError(f"The search range of {key}, {text!r}, takes {want} numbers: {form}.")
    whole = kind in ("randint", "qrandint")
    nums: list[Any] = []
    for a in args:
        try:
            nums.append(int(a) if whole else float(a))
        except ValueError:
            what = "whole numbers" if whole else "numbers"
            raise ConfigError(f"The search range of {key}, {text!r}, takes {what}, not {a!r}.") from None
    low, high = nums[0], nums[1]
    if not low < high:
        raise ConfigError(f"The search range of {key}, {text!r}, needs its low bound below its high bound.")
    if kind == "loguniform" and low <= 0:
        raise ConfigError(f"The search range of {key}, {text!r}, is log-uniform: its bounds must be above 0.")
    if want == 3 and not nums[2] > 0:
        raise ConfigError(f"The search range of {key}, {text!r}, needs a step q above 0.")
    return kind, nums


def range_ends(kind: str, values: list[Any]) -> list[Any]:
    """The values at a range's ends (every value of a choice): what a sampled trial may be given
    at most, validated before any work (``randint``'s high bound is exclusive, as in Tune)."""
    if kind == "choice":
        return values
    return [values[0], values[1] - 1 if kind == "randint" else values[1]]


def _check_search(search: SearchSpec) -> None:
    for key, text in search.space.items():
        parse_range(key, text)
    if search.samples < 1:
        raise ConfigError(f"A search needs at least 1 sample, not {search.samples}.")
    _check_objective(search.metric, search.mode, "search")
    algorithm = search.algorithm.lower()
    if algorithm not in SEARCHERS:
        raise ConfigError(f"Unknown search algorithm {search.algorithm!r} (known: {', '.join(SEARCHERS)}).")
    import importlib.util

    missing = [m for m in SEARCHERS[algorithm] if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"The search algorithm {algorithm} needs the package {missing[0]}, which is not installed "
            f"(pip install it, or search with random)."
        )
    if search.scheduler is not None:
        _check_scheduler(search.scheduler, algorithm)


def _check_objective(metric: str, mode: str, verb: str) -> None:
    """The metric a search or scheduler optimises is one a trial reports to Tune, and the mode
    max or min (Tune's words, as they are)."""
    if mode not in ("max", "min"):
        noun = "search" if verb == "search" else "scheduler"
        raise ConfigError(f"The {noun}'s mode is max or min, not {mode!r}.")
    if metric not in SEARCH_METRICS:
        raise ConfigError(f"Unknown metric {metric!r} to {verb} on (known: {', '.join(SEARCH_METRICS)}).")


def _check_scheduler(name: str, algorithm: str | None) -> None:
    """A scheduler raysim's trials can run under (``algorithm``: the search's, None without one)."""
    scheduler = name.lower()
    if scheduler in UNSCHEDULABLE:
        raise ConfigError(
            f"The scheduler {scheduler} needs trials that save Tune checkpoints and settings to mutate, "
            f"which raysim's trials do not have; use one of {', '.join(SCHEDULERS)}."
        )
    if scheduler not in SCHEDULERS:
        raise ConfigError(f"Unknown scheduler {name!r} (known: {', '.join(SCHEDULERS)}).")
    if scheduler == "hb_bohb" and algorithm != "bohb":
        raise ConfigError("The scheduler hb_bohb goes with the search algorithm bohb (--search bohb).")


def _check_sampled(suite: Suite) -> None:
    """Every searched setting at each end of its range validates in the suite's trials (a rate
    range reaching below 0 is refused now, not in the trial that samples it)."""
    assert suite.search is not None
    for trial in trials(suite):
        for key, text in suite.search.space.items():
            for value in range_ends(*parse_range(key, text)):
                trial_experiment(trial, Path("."), {key: value})


def _check_reported(checked: Sequence[tuple[Trial, Experiment]], metric: str, verb: str) -> None:
    """Every trial (with its validated experiment) reports ``metric`` at each evaluation (Tune fails
    a trial whose result lacks the metric it optimises): an accuracy, or its weighted mean, only
    where the run fills its column (:func:`raysim.engine.targets.reported_metrics`); train_loss always."""
    from raysim.engine.targets import reported_metrics
    from raysim.results.metrics import METRICS

    column = metric.removesuffix("_weighted")
    for trial, exp in checked:
        cfg = exp.cfg
        if column not in METRICS or column in reported_metrics(cfg, exp.algorithm):
            continue
        if column.startswith("gm_"):
            raise ConfigError(f"{cfg.algo} has no global model, so its trials report no {metric} to {verb} on.")
        if column.startswith("updated_lm_"):
            raise ConfigError(f"{metric} is reported only with eval.updated_lm=true, which {trial.name} does not set.")
        if column.startswith("new_") and cfg.eval.new_clients == 0:
            raise ConfigError(f"{metric} is reported only with eval.new_clients > 0, which {trial.name} does not set.")
        if column.startswith("new_"):
            raise ConfigError(f"{cfg.algo} gives a client that never trained no model, so its trials report no {metric} to {verb} on.")
        raise ConfigError(f"{cfg.algo} has no personal models, so its trials report no {metric} to {verb} on.")


def trials(suite: Suite) -> list[Trial]:
    """Every configuration with every seed, in table order."""
    return [
        Trial(c.name, seed, with_references(base_for(suite.base, c.settings), c.settings))
        for c in suite.configs
        for seed in suite.seeds
    ]


def base_for(base: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The suite's base beneath a configuration: without the algorithm parameters (``algo.X``) of
    the base's algorithm that the configuration's algorithm does not take (a suite of Fed3+2p's
    readings with its FedAvg baseline, say)."""
    algo = str(settings.get("algo", base.get("algo", "fedavg")))
    return {k: v for k, v in base.items() if not k.startswith("algo.") or _algorithm_has(algo, k.split(".", 1)[1])}


_REFERENCE = re.compile(r"^\{(.+)\}$")


def with_references(base: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``settings`` over it, where a value ``{expression}`` is computed from the
    values before it was set, e.g. Fed3+2p's ``algo.phase1_rounds: "{rounds}"`` with
    ``rounds: "{rounds * 3 // 2}"`` (the last part of a key names its value: ``rounds``,
    ``local_epochs``; whole numbers, + - * //)."""
    import ast

    merged = {**base, **settings}
    plain = {k: v for k, v in merged.items() if not (isinstance(v, str) and _REFERENCE.match(v))}
    names = {k.rsplit(".", 1)[-1]: v for k, v in {**base, **plain}.items() if not isinstance(v, str) or not _REFERENCE.match(v)}

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return int(names[node.id])
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
            a, b = value(node.left), value(node.right)
            ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b, ast.FloorDiv: a // b if b else 0}
            return ops[type(node.op)]
        raise ConfigError(f"{ast.unparse(node)!r} is not a whole-number expression of the settings ({', '.join(names)}).")

    out = dict(plain)
    for key, v in merged.items():
        if key not in plain:
            expr = _REFERENCE.match(v)
            assert expr is not None
            try:
                out[key] = value(ast.parse(expr.group(1), mode="eval").body)
            except SyntaxError:
                raise ConfigError(f"The setting {key} = {v!r} is not an expression.") from None
    return out


def trial_experiment(trial: Trial, run_dir: Path, sampled: Mapping[str, Any] | None = None) -> Experiment:
    """The trial's experiment, as ``run.py`` with its settings would resolve and check it (the
    algorithm's paper setup beneath them), in ``run_dir`` on the Ray session it runs in."""
    from raysim.engine.experiment import resolve_config, validate

    nested: dict[str, Any] = {}
    for key, value in {**trial.settings, **(sampled or {})}.items():
        set_dotted(nested, key, value)
    set_dotted(nested, "seed", trial.seed)
    set_dotted(nested, "output.out", str(run_dir))
    set_dotted(nested, "output.progress", False)
    set_dotted(nested, "ray.executor", "ray")
    nested.setdefault("ray", {}).setdefault("workers", 1)
    cfg = resolve_config(nested)
    if in_trial_process(cfg):
        cfg = dataclasses.replace(cfg, ray=dataclasses.replace(cfg.ray, executor="serial"))
    return validate(cfg)


def in_trial_process(cfg: ExperimentConfig) -> bool:
    """Whether a trial runs in its own Tune process on the serial executor: when it has one client
    worker on CPUs with one job slot, which would train its jobs one after another just as the
    serial executor does, with the same numbers (docs/design.md). That saves the trial two actor
    starts (a worker importing PyTorch, and the server) and the object store's traffic; its
    placement group is then one bundle with the worker's CPUs, so suites pack tighter (commit
    37eed2d)."""
    r = cfg.ray
    return r.executor == "ray" and r.workers == 1 and r.gpus_per_worker == 0 and cfg.worker_jobs == 1


def to_yaml(suite: Suite) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": suite.name,
        "description": suite.description,
        "base": dict(suite.base),
        "configs": [{"name": c.name, "set": dict(c.settings), "paper": c.paper} for c in suite.configs],
        "seeds": list(suite.seeds),
        "driver_cpus": suite.driver_cpus,
    }
    if suite.search is not None:
        out["search"] = dataclasses.asdict(suite.search)
    if suite.scheduler is not None:
        out["scheduler"] = dataclasses.asdict(suite.scheduler)
    if suite.equal_compute is not None:
        out["equal_compute"] = {"name": suite.equal_compute.name, "set": dict(suite.equal_compute.settings)}
    if suite.claims:
        from raysim.suite.claims import claim_dict

        out["claims"] = [claim_dict(c) for c in suite.claims]
    if suite.paper_setting:
        out["paper_setting"] = dict(suite.paper_setting)
    if suite.against is not None:
        out["against"] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in suite.against.items()}
    if suite.regimes is not None:
        out["regimes"] = {k: dict(v) if isinstance(v, Mapping) else (list(v) if isinstance(v, (list, tuple)) else v) for k, v in suite.regimes.items()}
    return out


def _number(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text.strip("'\"")


def default_suite_dir(suite: Suite) -> Path:
    """Where a suite goes when no directory is named: ``runs/suite-NAME-TIME``."""
    import time

    return Path(f"runs/suite-{suite.name}-{time.strftime('%Y%m%d-%H%M%S')}")


def write_yaml(path: Path, data: Mapping[str, Any]) -> None:
    import yaml

    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))


__all__ = [
    "RANGE",
    "RANGE_FORMS",
    "SCHEDULERS",
    "SEARCHERS",
    "SEARCH_METRICS",
    "STARTS_FILE",
    "SUITE_FILE",
    "TRIAL_FILE",
    "UNSCHEDULABLE",
    "SchedulerSpec",
    "SearchSpec",
    "Suite",
    "SuiteConfig",
    "Trial",
    "base_for",
    "default_suite_dir",
    "dotted",
    "expand_grid",
    "trial_experiment",
    "load_suite",
    "make_suite",
    "parse_range",
    "parse_seeds",
    "range_ends",
    "setting_key",
    "suite_of",
    "to_yaml",
    "trials",
    "with_references",
    "write_yaml",
    "yaml_safe_load",
]
