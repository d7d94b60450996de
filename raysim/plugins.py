"""User code that extends raysim: the modules a run imports in every process (``plugins``).

An algorithm, a dataset, a partition, a local test mode or a model registered from a user's own code
(``@algorithms.base.register("mine")``, ``raysim.registry.DATASETS.register(...)``) exists in the
process that ran that code. A run's other processes (Ray's client workers, the server actor, a
suite's trials) import the modules named in the config's ``plugins`` before they read a registry, so
the same registrations happen there; ``raysim.run`` fills ``plugins`` with the modules that defined
the entries the config names (:func:`used_plugins`), and ``--set plugins=[mypackage.algos]`` names
them on the command line. A plugin is

- ``package.module``: imported as it is (it must be importable everywhere);
- ``package.module@/path/to/root``: imported with the root put on ``sys.path`` first (a module of a
  project that is not installed, e.g. a test module);
- ``/path/to/script.py``: a script, loaded by its path under a name of its own; in the process where
  the script is ``__main__`` (it ran the experiment) that name refers to ``__main__`` itself, so it
  does not register twice.

A plugin adds callbacks as it adds algorithms: ``register_callback("name", factory)`` (or as a
decorator), where ``factory(cfg)`` makes the callback (:class:`raysim.results.output.BaseCallback`);
a run's ``output.callbacks`` (``--set output.callbacks=[name]``) names the ones it runs with, in
whichever process drives it (a command, a suite's trial), after the callbacks given to
``raysim.run``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysim.errors import ConfigError
from raysim.registry import Registry

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig

#: raysim's own modules: never a plugin
OWN = ("raysim", "algorithms")

#: name -> ``factory(cfg)`` making a callback, for ``output.callbacks``
CALLBACKS: Registry[Callable[[ExperimentConfig], Any]] = Registry("callback")


def register_callback(name: str, factory: Callable[[ExperimentConfig], Any] | None = None) -> Any:
    """Register ``factory`` (a callback class, or any ``factory(cfg)`` making one) as the callback
    ``name`` for ``output.callbacks``; without ``factory``, a decorator."""
    if factory is None:
        return lambda f: register_callback(name, f)
    CALLBACKS.register(name, factory)
    return factory


def registered_callbacks(cfg: ExperimentConfig) -> list[Any]:
    """The callbacks ``cfg``'s ``output.callbacks`` names, made for this run (its plugins imported
    first); an unknown name is a ConfigError naming the known ones."""
    if not cfg.output.callbacks:
        return []
    load_plugins(cfg.plugins)
    return [CALLBACKS.get(name)(cfg) for name in cfg.output.callbacks]


def script_module_name(path: str | Path) -> str:
    """The module name a script plugin is loaded under (the same in every process)."""
    p = Path(path).resolve()
    digest = hashlib.sha1(str(p).encode()).hexdigest()[:10]
    return f"raysim_plugin_{p.stem}_{digest}"


def load_plugins(plugins: Iterable[str]) -> None:
    """Import every plugin (each once a process)."""
    for spec in plugins:
        if "@" not in spec and (spec.endswith(".py") or "/" in spec):  # a script's path
            _load_script(spec)
            continue
        module, _, root = spec.partition("@")
        if module in sys.modules:
            continue
        if root and root not in sys.path:
            sys.path.insert(0, root)
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is not None and module.startswith(e.name):  # the plugin itself, not an import of its
                raise ConfigError(f"The plugin {spec!r} cannot be imported ({e}).") from None
            raise ConfigError(f"The plugin {spec!r} {_failure(e)}.") from None
        except Exception as e:  # a syntax error, or any error its code raised on import
            raise ConfigError(f"The plugin {spec!r} {_failure(e)}.") from None


def _load_script(path: str) -> None:
    name = script_module_name(path)
    if name in sys.modules:
        return
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    if main is not None and main_file is not None and Path(main_file).resolve() == Path(path).resolve():
        sys.modules[name] = main  # this process ran the script: its registrations are done
        return
    if not Path(path).is_file():
        raise ConfigError(f"The plugin script {path} does not exist.")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # a syntax error, or any error its code raised on import
        del sys.modules[name]
        raise ConfigError(f"The plugin script {path} {_failure(e)}.") from None
    except BaseException:
        del sys.modules[name]
        raise


def _failure(e: Exception) -> str:
    """Why a plugin failed to import, as a clause naming the file and line: a syntax error's own,
    else the last line in the traceback that is not raysim's or Python's import machinery."""
    import traceback

    what = f"{type(e).__name__}: {e.msg if isinstance(e, SyntaxError) else e}".rstrip(".")
    if isinstance(e, SyntaxError) and e.filename:
        return f"does not compile ({what}; {e.filename}, line {e.lineno})"
    own = str(Path(__file__).resolve().parent)
    frames = [
        f for f in traceback.extract_tb(e.__traceback__)
        if not f.filename.startswith("<") and not str(Path(f.filename).resolve()).startswith(own)
    ]  # fmt: skip
    at = f"; {frames[-1].filename}, line {frames[-1].lineno}" if frames else ""
    return f"failed on import ({what}{at})"


def plugin_of(obj: Any) -> str | None:
    """The plugin that defines ``obj`` (a registry entry's code: an object or a ``module:attr``
    reference), or None for raysim's own code and for what every process imports anyway."""
    module = obj.partition(":")[0] if isinstance(obj, str) else getattr(obj, "__module__", None)
    if not module or module.split(".")[0] in OWN:
        return None
    loaded = sys.modules.get(module)
    file = getattr(loaded, "__file__", None)
    if module == "__main__":
        if file is None or not Path(file).is_file():  # a notebook, a REPL, python -c or stdin
            raise ConfigError(
                "A registered entry was defined in an interactive session; the Ray workers cannot "
                "import it: put it in a module (or run with executor='serial')."
            )
        return str(Path(file).resolve())
    if file is None:
        return module
    path = Path(file).resolve()
    depth = len(module.split(".")) + (1 if path.name == "__init__.py" else 0)
    return f"{module}@{path.parents[depth - 1]}"


def used_plugins(cfg: ExperimentConfig) -> tuple[str, ...]:
    """The plugins defining what ``cfg`` names (its algorithm, dataset, partition, local test mode
    and model), after those it lists already."""
    from raysim.registry import ALGORITHMS, DATASETS, MODELS, PARTITIONS, TEST_MODES

    load_plugins(cfg.plugins)
    code: list[Any] = []
    if ":" not in cfg.algo and cfg.algo in ALGORITHMS:
        code.append(ALGORITHMS.get(cfg.algo))
    if cfg.data.dataset in DATASETS:
        code.append(DATASETS.get(cfg.data.dataset).loader)
    if cfg.model in MODELS:
        code.append(MODELS.get(cfg.model).builder)
    kind = cfg.data.partition.split(":")[0]
    if kind in PARTITIONS:
        code.append(PARTITIONS.get(kind).split)
    mode = cfg.data.test_mode.split(":")[0]
    if mode in TEST_MODES:
        code.append(TEST_MODES.get(mode).build)
    code.extend(CALLBACKS.get(name) for name in cfg.output.callbacks if name in CALLBACKS)
    out = list(cfg.plugins)
    for obj in code:
        try:
            spec = plugin_of(obj)
        except ConfigError:
            if cfg.ray.executor == "serial":  # defined in a notebook: this one process is enough
                continue
            raise
        if spec is not None and spec not in out:
            out.append(spec)
    return tuple(out)


__all__ = ["CALLBACKS", "load_plugins", "plugin_of", "register_callback", "registered_callbacks", "script_module_name", "used_plugins"]
