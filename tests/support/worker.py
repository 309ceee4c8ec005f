"""Entry point of one test worker process (see tests/mp.py)."""

import datetime
import importlib
import os
import pickle
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    target, tmp = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        mod, fn = target.split(":")
        kwargs = pickle.loads((tmp / "kwargs.pkl").read_bytes())
        result = getattr(importlib.import_module(mod), fn)(rank, world, **kwargs)
        (tmp / f"result{rank}.pkl").write_bytes(pickle.dumps(result))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
