"""``raysim partition``: a partition's picture and table, without running anything."""

from __future__ import annotations

from pathlib import Path

from raysim.partition_view import PICTURE, write_partition


def main(argv: list[str] | None = None) -> int:
    """``raysim partition --dataset fmnist --partition dirichlet:0.1 --clients 100``: draw the
    partition (and write its table beside the picture) without running anything."""
    import argparse
    import sys

    from raysim.errors import ConfigError
    from raysim.flags import FLAGS

    p = argparse.ArgumentParser(prog="raysim partition", description=main.__doc__)
    for name in ("dataset", "data_dir", "partition", "test_mode", "clients", "seed"):
        help_ = FLAGS[name][2]
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=help_.split(":")[0])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any data setting, e.g. data.min_samples=5")
    p.add_argument("--no-download", action="store_true", help="never download the dataset")
    p.add_argument("--out", default=PICTURE, help=f"the picture to write (default ./{PICTURE}); the table goes beside it")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        from raysim.api import make_config
        from raysim.data import build_federated_data

        flags = {n: getattr(args, n) for n in ("dataset", "data_dir", "partition", "test_mode", "clients", "seed")}
        sets = dict(item.partition("=")[::2] for item in args.set)
        # the model is beside the point here: an MLP fits every input shape
        cfg = make_config(executor="serial", model="mlp_fcd", download=not args.no_download, set=sets, **flags)
        data = build_federated_data(cfg.data, cfg.clients, cfg.seed)
    except ConfigError as e:
        print(f"raysim partition: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    title = write_partition(data, out, cfg.data.partition, cfg.data.dataset)
    print(out)
    print(title)
    return 0


__all__ = ["main"]
