"""``raysim report --publish``: a suite directory in, its page out, every number on the page the
suite's ``summary.json``'s. The suite directory is made by the suite's own code (its trials run
serially here, without Ray: a trial's directory is what a suite's trial writes) and collected by
``raysim.suite.results.collect``."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from raysim.commands.console import main as console_main
from raysim.engine.runner import run_experiment
from raysim.suite import load_suite, trials
from raysim.suite.results import collect
from raysim.suite.spec import SUITE_FILE, TRIAL_FILE, to_yaml, trial_experiment, write_yaml

SUITE = """
name: tiny_table
description: two algorithms on two partitions, a tiny table
base:
  dataset: synthetic
  model: mlp_fcd
  clients: 6
  participation: 0.5
  rounds: 3
  local_epochs: 1
  batch_size: 20
  lr: 0.05
  output.tensorboard: false
  data.synthetic.shape: [1, 8, 8]
  data.synthetic.train_samples: 600
  data.synthetic.test_samples: 300
seeds: 0-1
grid:
  partition: [dirichlet:0.5, dirichlet:0.1]
configs:
  - {name: fedavg, set: {algo: fedavg}, paper: "81.1 / 81.3"}
  - {name: fedrep, set: {algo: fedrep}, paper: "79.5 / 80.1"}
"""


def make_suite_dir(tmp_path: Path, text: str = SUITE) -> Path:
    (tmp_path / "tiny.yaml").write_text(text)
    suite = load_suite(tmp_path / "tiny.yaml")
    suite_dir = tmp_path / "suite"
    suite_dir.mkdir()
    write_yaml(suite_dir / SUITE_FILE, to_yaml(suite))
    for trial in trials(suite):
        run_dir = suite_dir / "runs" / trial.name
        exp = trial_experiment(trial, run_dir)
        serial = dataclasses.replace(exp.cfg, ray=dataclasses.replace(exp.cfg.ray, executor="serial"))
        run_experiment(serial)
        (run_dir / TRIAL_FILE).write_text(json.dumps({"config": trial.config, "seed": trial.seed, "sampled": {}}))
    collect(suite, suite_dir)
    return suite_dir


def pm(mean: float | None, std: float | None) -> str:
    return "–" if mean is None else f"{100 * mean:.2f} ± {100 * std:.2f}"


def test_the_published_page_carries_the_suites_numbers(tmp_path: Path) -> None:
    suite_dir = make_suite_dir(tmp_path)
    out = tmp_path / "docs" / "results" / "tiny_table"
    out.mkdir(parents=True)
    (out / "notes.md").write_text("FedRep's personal heads win on the sharper split.\n")
    assert console_main(["report", "--publish", str(suite_dir), str(out), "--commit", "abc123"]) == 0
    summary = json.loads((suite_dir / "summary.json").read_text())
    assert json.loads((out / "summary.json").read_text()) == summary
    page = (out / "README.md").read_text()
    table = page.split("<details>")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| configuration")]
    assert len(rows) == len(summary["configs"]) == 4
    for config, row in zip(summary["configs"], rows, strict=True):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[0] == config["config"] and cells[1] == "2" and cells[2] == "3"
        want = []
        for m in ("gm_gtest", "gm_ptest", "lm_ptest"):
            best = config["best_mean"][m]
            want += [
                pm(config["mean"][m], config["std"][m]),
                pm(config["last_mean"][m], config["last_std"][m]),
                "–" if best is None else f"{100 * best:.2f}",
            ]
        assert cells[3:12] == want
        assert cells[12] == config["paper"]
    # each partition its own figure of the row's "A / B"
    assert [c["paper"] for c in summary["configs"]] == ["81.1", "81.3", "79.5", "80.1"]
    # per seed (folded): each trial's final value, its run's own summary.json's
    folded = page.split("<details>")[1].split("</details>")[0]
    seed_rows = [line for line in folded.splitlines() if line.startswith("| ") and not line.startswith("| configuration")]
    assert len(seed_rows) == 8
    for row in seed_rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        run = json.loads((suite_dir / "runs" / f"{cells[0]}-seed{cells[1]}" / "summary.json").read_text())
        for i, m in enumerate(("gm_gtest", "gm_ptest", "lm_ptest")):
            value = run["final"][m]
            assert cells[2 + 2 * i] == ("–" if value is None else f"{100 * value:.2f}")
            last = run["last"][m]
            assert cells[3 + 2 * i] == ("–" if last is None else f"{100 * last:.2f}")
    assert "FedRep's personal heads win" in page  # the hand-written notes are kept
    assert "commit `" in page  # the suite recorded its commit (a git checkout), else the one given
    assert (out / "accuracy_gm_gtest.png").stat().st_size > 5000
    index = (out.parent / "README.md").read_text()
    assert "[tiny_table](tiny_table/README.md) | 4 | 0, 1 | 3 |" in index
    assert re.search(r"seeds: 0, 1 \(8 trials\)", page)


def test_the_index_lists_pages_only_and_leaves_a_projects_readme_alone(tmp_path: Path) -> None:
    """The index beside a page lists the folders that hold a page (README.md and a suite's
    summary.json), not a run directory's summary.json beside them; a page published into a folder
    whose README.md is not an index (a project's) leaves that README as it is."""
    from raysim.suite.publish import INDEX_HEAD, write_index

    results = tmp_path / "results"
    page = results / "tiny_table"
    page.mkdir(parents=True)
    (page / "README.md").write_text("# tiny_table\n")
    (page / "summary.json").write_text(json.dumps({"suite": "tiny_table", "configs": [{"seeds": [0, 1], "rounds": [3]}]}))
    run = results / "fedavg-run"  # scripts/run.py's own summary beside the pages
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"algo": "fedavg", "final": {"gm_gtest": 0.5}}))
    index = write_index(results)
    assert index == results / "README.md"
    text = index.read_text()
    assert text.startswith(INDEX_HEAD + "\n")
    assert "[tiny_table](tiny_table/README.md) | 1 | 0, 1 | 3 |" in text
    assert "fedavg-run" not in text
    assert write_index(results) == index  # its own index is rewritten

    project = tmp_path / "project"
    (project / "tiny_table").mkdir(parents=True)
    (project / "README.md").write_text("# My project\n\nHow to run it.\n")
    assert write_index(project) is None
    assert (project / "README.md").read_text() == "# My project\n\nHow to run it.\n"


def test_publishing_what_is_not_a_suite_directory_is_refused(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert console_main(["report", "--publish", str(tmp_path), str(tmp_path / "out")]) == 2
    assert "not a suite directory with results" in capsys.readouterr().err
    assert console_main(["report", "--publish", str(tmp_path)]) == 2


def test_a_pages_record_is_the_suites_slim_copy_and_publishes_the_same_page(tmp_path: Path) -> None:
    """The page keeps its suite's record in ``suite/``: the suite's own files and, per trial, only
    its settings, metrics and summary (no checkpoint, TensorBoard events or per-client tables).
    Published again from that record, the page is the same to the byte, and the record stays."""
    suite_dir = make_suite_dir(tmp_path)
    for run in (suite_dir / "runs").iterdir():  # what a trial's directory has beside its record
        (run / "checkpoint.pkl").write_bytes(b"state")
    out = tmp_path / "page"
    assert console_main(["report", "--publish", str(suite_dir), str(out), "-q"]) == 0
    record = out / "suite"
    assert sorted(p.name for p in record.iterdir()) == sorted(
        ["suite.yaml", "summary.json", "metrics.parquet", "runs"]  # no trial_starts.log: trials run by hand here
    )
    runs = sorted(p.name for p in (record / "runs").iterdir())
    assert runs == sorted(p.name for p in (suite_dir / "runs").iterdir()) and len(runs) == 8
    for name in runs:
        kept = {p.name: p.read_bytes() for p in (record / "runs" / name).iterdir()}
        assert sorted(kept) == sorted(["trial.json", "config.yaml", "summary.json", "metrics.parquet"])
        assert all(data == (suite_dir / "runs" / name / f).read_bytes() for f, data in kept.items())
        # the files' times too, as `cp -p` keeps them (the page reads none: its times are in trial_starts.log)
        assert all(
            (record / "runs" / name / f).stat().st_mtime == (suite_dir / "runs" / name / f).stat().st_mtime for f in kept
        )
    first = (out / "README.md").read_text()
    assert "[`suite/`](suite/)" in first
    assert console_main(["report", "--publish", str(record), str(out), "-q"]) == 0
    assert (out / "README.md").read_text() == first
    assert len(list((record / "runs").iterdir())) == 8
    # a record can be written again over itself's older copy, and carried elsewhere by hand
    assert console_main(["report", "--record", str(suite_dir), str(tmp_path / "carried")]) == 0
    assert console_main(["report", "--record", str(suite_dir), str(tmp_path / "carried")]) == 0
    assert sorted(p.name for p in (tmp_path / "carried" / "runs").iterdir()) == runs


def test_a_record_refuses_what_it_would_lose_or_cannot_copy(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    suite_dir = make_suite_dir(tmp_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "thesis.tex").write_text("mine")
    cases = [
        (["--record", str(tmp_path / "other"), str(tmp_path / "r")], "is not a suite directory"),
        (["--record", str(suite_dir), str(suite_dir / "record")], "outside its suite directory"),
        (["--record", str(suite_dir), str(suite_dir)], "outside its suite directory"),
        (["--record", str(suite_dir), str(tmp_path / "other")], "is not a suite's record"),
        (["--record", str(suite_dir), str(tmp_path / "tiny.yaml")], "is not a suite's record"),
        (["--record", str(suite_dir)], "SUITE_DIR DEST"),
        (["--record", "--publish", str(suite_dir), str(tmp_path / "r")], "two commands"),
    ]
    (tmp_path / "page" / "suite").mkdir(parents=True)  # a page whose suite/ is someone else's
    (tmp_path / "page" / "suite" / "draft.md").write_text("mine")
    cases += [
        (["--publish", str(suite_dir), str(suite_dir / "page")], "outside its suite directory"),
        (["--publish", str(suite_dir), str(tmp_path / "page")], "is not a suite's record"),
    ]
    for args, said in cases:
        assert console_main(["report", *args]) == 2, args
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, (args, err)
    assert (tmp_path / "other" / "thesis.tex").read_text() == "mine"
    assert not (suite_dir / "record").exists() and not (tmp_path / "r").exists()
    assert not (suite_dir / "page").exists() and sorted(p.name for p in (tmp_path / "page").iterdir()) == ["suite"]


DEPLOYED = SUITE.replace(
    """seeds: 0-1
grid:
  partition: [dirichlet:0.5, dirichlet:0.1]
configs:
  - {name: fedavg, set: {algo: fedavg}, paper: "81.1 / 81.3"}
  - {name: fedrep, set: {algo: fedrep}, paper: "79.5 / 80.1"}""",
    """  eval.target: 0.3
seeds: 0
grid:
  deployment: [homogeneous, dropout30]
configs:
  - {name: fedavg, set: {algo: fedavg}}""",
)


def test_a_deployed_suites_page_gives_the_simulated_time_and_plots_against_it(tmp_path: Path) -> None:
    suite_dir = make_suite_dir(tmp_path, DEPLOYED)
    out = tmp_path / "deployed"
    assert console_main(["report", "--publish", str(suite_dir), str(out), "--commit", "abc123"]) == 0
    summary = json.loads((suite_dir / "summary.json").read_text())
    page = (out / "README.md").read_text()
    assert "| sim. time (s) | reached gm_gtest ≥ 30.00 | sim. time to it (s) |" in page
    rows = [line for line in page.split("<details>")[0].splitlines() if line.startswith("| fedavg")]
    assert len(rows) == len(summary["configs"]) == 2
    for config, row in zip(summary["configs"], rows, strict=True):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        reached = config["target_reached"]
        time_to = config["time_to_target_mean"]
        assert cells[-4:-1] == [f"{config['sim_time_mean']:.1f}", reached, "–" if time_to is None else f"{time_to:.1f}"]
    assert (out / "accuracy_gm_gtest_sim_time.png").stat().st_size > 5000


CLASS_SECTION = "## Per-class accuracy of the global model"


def class_rows(page: str) -> list[list[str]]:
    """The cells of the per-class table's rows (its header first)."""
    section = page.split(CLASS_SECTION)[1].split("\n## ")[0]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in section.splitlines() if line.startswith("| ")]


def test_the_page_gives_the_per_class_accuracy_only_where_the_trials_recorded_it(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    suite_dir = make_suite_dir(tmp_path)
    plain = tmp_path / "plain"
    assert console_main(["report", "--publish", str(suite_dir), str(plain), "--commit", "abc123"]) == 0
    without = (plain / "README.md").read_text()
    assert CLASS_SECTION not in without and "gm_class_acc" not in without  # no analyses, no section
    # the same trials as if they had run with eval.analyses: a hand case at each trial's last round
    summary = json.loads((suite_dir / "summary.json").read_text())
    names = [c["config"] for c in summary["configs"]]
    last = {  # (configuration, seed) -> its last evaluation's gm_class_acc
        (names[0], 0): [1.0, 0.0, 0.0],
        (names[0], 1): [1.0, 0.0, 0.0],
        (names[1], 0): [1.0, 0.5, None],
        (names[1], 1): [0.0, 0.25, None],
        (names[2], 0): [0.2, 0.4, 0.6],
        (names[2], 1): [0.3, 0.5, None],
        (names[3], 1): [0.9, 0.8, 0.7],
    }
    rows = pq.read_table(suite_dir / "metrics.parquet").to_pylist()
    final: dict[tuple[str, int], int] = {}
    for r in rows:
        final[(r["config"], r["seed"])] = max(final.get((r["config"], r["seed"]), 0), r["round"])
    for r in rows:
        key = (r["config"], r["seed"])
        if key not in last:  # names[3]'s seed 0 recorded none
            r["gm_class_acc"] = None
        else:  # its earlier rounds other values: the last round's count
            r["gm_class_acc"] = last[key] if r["round"] == final[key] else [0.0, 1.0, 1.0]
    pq.write_table(pa.Table.from_pylist(rows), suite_dir / "metrics.parquet")
    out = tmp_path / "analysed"
    assert console_main(["report", "--publish", str(suite_dir), str(out), "--commit", "abc123"]) == 0
    page = (out / "README.md").read_text()
    assert class_rows(page) == [
        ["configuration", "0", "1", "2"],
        [names[0], "100.0", "0.0", "0.0"],
        [names[1], "50.0", "37.5", "–"],
        [names[2], "25.0", "45.0", "60.0"],
        [names[3], "90.0", "80.0", "70.0"],
    ]
    assert "recall" in page.split(CLASS_SECTION)[1].split("| configuration")[0]
    # the section is all the page gains: without it, the page is the one published without analyses
    section = page[page.index(CLASS_SECTION) : page.index("## Curves")]
    assert page.replace(section, "") == without


ANALYSED = SUITE.replace("  output.tensorboard: false\n", "  output.tensorboard: false\n  eval.analyses: true\n").replace(
    """seeds: 0-1
grid:
  partition: [dirichlet:0.5, dirichlet:0.1]
configs:
  - {name: fedavg, set: {algo: fedavg}, paper: "81.1 / 81.3"}
  - {name: fedrep, set: {algo: fedrep}, paper: "79.5 / 80.1"}""",
    """seeds: 0-1
configs:
  - {name: fedavg, set: {algo: fedavg}}""",
)


def test_a_suite_run_with_analyses_gets_its_trials_per_class_accuracy(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    suite_dir = make_suite_dir(tmp_path, ANALYSED)
    out = tmp_path / "analysed"
    assert console_main(["report", "--publish", str(suite_dir), str(out), "--commit", "abc123"]) == 0
    runs = sorted((suite_dir / "runs").iterdir())
    lasts = [pq.read_table(run / "metrics.parquet").to_pylist()[-1]["gm_class_acc"] for run in runs]
    assert len(lasts) == 2  # each trial's last evaluation, its list of per-class accuracies
    want = []
    for values in zip(*lasts, strict=True):
        present = [v for v in values if v is not None]
        want.append("–" if not present else f"{100 * sum(present) / len(present):.1f}")
    header, row = class_rows((out / "README.md").read_text())
    assert header == ["configuration", *map(str, range(len(want)))]
    assert row == ["fedavg", *want]


def _rewrite(summaries: list[Path], key: str, values: list[Any]) -> None:
    """Set ``key`` in each trial's summary.json to its value of ``values`` (None: as a trial from
    before summaries recorded it, without the key)."""
    for path, value in zip(summaries, values, strict=True):
        summary = json.loads(path.read_text())
        if value is None:
            del summary[key]
        else:
            summary[key] = value
        path.write_text(json.dumps(summary))


def test_the_page_names_the_machines_its_trials_ran_on(tmp_path: Path) -> None:
    """Each trial's summary.json records the machine that ran it (the processor, the instruction set
    PyTorch's kernels dispatched to, the CPUs, PyTorch's version); the page's budget counts trials per
    machine, and trials from before the record as "not recorded"."""
    import os

    import torch

    suite_dir = make_suite_dir(tmp_path)
    runs = sorted((suite_dir / "runs").glob("*/summary.json"))
    mine = json.loads(runs[0].read_text())["machine"]
    assert mine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert mine["cpus"] == os.cpu_count() and mine["torch"] == torch.__version__ and mine["processor"]
    used = torch.cuda.get_device_name(torch.cuda.current_device()) if torch.cuda.is_initialized() else None
    assert mine["gpu"] == used  # named only where this process started CUDA
    # two trials from another machine, one from before summaries named theirs, five from this one
    mine = {**mine, "gpu": None}
    other = {**mine, "processor": "AMD EPYC 7B13", "cpu_capability": "AVX2", "cpus": 16}
    _rewrite(runs, "machine", [other, other, None, *[mine] * 5])
    out = tmp_path / "page"
    assert console_main(["report", "--publish", str(suite_dir), str(out), "-q"]) == 0
    budget = (out / "README.md").read_text().split("## Budget")[1].split("## Results")[0]
    here = f"{mine['processor']} ({mine['cpu_capability']}, {mine['cpus']} CPUs), torch {mine['torch']}"
    want = f"- machines: {here} (5 trials); AMD EPYC 7B13 (AVX2, 16 CPUs), torch {mine['torch']} (2 trials); not recorded (1 trial)"
    assert want in budget.splitlines()


def test_the_page_names_the_commits_its_trials_ran_at_where_they_differ_from_the_suites(tmp_path: Path) -> None:
    """Each trial's summary.json records the commit of the code that ran it; the page's budget adds
    the trials' commits, with how many each, only where some trial ran at another than the commit
    the suite was collected at (a suite resumed at a newer commit)."""
    from raysim.provenance import source_commit

    suite_dir = make_suite_dir(tmp_path)
    runs = sorted((suite_dir / "runs").glob("*/summary.json"))
    suite_commit = json.loads((suite_dir / "summary.json").read_text())["commit"]
    if suite_commit is None:
        pytest.skip("the code is not a git checkout: no commit to record")
    assert all(json.loads(r.read_text())["commit"] == source_commit() == suite_commit for r in runs)

    def budget() -> list[str]:
        out = tmp_path / "page"
        assert console_main(["report", "--publish", str(suite_dir), str(out), "--commit", "abc123", "-q"]) == 0
        return (out / "README.md").read_text().split("## Budget")[1].split("## Results")[0].splitlines()

    assert not any(line.startswith("- the trials' code") for line in budget())  # all at the suite's
    _rewrite(runs, "commit", ["0123456789ab", "0123456789ab", None, *[suite_commit] * 5])
    assert f"- the trials' code: `{suite_commit}` (5 trials); `0123456789ab` (2 trials); not recorded (1 trial)" in budget()


def test_the_elapsed_time_comes_from_the_suites_log_not_from_file_times(tmp_path: Path) -> None:
    """The budget's elapsed time runs from the first start in ``trial_starts.log`` to the last trial's
    end: its ``end`` line, or, in a log from before trials wrote one, its last start or resume plus
    its own time. The summaries' file times (a copy's or a checkout's) do not move it."""
    import os

    suite_dir = make_suite_dir(tmp_path)
    runs = sorted((suite_dir / "runs").glob("*/summary.json"))
    names = [r.parent.name for r in runs]
    last = json.loads(runs[-1].read_text())
    runs[-1].write_text(json.dumps({**last, "train_time_s": 1800.0}))  # long enough to show in the line
    own = {
        r.parent.name: sum(json.loads(r.read_text())[k] for k in ("setup_time_s", "train_time_s", "eval_time_s"))
        for r in runs
    }
    t0 = 1_800_000_000.0
    lines = [f"{name} start {t0 + 100 * i:.3f} 7" for i, name in enumerate(names)]
    lines += [f"{name} end {t0 + 100 * i + 50:.3f} 7" for i, name in enumerate(names[:-1])]
    lines.append(f"{names[-1]} resume {t0 + 5000:.3f} 8")  # the last trial stopped, resumed, wrote no end line
    (suite_dir / "trial_starts.log").write_text("\n".join(lines) + "\n")
    for r in runs:
        os.utime(r, (t0 + 10**6, t0 + 10**6))  # as a checkout would stamp them: no trial's end

    def elapsed() -> str:
        out = tmp_path / "page"
        assert console_main(["report", "--publish", str(suite_dir), str(out), "-q"]) == 0
        (line,) = [x for x in (out / "README.md").read_text().splitlines() if x.startswith("- elapsed")]
        return line.rsplit(": ", 1)[1]

    assert elapsed() == f"{(5000 + own[names[-1]]) / 3600:.2f} h"
    with open(suite_dir / "trial_starts.log", "a") as f:  # the end line, where the trial wrote one
        f.write(f"{names[-1]} end {t0 + 9000:.3f} 8\n")
    assert elapsed() == f"{9000 / 3600:.2f} h"
