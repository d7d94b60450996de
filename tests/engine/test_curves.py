"""The pages' curves as small multiples (raysim.results.curves): which configuration goes to which
panel under which label, the families' colours, and the figure's lines checked against the rows'
means over seeds."""

from __future__ import annotations

import colorsys
import math
from pathlib import Path

import pytest

from raysim.registry import ALGORITHMS
from raysim.results.curves import FAMILIES, OTHER_PANEL, figure, layout, small_multiples, styles


def test_every_registered_algorithm_declares_a_family() -> None:
    undeclared = [name for name in ALGORITHMS.names() if ALGORITHMS.get(name).family not in set(FAMILIES) - {"other"}]
    assert undeclared == []
    assert ALGORITHMS.get("fedavg").family == "global" and ALGORITHMS.get("fedper").family == "split"
    assert ALGORITHMS.get("cfl").family == "clustered" and ALGORITHMS.get("ditto").family == "personal"


def test_panels_from_the_declared_regimes() -> None:
    configs = [("fedavg_dir01", "fedavg"), ("fedper_dir01", "fedper"), ("fedavg_rot4", "fedavg"), ("extra", "local")]
    plan = layout(configs, [("dir01", "Dir(0.1)"), ("pat2", "pathological:2"), ("rot4", "rotate:4")])
    # a declared regime no configuration is in draws no panel; an unplaced configuration its own
    assert plan.panels == ("Dir(0.1)", "rotate:4", OTHER_PANEL)
    assert [(x.panel, x.label, x.family) for x in plan.lines] == [
        ("Dir(0.1)", "fedavg", "global"),
        ("Dir(0.1)", "fedper", "split"),
        ("rotate:4", "fedavg", "global"),
        (OTHER_PANEL, "extra", "local"),
    ]


def test_panels_from_names_that_several_algorithms_share() -> None:
    # the deployments page: ALGO_DEPLOYMENT, each deployment run by two algorithms or more
    configs = [(f"{a}_{d}", a) for d in ("homogeneous", "stragglers") for a in ("fedavg", "fedbuff", "fed3p2")]
    plan = layout(configs)
    assert plan.panels == ("homogeneous", "stragglers")
    assert [x.label for x in plan.lines if x.panel == "stragglers"] == ["fedavg", "fedbuff", "fed3p2"]
    # names equal to the algorithm are a panel of their own when the others split so too
    plan = layout([("fedavg", "fedavg"), ("fedbabu", "fedbabu"), ("fedavg_p0.2", "fedavg"), ("fedbabu_p0.2", "fedbabu")])
    assert plan.panels == ("as named", "p0.2")


def test_panels_from_a_grid_by_its_key_of_fewest_values() -> None:
    # expand_grid's names, NAME_KEY=VALUE: a panel per partition (2 values, not lr's 3)
    configs = [
        (f"{name}_partition={p}_lr={lr}", algo)
        for name, algo in (("feddrplus_last", "feddrplus"), ("fedavg", "fedavg"))
        for p in ("shard_2", "dirichlet_0.1")
        for lr in ("0.1", "0.2", "0.3")
    ]
    plan = layout(configs)
    assert plan.panels == ("partition=shard_2", "partition=dirichlet_0.1")
    assert [x.label for x in plan.lines if x.panel == "partition=dirichlet_0.1"] == [
        f"{name}_lr={lr}" for name in ("feddrplus_last", "fedavg") for lr in ("0.1", "0.2", "0.3")
    ]
    # a grid of one line per value (a sweep of one algorithm's setting) is one panel
    assert layout([(f"fedfcd_server_lr={v}", "fedfcd") for v in ("0.01", "0.05")]).panels == ("",)


@pytest.mark.parametrize(
    "configs",
    [
        # one algorithm's ablations: a "panel" would hold one algorithm
        [("fedfcd", "fedfcd"), ("fedavg", "fedavg"), ("fedfcd_no_fa", "fedfcd"), ("fedfcd_no_fd", "fedfcd")],
        # a configuration whose name does not begin with its algorithm's
        [("fedavg_m50", "fedavg"), ("fedprox_m50", "fedprox"), ("fa_only", "fedpac")],
        # every configuration the same algorithm
        [("perfedavg_alpha0.01", "perfedavg"), ("perfedavg_alpha0.001", "perfedavg")],
    ],
)
def test_a_single_panel_where_the_names_do_not_group(configs: list[tuple[str, str]]) -> None:
    plan = layout(configs)
    assert plan.panels == ("",)
    assert [x.label for x in plan.lines] == [name for name, _ in configs]


def test_each_family_one_hue_and_each_label_its_own_style() -> None:
    configs = [(f"{a}_{r}", a) for r in ("dir01", "pat2") for a in ("fedavg", "fedprox", "scaffold", "fedper", "fedrep", "cfl")]
    plan = layout(configs, [("dir01", "A"), ("pat2", "B")])
    style = styles(plan.lines)
    assert set(style) == {"fedavg", "fedprox", "scaffold", "fedper", "fedrep", "cfl"}
    assert len(set(style.values())) == 6  # every label told apart
    hue = {label: round(colorsys.rgb_to_hls(*style[label][0])[0], 6) for label in style}
    assert hue["fedavg"] == hue["fedprox"] == hue["scaffold"]  # one family, one hue
    assert hue["fedper"] == hue["fedrep"]
    assert len({hue["fedavg"], hue["fedper"], hue["cfl"]}) == 3  # three families, three hues


def test_the_figure_draws_each_configurations_mean_over_seeds_in_its_panel(tmp_path: Path) -> None:
    values = {  # (config, seed) -> lm_ptest at rounds 2 and 4
        ("fedavg_a", 0): (0.50, 0.60), ("fedavg_a", 1): (0.54, 0.64),
        ("fedper_a", 0): (0.70, 0.80), ("fedper_a", 1): (0.70, 0.90),
        ("fedavg_b", 0): (0.20, 0.30), ("fedavg_b", 1): (0.30, 0.30),
        ("fedper_b", 0): (0.40, 0.45), ("fedper_b", 1): (0.40, 0.55),
    }  # fmt: skip
    rows = [
        {"config": config, "seed": seed, "round": rnd, "lm_ptest": v, "gm_gtest": None}
        for (config, seed), pair in values.items()
        for rnd, v in zip((2, 4), pair, strict=True)
    ]
    plan = layout([(c, c.split("_")[0]) for c in ("fedavg_a", "fedper_a", "fedavg_b", "fedper_b")])
    fig = figure(rows, "lm_ptest", plan)
    assert fig is not None
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["a", "b"]
    for ax, suffix in zip(panels, ("a", "b"), strict=True):
        drawn = [(list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()]
        want = []
        for algo in ("fedavg", "fedper"):
            s0, s1 = values[(f"{algo}_{suffix}", 0)], values[(f"{algo}_{suffix}", 1)]
            want.append(([2.0, 4.0], [100 * (s0[i] + s1[i]) / 2 for i in range(2)]))
        assert len(drawn) == 2
        for (xs, ys), (wx, wy) in zip(drawn, want, strict=True):
            assert xs == wx and all(math.isclose(y, w) for y, w in zip(ys, wy, strict=True))
    # the same label the same colour and dash in every panel
    a, b = ([(line.get_color(), line.get_linestyle()) for line in ax.get_lines()] for ax in panels)
    assert a == b and a[0] != a[1]
    # a metric no configuration has: no figure, no file
    assert figure(rows, "gm_gtest", plan) is None
    assert not small_multiples(rows, "gm_gtest", tmp_path / "x.png", plan) and not (tmp_path / "x.png").exists()
    assert small_multiples(rows, "lm_ptest", tmp_path / "y.png", plan) and (tmp_path / "y.png").stat().st_size > 5000


def test_a_long_legend_beneath_the_panels_lies_inside_the_figure() -> None:
    """Many long labels put the legend beneath the panels, in as many columns as the figure's
    width holds: every entry is inside the figure, none cut off at its edges."""
    algos = ("fedavg", "fedbabu", "spherefed", "feddrplus")
    names = [f"{a}_local_epochs={e}_partition={p}" for a in algos for e in (1, 2, 3, 5, 10, 20, 30, 40) for p in ("shard_2", "dirichlet_0.1")]
    rows = [{"config": c, "seed": 0, "round": r, "gm_gtest": 0.5, "lm_ptest": None} for c in names for r in (5, 10)]
    plan = layout([(c, c.split("_")[0]) for c in names])
    fig = figure(rows, "gm_gtest", plan)
    assert fig is not None
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    box, page = legend.get_window_extent(renderer), fig.bbox
    assert len(legend.get_texts()) == len(names) // 2 + 2  # the labels (a panel each partition) and two families
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    assert all(page.x0 <= t.get_window_extent(renderer).x0 and t.get_window_extent(renderer).x1 <= page.x1 for t in legend.get_texts())
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 2 and all(ax.get_window_extent(renderer).y0 > box.y1 for ax in panels)  # beneath them


def test_a_crowded_page_is_a_row_per_family_over_the_others_in_grey() -> None:
    """Two regimes of 16 algorithms from four families: a column per regime and a row per family,
    each cell that family's lines (their means over seeds, in the family's style) over the regime's
    other lines in grey, each row's legend its family's labels."""
    from raysim.results.curves import CONTEXT_GREY, MAX_LINES

    algos = [a for a in ALGORITHMS.names() if ALGORITHMS.get(a).family in ("global", "split", "personal", "clustered")][: MAX_LINES + 4]
    families = list(dict.fromkeys(ALGORITHMS.get(a).family for a in sorted(algos, key=lambda a: list(FAMILIES).index(ALGORITHMS.get(a).family))))
    assert len(algos) > MAX_LINES and len(families) >= 3
    configs = [(f"{a}_{r}", a) for r in ("dir01", "rot4") for a in algos]
    value = {c: (k + 1) / (len(configs) + 2) for k, (c, _) in enumerate(configs)}
    rows = [{"config": c, "seed": s, "round": r, "lm_ptest": value[c] + 0.01 * s * r} for c, _ in configs for s in (0, 1) for r in (5, 10)]
    plan = layout(configs, [("dir01", "Dir(0.1)"), ("rot4", "rotate:4")])
    fig = figure(rows, "lm_ptest", plan)
    assert fig is not None
    grid = [ax for ax in fig.axes if ax.get_visible()]
    assert len(grid) == 2 * len(families)
    assert [ax.get_title() for ax in grid[:2]] == ["Dir(0.1)", "rotate:4"]
    style = styles(plan.lines)
    for i, family in enumerate(families):
        assert grid[2 * i].get_ylabel().startswith(FAMILIES[family][0])
        for j, regime in enumerate(("dir01", "rot4")):
            ax = grid[2 * i + j]
            own = [a for a in algos if ALGORITHMS.get(a).family == family]
            coloured = [line for line in ax.get_lines() if line.get_color() != CONTEXT_GREY]
            grey = [line for line in ax.get_lines() if line.get_color() == CONTEXT_GREY]
            assert len(coloured) == len(own) and len(grey) == len(algos) - len(own)
            for line, a in zip(coloured, own, strict=True):
                want = [100 * (value[f"{a}_{regime}"] + 0.005 * r) for r in (5, 10)]
                assert list(line.get_xdata()) == [5.0, 10.0] and all(math.isclose(y, w) for y, w in zip(line.get_ydata(), want, strict=True))
                assert (line.get_color(), line.get_linestyle()) == style[a]
        assert [t.get_text() for t in fig.legends[i].get_texts()] == [a for a in algos if ALGORITHMS.get(a).family == family]
    # a dozen lines or fewer a panel: one row of panels, one legend
    few = [(f"{a}_{r}", a) for r in ("dir01", "rot4") for a in algos[:MAX_LINES]]
    fig = figure([r for r in rows if r["config"] in dict(few)], "lm_ptest", layout(few, [("dir01", "Dir(0.1)"), ("rot4", "rotate:4")]))
    assert fig is not None and len([ax for ax in fig.axes if ax.get_visible()]) == 2 and len(fig.legends) == 1


def test_curves_against_the_clients_epochs_put_rows_of_unequal_rounds_at_equal_compute() -> None:
    """A FedAsync row's round is one client's update, FedAvg's every client's: against
    client_epochs (the rows' own column, mean over seeds) both reach the same compute."""
    rows = [{"config": "fedavg_a", "seed": s, "round": r, "client_epochs": 4.0 * r, "lm_ptest": 0.5} for s in (0, 1) for r in (1, 2)]
    rows += [{"config": "fedasync_a", "seed": s, "round": r, "client_epochs": float(r + s), "lm_ptest": 0.4} for s in (0, 1) for r in (4, 8)]
    plan = layout([("fedavg_a", "fedavg"), ("fedasync_a", "fedasync")], [("a", "A")])
    fig = figure(rows, "lm_ptest", plan, against="client_epochs")
    assert fig is not None
    (ax,) = [ax for ax in fig.axes if ax.get_visible()]
    assert [list(line.get_xdata()) for line in ax.get_lines()] == [[4.0, 8.0], [4.5, 8.5]]
    assert ax.get_xlabel().startswith("client epochs") and "against client epochs" in fig.texts[0].get_text()
