"""scripts/report.py: plots and a markdown table from run directories written here by hand (no Ray)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from raysim.results.report import DPI, FIGSIZE, MISSING, comparison_table, load_runs

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ACC = ("gm_gtest", "gm_ptest", "lm_ptest")


def make_run(
    path: Path, algo: str, rounds: int, partition: str, rows: list[dict[str, Any]], **config: Any
) -> Path:
    """A run directory as raysim.results.output leaves it (config.yaml and metrics.parquet, no summary.json)."""
    path.mkdir(parents=True)
    config = {
        "algo": algo,
        "clients": 20,
        "rounds": rounds,
        "data": {"dataset": "fmnist", "partition": partition},
        **config,
    }
    (path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    full = [{"round": r["round"], **{m: r.get(m) for m in ACC}, "train_loss": r["train_loss"]} for r in rows]
    pq.write_table(pa.Table.from_pylist(full), path / "metrics.parquet")  # all-None columns: type null
    return path


def global_run(path: Path) -> Path:
    """FedAvg-like: gm_* only (lm_* null), 4 of 4 rounds; gm_gtest best 91.25 at round 3, final 90.00."""
    gtest = [0.80, 0.85, 0.9125, 0.90]
    ptest = [0.70, 0.8875, 0.8875, 0.86]  # a tie: the earliest round (2) is the best round
    rows = [
        {"round": r, "gm_gtest": g, "gm_ptest": p, "train_loss": 1.0 / r}
        for r, g, p in zip(range(1, 5), gtest, ptest, strict=True)
    ]
    return make_run(path, "fedavg", 4, "dirichlet:0.1", rows)


def personal_run(path: Path) -> Path:
    """Purely personal: lm_ptest only, stopped after 3 of 10 rounds; best 93.50 at round 2, final 77.25,
    mean of the last 2 (its eval.last_k) 85.38."""
    lm = [0.60, 0.935, 0.7725]
    rows = [{"round": r, "lm_ptest": v, "train_loss": 2.0 / r} for r, v in zip(range(1, 4), lm, strict=True)]
    return make_run(path, "local", 10, "shard:2", rows, eval={"last_k": 2})


def report(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "report.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def table_rows(markdown: str) -> dict[str, list[str]]:
    """The body rows of the first markdown table, by their first cell."""
    lines = [ln for ln in markdown.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert lines[1].startswith("|---")
    rows = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert len(cells) == len(header), ln
        rows[cells[0]] = cells
    return {"__header__": header, **rows}


def check_png(path: Path) -> None:
    import matplotlib.image as mpimg

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 5000, f"{path} is suspiciously small ({len(data)} bytes)"
    image = mpimg.imread(path)
    assert image.shape == (round(FIGSIZE[1] * DPI), round(FIGSIZE[0] * DPI), 4), image.shape
    assert image[..., :3].std() > 0.05, f"{path} is blank"


def test_two_runs_plots_and_table(tmp_path):
    a = global_run(tmp_path / "alpha")
    b = personal_run(tmp_path / "beta")
    out = tmp_path / "reports" / "cmp"  # created, parents included
    proc = report(a, b, "--out", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr

    pngs = ["accuracy_gm_gtest.png", "accuracy_gm_ptest.png", "accuracy_lm_ptest.png", "train_loss.png"]
    for name in pngs:
        check_png(out / name)
    assert sorted(p.name for p in out.iterdir()) == sorted([*pngs, "report.md"])

    md = (out / "report.md").read_text()
    rows = table_rows(md)
    assert rows["__header__"] == [
        "run", "algo", "dataset", "partition", "clients", "rounds",
        "gm_gtest best (round)", "gm_gtest final", "gm_gtest last k",
        "gm_ptest best (round)", "gm_ptest final", "gm_ptest last k",
        "lm_ptest best (round)", "lm_ptest final", "lm_ptest last k",
    ]  # fmt: skip
    assert set(rows) == {"__header__", "alpha", "beta"}
    assert rows["alpha"] == [  # last k: the default 5, so all 4 evaluations
        "alpha", "fedavg", "fmnist", "dirichlet:0.1", "20", "4",
        "91.25 (r3)", "90.00", "86.56", "88.75 (r2)", "86.00", "83.37", MISSING, MISSING, MISSING,
    ]  # fmt: skip
    assert rows["beta"] == [
        "beta", "local", "fmnist", "shard:2", "20", "3 (of 10)",
        MISSING, MISSING, MISSING, MISSING, MISSING, MISSING, "93.50 (r2)", "77.25", "85.38",
    ]  # fmt: skip
    links = md.strip().splitlines()[-1]
    assert links == " ".join(f"![{Path(p).stem}]({p})" for p in pngs)

    lines = proc.stdout.splitlines()
    assert lines[0] == str(out / "report.md")
    assert "| alpha | fedavg |" in proc.stdout and "| beta | local |" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_default_out_clashing_names_and_absent_metric(tmp_path):
    a = global_run(tmp_path / "x" / "run")
    b = global_run(tmp_path / "y" / "run")
    proc = report(a, b, "--metrics", "gm_gtest,lm_ptest", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # the first run directory is the default --out; lm_ptest, which neither run has, is left out
    assert (a / "report.md").is_file() and not (b / "report.md").exists()
    assert sorted(p.name for p in a.glob("*.png")) == ["accuracy_gm_gtest.png", "train_loss.png"]
    check_png(a / "accuracy_gm_gtest.png")
    rows = table_rows((a / "report.md").read_text())
    assert rows["__header__"][6:] == ["gm_gtest best (round)", "gm_gtest final", "gm_gtest last k"]
    assert set(rows) == {"__header__", "x/run", "y/run"}  # same name: the parent tells them apart
    assert rows["x/run"][6:] == ["91.25 (r3)", "90.00", "86.56"]

    proc = report(a, b, "--labels", "one,two", "--out", tmp_path / "o", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert set(table_rows((tmp_path / "o" / "report.md").read_text())) == {"__header__", "one", "two"}


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("no_metrics", "is not a raysim run directory"),
        ("missing", "does not exist"),
        ("labels", "2 labels were given for 1 run directory"),
        ("metric_name", "is not a metric name"),
        ("no_args", "required"),
    ],
)
def test_bad_input_one_sentence_exit_2(tmp_path, case, needle):
    good = global_run(tmp_path / "good")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text("algo: fedavg\n")
    args: list[str | Path] = {
        "no_metrics": [good, empty],
        "missing": [tmp_path / "nosuch"],
        "labels": [good, "--labels", "a,b"],
        "metric_name": [good, "--metrics", "gm_gtest,../x"],
        "no_args": [],
    }[case]
    proc = report(*args, "--out", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("report.py: error: ") and err.endswith("."), err
    assert needle in err, err
    assert proc.stdout == ""
    assert not (tmp_path / "out").exists(), "nothing may be written"


def test_library_table_in_process(tmp_path):
    runs = load_runs([global_run(tmp_path / "g"), personal_run(tmp_path / "p")], ["G", "P|x"])
    table = comparison_table(runs, ["gm_gtest", "lm_ptest"])
    assert table.splitlines()[2].startswith(
        "| G | fedavg | fmnist | dirichlet:0.1 | 20 | 4 | 91.25 (r3) | 90.00 |"
    )
    assert "| P\\|x | local |" in table  # a pipe in a label cannot break the table
    assert runs[0].best("gm_ptest") == (0.8875, 2) and runs[1].final("gm_gtest") is None
