"""``python -m geodml.bench NAME [options]``: run one registered benchmark (see geodml.bench)."""

from __future__ import annotations

import argparse
import sys

from geodml.bench import BENCHMARKS, DESCRIPTIONS, resolve


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geodml.bench", description="Run one geodml benchmark.",
                                epilog="; ".join(f"{n}: {DESCRIPTIONS.get(n, '')}" for n in BENCHMARKS))
    p.add_argument("name", choices=sorted(BENCHMARKS), help="benchmark to run; NAME --help shows its options")
    p.add_argument("options", nargs=argparse.REMAINDER, help="options of that benchmark")
    a = p.parse_args(argv)
    return int(resolve(a.name)(a.options) or 0)


if __name__ == "__main__":
    sys.exit(main())
