"""``raysim partition``: a partition's picture and table, without running anything."""

from __future__ import annotations

from pathlib import Path

from raysim.results.partition_view import PICTURE, write_partition


def main(argv: list[str] | None = None) -> int:
    """``raysim partition --dataset fmnist --partition dirichlet:0.1 --clients 100``: draw the
    partition (and write its table beside the picture) without running anything."""
    import sys

    from raysim.commands.flags import Parser
    from raysim.errors import ConfigError
    from raysim.keywords import FLAGS

    names = ("dataset", "data_dir", "partition", "test_mode", "clients", "seed")
    p = Parser(prog="raysim partition", description=main.__doc__)
    for name in names:
        help_ = FLAGS[name][2]
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=help_.split(":")[0])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any data setting, e.g. data.min_samples=5")
    p.add_argument("--no-download", action="store_true", help="never download the dataset")
    p.add_argument("--out", default=PICTURE, help=f"the picture to write (default ./{PICTURE}); the table goes beside it")
    try:
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        from raysim.api import make_config
        from raysim.data import build_federated_data

        out = Path(args.out)
        if not out.parent.is_dir():
            raise ConfigError(f"--out {out}: the folder {out.parent} does not exist.")
        if out.is_dir():
            raise ConfigError(f"--out {out} is a folder; name the picture to write, e.g. {out / PICTURE}.")
        flags = {n: getattr(args, n) for n in names}
        # the model is beside the point here: an MLP fits every input shape
        cfg = make_config(executor="serial", model="mlp_fcd", download=not args.no_download, set=args.set, **flags)
        data = build_federated_data(cfg.data, cfg.clients, cfg.seed)
        title = write_partition(data, out, cfg.data.partition, cfg.data.dataset)
    except ConfigError as e:
        print(f"raysim partition: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # an unwritable picture or table
        print(f"raysim partition: error: {args.out} cannot be written ({e.strerror or e}).", file=sys.stderr)
        return 2
    print(out)
    print(title)
    return 0


__all__ = ["main"]
