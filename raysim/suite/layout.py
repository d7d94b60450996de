"""A finished suite's curves laid out as small multiples (:mod:`raysim.results.curves`): each
configuration's algorithm, and its panel from the suite file's ``regimes`` or ``against``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raysim.errors import ConfigError
from raysim.results.curves import Layout, layout
from raysim.suite.spec import yaml_safe_load


def config_algorithms(suite_dir: Path, summary: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, str | None]:
    """Each configuration of ``summary`` (in its order) -> its algorithm: its first trial's saved
    config's, the suite file's settings where none was saved."""
    base_algo = (spec.get("base") or {}).get("algo")
    declared = {str(c.get("name")): (c.get("set") or {}).get("algo", base_algo) for c in spec.get("configs") or []}
    out: dict[str, str | None] = {}
    for c in summary["configs"]:
        algo = declared.get(c["config"], base_algo)
        for seed in sorted(c["seeds"])[:1]:
            saved = suite_dir / "runs" / f"{c['config']}-seed{seed}" / "config.yaml"
            algo = yaml_safe_load(saved).get("algo", algo) if saved.is_file() else algo
        out[str(c["config"])] = None if algo is None else str(algo)
    return out


def suite_layout(
    suite_dir: str | Path, summary: Mapping[str, Any] | None = None, spec: Mapping[str, Any] | None = None
) -> Layout:
    """The layout of the suite in ``suite_dir``: each configuration's algorithm from its first
    trial's saved config (the suite file's settings where none was saved), its panels from the
    suite file's ``regimes`` or ``against``, the curves' axis from its ``regimes``' ``x``.
    ``summary`` and ``spec`` (the suite file read): the suite directory's own ``summary.json`` and
    ``suite.yaml`` unless given."""
    src = Path(suite_dir)
    if summary is None:
        if not (src / "summary.json").is_file():
            raise ConfigError(f"{src} is not a finished suite directory (it has no summary.json).")
        summary = json.loads((src / "summary.json").read_text())
    spec = spec if spec is not None else yaml_safe_load(src / "suite.yaml")
    configs = list(config_algorithms(src, summary, spec).items())
    names = [name for name, _ in configs]
    where = str(src / "suite.yaml")
    suffixes: list[tuple[str, str]] = []
    x = "round"
    if spec.get("regimes") is not None:
        from raysim.suite.regimes import parse_regimes

        regimes = parse_regimes(spec["regimes"], names, where)
        suffixes, x = list(regimes.suffixes), regimes.x
    elif spec.get("against") is not None:
        from raysim.suite.against import parse_against, value_label

        against = parse_against(spec["against"], names, where)
        suffixes = [(s, f"{against.axis} = {value_label(v)}") for s, v in against.values]
    return dataclasses.replace(layout(configs, suffixes), x=x)


__all__ = ["config_algorithms", "suite_layout"]
