"""`python -m geodml` / `torchrun -m geodml`: thin entry point."""

from geodml.cli import main

if __name__ == "__main__":
    raise SystemExit(main(spawn=True))
