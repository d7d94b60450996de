"""A suite's published page, generated from its directory: ``raysim report --publish SUITE_DIR OUT``.

``OUT`` (e.g. ``docs/results/fedfcd_table1``) receives

- ``README.md``: the suite's name and description, its budget (the settings every row shares, the
  rounds run, the seeds), the commit of the code that collected it (and, where the trials recorded
  others, the commits they ran at), the wall time, and a table with a row
  per configuration: the mean ± std over seeds of the final value and of the last-k mean of each
  metric, and the mean of each seed's best (the figure papers that report the highest accuracy
  compare with), beside the paper's figure; then (folded) each trial's final value and last-k
  mean, seed by seed; (folded) each configuration's training and evaluation time per round; the
  paper's setting against what ran and the paper's claims judged (``raysim.suite.claims``), where
  the suite file declares them; where the trials ran with ``eval.analyses``, the global model's accuracy on
  each class of G-Test at the last evaluation, a row per configuration (mean over seeds); then the
  curves, and ``notes.md`` if ``OUT`` has one;
- ``summary.json``: the suite's own summary, as the suite wrote it;
- ``accuracy_<metric>.png``: each configuration's curve, the mean over seeds with a one-std band,
  as small multiples (:mod:`raysim.results.curves`: a panel per regime, deployment or budget, the
  algorithm families in their own colours);
  where the trials ran a simulated deployment whose devices take time, also
  ``accuracy_<metric>_sim_time.png``, the same against the simulated clock (and the table gains the
  simulated time, and with ``eval.target`` the simulated time to the target); where the trials ran
  under differential privacy the table gains each configuration's epsilon spent (its summary's
  ``epsilon_mean``: the trials' ``epsilon``, mean over seeds);
- where the suite file has ``regimes`` (:mod:`raysim.suite.regimes`): a table per regime, sorted by
  one metric, the global and the local models side by side, the rows near chance named;
- where the suite file has ``against`` (:mod:`raysim.suite.against`): a table per metric of each
  series' final value against a setting, the privacy each trial spent where it ran under DP, and
  ``against_<axis>_<metric>.png``;
- else where configurations sweep a numeric setting and are named for it as a grid names them
  (``fedavg_participation=0.05``; :mod:`raysim.suite.sweeps`): each series' final value against
  the setting, a panel per setting and per value of the other settings in the names,
  ``sweep_<metric>.png``;
- ``suite/``: the suite's record (:mod:`raysim.suite.records`), a slim suite directory the page
  can be published again from, and a suite can be resumed from.

Only ``notes.md`` is written by hand: the judgement (which claims hold, and why) stays prose beside
the generated table, and publishing again keeps it. Every number on the page comes from the suite
directory. ``OUT``'s parent gets an index (``README.md``) of every page published beside it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from raysim.errors import ConfigError
from raysim.results.report import class_accuracy_table, curve_plots, per_seed_table, suite_table

log = logging.getLogger(__name__)

PAGE = "README.md"
NOTES = "notes.md"
#: beside the page: the suite's record (raysim.suite.records), which the page can be drawn again from
RECORD = "suite"
#: the base settings shown as the budget, in this order (the rounds run come from the summary)
BUDGET_KEYS = (
    "data.dataset",
    "model",
    "data.partition",
    "data.test_mode",
    "clients",
    "participation",
    "train.local_epochs",
    "train.batch_size",
    "train.lr",
)


def _num_classes(base: dict[str, Any]) -> int | None:
    """The classes of the suite's dataset (for what chance is), or None where it cannot be told."""
    from raysim.config import DataConfig
    from raysim.registry import DATASETS

    name = base.get("data.dataset")
    if name is None or name not in DATASETS:
        return None
    return int(DATASETS.get(str(name)).num_classes(DataConfig(dataset=str(name))))


def _budget(base: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    rounds = sorted({r for c in summary["configs"] for r in c["rounds"]})
    seeds = sorted({s for c in summary["configs"] for s in c["seeds"]})
    shown = [f"`{k}={base[k]}`" for k in BUDGET_KEYS if k in base]
    out = [
        f"- rounds run: {', '.join(map(str, rounds))} (the suite file's are in its header; "
        "a row with fewer stopped early)",
        f"- seeds: {', '.join(map(str, seeds))} ({summary['trials']} trials)",
    ]
    if shown:
        out.append("- shared settings: " + ", ".join(shown))
    return out


def _trial_summaries(suite_dir: Path) -> dict[str, dict[str, Any]]:
    """Each finished trial's ``summary.json`` by its name, read once for the budget's lines."""
    return {s.parent.name: json.loads(s.read_text()) for s in sorted((suite_dir / "runs").glob("*/summary.json"))}


def _wall_time(suite_dir: Path, trials: dict[str, dict[str, Any]]) -> list[str]:
    """The suite's elapsed time (first trial start to last trial end, any pause included) and the
    sum of its trials' own times (set-up, training, evaluation).

    Both ends come from the suite's ``trial_starts.log``, never from file times (a record's copy or
    a git checkout stamps its own): a trial's end is its ``end`` line or, in a log written before
    trials wrote one, its last start or resume plus its own time."""
    from raysim.suite.spec import STARTS_FILE

    def own(run: dict[str, Any]) -> float:
        return sum(float(run.get(k) or 0.0) for k in ("setup_time_s", "train_time_s", "eval_time_s"))

    out = [f"- trials' own time, summed: {sum(own(run) for run in trials.values()) / 3600:.2f} h"]
    starts_file = suite_dir / STARTS_FILE
    starts: list[float] = []
    last_start: dict[str, float] = {}
    ended: dict[str, float] = {}
    for line in starts_file.read_text().splitlines() if starts_file.exists() else []:
        if not line.strip():
            continue
        name, what, at = line.split()[:3]
        if what == "end":
            ended[name] = float(at)
        else:
            last_start[name] = float(at)
            starts.append(float(at))
    ends = [
        ended[name] if name in ended else last_start[name] + own(run)
        for name, run in trials.items()
        if name in ended or name in last_start
    ]
    if starts and ends:
        out.append(
            f"- elapsed, first trial start to last trial end (pauses included): {(max(ends) - min(starts)) / 3600:.2f} h"
        )
    return out


def _machine_name(m: dict[str, Any]) -> str:
    gpu = f", {m['gpu']}" if m.get("gpu") else ""
    return f"{m['processor']} ({m['cpu_capability']}, {m['cpus']} CPUs{gpu}), torch {m['torch']}"


def _counted(names: list[str | None]) -> str:
    """Each of ``names`` with how many trials gave it, the most first and the trials that recorded
    none ("not recorded") last: ``A (5 trials); B (2 trials); not recorded (1 trial)``."""
    from collections import Counter

    counts = Counter(names)
    order = sorted(counts, key=lambda name: (name is None, -counts[name], str(name)))
    return "; ".join(f"{name or 'not recorded'} ({counts[name]} trial{'s' if counts[name] != 1 else ''})" for name in order)


def _machines(trials: dict[str, dict[str, Any]]) -> list[str]:
    """Which machines ran the trials (each trial's ``summary.json`` ``machine``), with how many each:
    the processor, the instruction set PyTorch dispatched to, the CPUs, the GPU and PyTorch's version,
    what a rerun elsewhere may differ in beyond the seed; "not recorded" for trials that predate it."""
    names = [_machine_name(run["machine"]) if run.get("machine") else None for run in trials.values()]
    if not names:
        return []
    return [f"- {'machine' if len(set(names)) == 1 else 'machines'}: {_counted(names)}"]


def _trial_commits(trials: dict[str, dict[str, Any]], commit: str | None) -> list[str]:
    """Which commits the trials themselves ran at (each trial's ``summary.json`` ``commit``), with
    how many each, where any trial recorded one other than the suite's ``commit`` (a suite resumed
    at a newer commit, or trials carried in from another run); "not recorded" for trials that
    predate the record."""
    commits = [run.get("commit") for run in trials.values()]
    if not any(c is not None and c != commit for c in commits):
        return []
    return [f"- the trials' code: {_counted([f'`{c}`' if c else None for c in commits])}"]


def time_table(suite_dir: Path, summary: dict[str, Any]) -> str:
    """A markdown table, one row per configuration: the mean over its seeds of each trial's own
    training and evaluation time per round (``train_time_s``, ``eval_time_s`` over ``rounds``, from
    the trials' ``summary.json``), in seconds; "" when no trial recorded them. Trials that ran side
    by side on shared cores count each other's load: compare rows of one suite, run together."""
    from raysim.suite.claims import trial_timings

    per: dict[str, list[tuple[float, float]]] = {}
    for (config, _), timing in trial_timings(suite_dir).items():
        per.setdefault(config, []).append(timing)
    if not per:
        return ""
    lines = ["| configuration | trials | training (s/round) | evaluation (s/round) |", "|---|---|---|---|"]
    for c in summary["configs"]:
        got = per.get(c["config"], [])
        if got:
            train, evaluate = (sum(x) / len(got) for x in zip(*got, strict=True))
            lines.append(f"| {c['config']} | {len(got)} | {train:.2f} | {evaluate:.2f} |")
    return "\n".join(lines) + "\n"


def _paper_sections(spec: dict[str, Any], src: Path, summary: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The page's sections on the paper: its setting against what ran, and its claims judged."""
    from raysim.suite.claims import (
        claims_table,
        judge,
        parse_claims,
        setting_differences,
        shown,
        trial_times,
        trial_values,
    )
    from raysim.suite.spec import dotted, yaml_safe_load

    # the suite's configurations, run or not (a claim on a row that never finished cannot be told)
    names = [c["config"] for c in summary["configs"]]
    names += [str(c["name"]) for c in spec.get("configs") or [] if str(c.get("name")) not in names]
    claims = parse_claims(spec.get("claims"), names, str(src / "suite.yaml"))
    paper = dotted(spec.get("paper_setting"), "paper_setting")
    out: list[str] = []
    if paper:
        ran = {}
        for c in summary["configs"]:
            seeds = sorted(c["seeds"])
            saved = src / "runs" / f"{c['config']}-seed{seeds[0]}" / "config.yaml" if seeds else None
            if saved is not None and saved.is_file():
                ran[c["config"]] = yaml_safe_load(saved)
        lines = setting_differences(paper, ran)
        stated = ", ".join(f"`{k}={shown(v)}`" for k, v in paper.items()).replace("|", "\\|")
        out += [
            "## The paper's setting against what ran",
            "",
            f"The paper's setting for what this page reproduces, as the suite file states it: {stated}. "
            "Every setting that ran otherwise (from each configuration's saved config):",
            "",
            *(lines or ["- none: every stated setting ran as the paper's"]),
            "",
        ]
    if "claims" in spec and not claims:
        out += [
            "## Claims",
            "",
            "The suite file declares no claim of the paper's that this page's numbers can judge (its "
            "comments say why); the page gives the numbers and curves only.",
            "",
        ]
    if claims:
        trials = trial_values(rows, int(spec.get("base", {}).get("eval.last_k", 5)), trial_times(src))
        seeds = sorted({int(x) for c in summary["configs"] for x in c["seeds"]})
        verdicts = [judge(c, trials, seeds) for c in claims]
        out += [
            "## Claims",
            "",
            "The paper's claims the suite file declares, judged on every seed from this page's runs "
            "(raysim/suite/claims.py): \"holds on every seed\", \"holds on k of n\", \"does not hold\" "
            "(every seed misses, by more than the seeds' spread) or \"cannot be told\" (every seed "
            "misses, within the spread, or a number is missing). The margin is how far each seed's "
            "values clear the claim, in the claim's unit (points for an accuracy; negative: short of it).",
            "",
            claims_table(verdicts),
        ]
    return out


def publish(
    suite_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    commit: str | None = None,
    suite_file: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """Write the page of the suite in ``suite_dir`` into ``out_dir`` and the index beside it (unless a
    README.md there is not one: :func:`write_index`).
    ``commit``: the code's commit when the suite did not record it; ``suite_file``: the suite file
    whose claims and paper setting the page judges by (default the suite directory's own copy; a
    newer file for a suite run before its claims were written, whose configurations it must
    name). Returns the paths written, the page first."""
    import pyarrow.parquet as pq

    src, out = Path(suite_dir), Path(out_dir)
    if not (src / "summary.json").is_file() or not (src / "metrics.parquet").is_file():
        raise ConfigError(
            f"{src} is not a suite directory with results (no summary.json and metrics.parquet)."
        )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} exists and is not a directory.")
    record = out / RECORD
    own_record = record.resolve() == src.resolve()  # published from its own record: that stays as it is
    if not own_record:  # the record beside the page: refused now, not after the page is written
        from raysim.suite.records import check_record

        check_record(src, record)
    summary = json.loads((src / "summary.json").read_text())
    trials = _trial_summaries(src)
    commit = summary.get("commit") or commit
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "summary.json", out / "summary.json")
    rows = pq.read_table(src / "metrics.parquet").to_pylist()
    extra_pngs: list[Path] = []  # an against or sweep section's figures
    from raysim.suite.layout import suite_layout
    from raysim.suite.spec import yaml_safe_load

    spec = yaml_safe_load(src / "suite.yaml")
    if suite_file is not None:
        from raysim.config import load_config_file
        from raysim.suite.spec import load_suite

        given = load_config_file(suite_file)
        configs = [{"name": c.name} for c in load_suite(Path(suite_file)).configs]
        spec = {
            **spec, "configs": configs, "claims": given.get("claims"), "paper_setting": given.get("paper_setting"),
            "against": given.get("against"), "regimes": given.get("regimes"),
        }  # fmt: skip
    pngs = curve_plots(rows, out, suite_layout(src, summary, spec))
    description = spec.get("description", "")
    parts = [
        f"# {summary['suite']}",
        "",
        *([str(description), ""] if description else []),
        f"Generated by `raysim report --publish` from the suite directory; do not edit by hand "
        f"(hand-written notes go in `{NOTES}`, which publishing again keeps). Its record, "
        f"[`{RECORD}/`]({RECORD}/), is a slim suite directory (each trial's settings, metrics and "
        f"summary): `raysim report --publish` of it into this directory draws the page again, and "
        f"`scripts/sweep.py --resume` of a copy runs only the trials it lacks.",
        "",
        "## Budget",
        *_budget(spec.get("base", {}), summary),
        f"- code: {'commit `' + commit + '`' if commit else 'commit not recorded'}",
        *_trial_commits(trials, commit),
        *_wall_time(src, trials),
        *_machines(trials),
        "",
        "## Results",
        "",
        "Accuracies in %, mean ± std over seeds (the population std, numpy's default): the value after the last round (final) and the mean "
        "of the last k evaluations (last k); best is the mean over seeds of each seed's highest "
        "evaluated value. The paper's figure is as the suite file quotes it.",
        "",
        suite_table(summary),
        "<details><summary>Per seed: each trial's final value and last-k mean (%)</summary>",
        "",
        per_seed_table(rows, summary, int(spec.get("base", {}).get("eval.last_k", 5))),
        "</details>",
        "",
    ]
    times = time_table(src, summary)
    if times:
        parts += [
            "<details><summary>Time per round: each trial's own training and evaluation time over its "
            "rounds, mean over seeds (s)</summary>",
            "",
            times,
            "</details>",
            "",
        ]
    if spec.get("regimes") is not None:  # tables by regime, sorted (raysim.suite.regimes)
        from raysim.suite.regimes import parse_regimes, regime_sections

        regimes = parse_regimes(spec["regimes"], [c["config"] for c in summary["configs"]], str(src / "suite.yaml"))
        parts += regime_sections(regimes, summary, _num_classes(spec.get("base", {})), rows)
    if spec.get("against") is not None:  # series against a setting (raysim.suite.against)
        from raysim.suite.against import against_sections, parse_against

        against = parse_against(spec["against"], [c["config"] for c in summary["configs"]], str(src / "suite.yaml"))
        section, extra_pngs = against_sections(against, summary, src, out)
        parts += section
    else:  # configurations that sweep a setting, named KEY=VALUE (raysim.suite.sweeps)
        from raysim.suite.sweeps import sweep_plan, sweep_sections

        plan = sweep_plan(summary, src, spec)
        if plan is not None:
            section, extra_pngs = sweep_sections(plan, summary, out)
            parts += section
    parts += _paper_sections(spec, src, summary, rows)
    class_table = class_accuracy_table(rows, summary)
    if class_table:  # eval.analyses (raysim.results.analysis)
        parts += [
            "## Per-class accuracy of the global model",
            "",
            "The global model's accuracy on each class of G-Test (its recall: the share of the class's "
            "test samples it classifies right) at each trial's last evaluation, in %, mean over seeds; "
            "a model that predicts a single class shows 100 in that class's column and 0 in the others.",
            "",
            class_table,
        ]
    if pngs:
        parts += ["## Curves", "", *(f"![{p.stem}]({p.name})" for p in pngs), ""]
    if (out / NOTES).is_file():
        parts += ["## Notes", "", (out / NOTES).read_text().strip(), ""]
    page = out / PAGE
    page.write_text("\n".join(parts).rstrip() + "\n")
    if not own_record:
        from raysim.suite.records import copy_record

        copy_record(src, record)
    index = write_index(out.parent)
    return [page, out / "summary.json", *pngs, *extra_pngs, record, *([index] if index else [])]


#: the first line of the index write_index keeps beside the pages
INDEX_HEAD = "# Results"


def write_index(results_dir: str | os.PathLike[str]) -> Path | None:
    """``results_dir/README.md``: a line per published page below it (its suite, rows, seeds and
    rounds), from each page's ``summary.json``; a folder beside them that is not a page (no
    README.md, or a summary.json that is not a suite's) is left out. An existing README.md that is
    not such an index (a page published into a project's folder, whose README is the project's) is
    left alone, and None returned."""
    root = Path(results_dir)
    index = root / PAGE
    if index.is_file() and index.read_text().split("\n", 1)[0] != INDEX_HEAD:
        log.info("%s is not an index of results pages; left as it is", index)
        return None
    lines = [
        INDEX_HEAD,
        "",
        "Each page is generated from a suite's directory by `raysim report --publish SUITE_DIR "
        "docs/results/NAME`; the numbers are the suite's, never typed.",
        "",
        "| suite | rows | seeds | rounds |",
        "|---|---|---|---|",
    ]
    for summary_path in sorted(root.glob("*/summary.json")):
        if not (summary_path.parent / PAGE).is_file():
            continue
        s = json.loads(summary_path.read_text())
        if not isinstance(s, dict) or not {"suite", "configs"} <= s.keys():
            continue  # a run's summary, or another tool's
        seeds = sorted({x for c in s["configs"] for x in c["seeds"]})
        rounds = sorted({r for c in s["configs"] for r in c["rounds"]})
        name = summary_path.parent.name
        lines.append(
            f"| [{s['suite']}]({name}/{PAGE}) | {len(s['configs'])} | {', '.join(map(str, seeds))} | "
            f"{', '.join(map(str, rounds))} |"
        )
    index.write_text("\n".join(lines) + "\n")
    return index


__all__ = ["INDEX_HEAD", "NOTES", "PAGE", "RECORD", "publish", "time_table", "write_index"]
