#!/usr/bin/env python3
"""Print the paper-setup table of docs/algorithms.md (raysim/engine/setups.py), or with --write
rewrite it in place.

    python scripts/paper_setups.py            # print the generated block
    python scripts/paper_setups.py --write    # rewrite docs/algorithms.md's block
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raysim.engine.setups import setups_section, write  # noqa: E402

DOC = ROOT / "docs" / "algorithms.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help=f"rewrite the block in {DOC.relative_to(ROOT)}")
    args = p.parse_args(argv)
    if args.write:
        changed = write(DOC)
        print(f"{DOC.relative_to(ROOT)}: {'rewritten' if changed else 'already current'}")
    else:
        print(setups_section())
    return 0


if __name__ == "__main__":
    sys.exit(main())
