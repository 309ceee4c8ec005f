"""``python -m geodml.bench [NAME ...] [options]``: run registered benchmarks (see geodml.bench).

* no NAME: the suite (``geodml.bench.SUITE``), each with ``--quick`` when given;
* one NAME: that benchmark with all the options that follow (``NAME --help`` lists them);
* several NAMEs: each in turn; only ``--quick`` may follow.

Exit status: 0 when every benchmark ran, 2 for bad input (unknown name, an option given to
several benchmarks), 1 when a benchmark failed (the others still run; the failure is printed).
"""

from __future__ import annotations

import sys
import time
import traceback

from geodml.bench import BENCHMARKS, DESCRIPTIONS, QUICK_SUPPORTED, SUITE, resolve


def usage() -> str:
    lines = ["usage: python -m geodml.bench [NAME ...] [--quick]   |   python -m geodml.bench NAME [NAME's options]",
             "", "benchmarks (no NAME runs the suite: " + " ".join(SUITE) + "):"]
    lines += [f"  {n:11s} {DESCRIPTIONS.get(n, '')}" for n in BENCHMARKS]
    return "\n".join(lines)


def parse(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split argv into (benchmark names, options); ValueError with a usable message on bad input."""
    names = []
    i = 0
    while i < len(argv) and not argv[i].startswith("-"):
        if argv[i] not in BENCHMARKS:
            raise ValueError(f"unknown benchmark {argv[i]!r}; choose from {', '.join(BENCHMARKS)}")
        names.append(argv[i])
        i += 1
    opts = argv[i:]
    if not names:
        names = list(SUITE)
    if len(names) > 1:
        bad = [o for o in opts if o != "--quick"]
        if bad:
            raise ValueError(f"options {bad} go to one benchmark only: run python -m geodml.bench NAME {' '.join(bad)}")
        if opts:
            names_without = [n for n in names if n not in QUICK_SUPPORTED]
            if names_without:
                raise ValueError(f"--quick is not supported by {names_without}")
    return names, opts


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    try:
        names, opts = parse(argv)
    except ValueError as exc:
        print(f"python -m geodml.bench: error: {exc}", file=sys.stderr)
        return 2
    status = 0
    for name in names:
        t0 = time.monotonic()
        if len(names) > 1:
            print(f"\n=== {name} ===", flush=True)
        try:
            rc = int(resolve(name)(opts) or 0)
        except ValueError as exc:
            print(f"python -m geodml.bench {name}: error: {exc}", file=sys.stderr)
            rc = 2
        except Exception:  # noqa: BLE001 - one failing benchmark must not hide the others' tables
            traceback.print_exc()
            rc = 1
        if len(names) > 1:
            print(f"({name}: {time.monotonic() - t0:.0f} s)", flush=True)
        status = status or rc
    return status


if __name__ == "__main__":
    sys.exit(main())
