"""A grid swept from Python with geodml.run: accuracy and WAN bytes of TopKFedAvg's upload fraction
against FedAvg, IID and label-skewed, on the embedded digits data (one process, a minute or two).

    PYTHONPATH=examples python examples/sweep.py [--out runs/sweep] [--steps 200]
"""

import argparse
import itertools
from pathlib import Path

import geodml


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/sweep", help="directory of the grid's run directories")
    p.add_argument("--steps", type=int, default=200, help="training steps per run")
    args = p.parse_args()
    algos = [("fedavg", {}), *(("topk_fedavg:TopKFedAvg", {"topk-fraction": f}) for f in (0.3, 0.1, 0.03))]
    partitions = [("iid", {"partition": "iid"}), ("label-skew", {"partition": "label", "skew": 1.0})]
    rows = []
    for (algo, extra), (skew, part) in itertools.product(algos, partitions):
        name = f"{algo.split(':')[-1]}-{extra.get('topk-fraction', 1)}-{skew}"
        out = Path(args.out) / name
        config = {"algo": algo, **extra, **part, "dataset": "digits", "partitions": 4, "steps": args.steps,
                  "iter-local": 10, "seed": 0, "progress": False, "out": str(out)}
        result = geodml.run(config)
        s = result.summary
        rows.append((algo.split(":")[-1], extra.get("topk-fraction", 1.0), skew, s["final_val_accuracy"],
                     s["wan_bytes_total"]))
    print(f"\n{'algorithm':<12} {'fraction':>8} {'data':<10} {'accuracy':>8} {'WAN MB':>9}")
    for algo, fraction, skew, acc, wan in rows:
        print(f"{algo:<12} {fraction:>8g} {skew:<10} {acc:>8.4f} {wan / 1e6:>9.2f}")


if __name__ == "__main__":
    main()
