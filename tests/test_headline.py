"""One honest headline (docs/run-directory.md "Which accuracy"): where partitions end with models of their own, the
done line, summary.json and the report lead with the mean of the partitions' own accuracies and show the average of
their weights beside it; where every partition holds the global model, one number."""

import json

import pytest

from geodml.cli import main
from geodml.report import headline
from geodml.rundir import done_text

SMALL = ["--dataset", "digits", "--partitions", "3", "--steps", "12", "--eval-every", "6", "--no-progress",
         "--partition", "label", "--skew", "1.0"]


def _summary(out) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_gaia_leads_with_the_partitions_own_mean(tmp_path, capsys):
    out = tmp_path / "gaia"
    assert main(["--algo", "gaia", "--t0", "0.05", "--lr", "0.01", *SMALL, "--out", str(out)]) == 0
    s = _summary(out)
    per = s["per_rank_val_accuracy"]
    assert len(per) == 3 and s["final_model"] == "average_of_weights"
    assert s["partition_mean_val_accuracy"] == pytest.approx(sum(per) / 3, abs=0)
    assert s["headline_val_accuracy"] == s["partition_mean_val_accuracy"] and s["headline_measure"] == "partition_mean"
    done = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("done: "))
    assert done.startswith(f"done: mean val accuracy of the partitions' own models {sum(per) / 3:.4f} (per partition "
                           f"{', '.join(f'{a:.3f}' for a in per)}; the average of their weights, a model no partition "
                           f"holds: {s['final_val_accuracy']:.4f}), WAN bytes ")
    assert headline(s) == (s["headline_val_accuracy"], "partition_mean")


def test_fedavg_has_one_number(tmp_path, capsys):
    out = tmp_path / "fedavg"
    assert main(["--algo", "fedavg", "--iter-local", "3", *SMALL, "--out", str(out)]) == 0
    s = _summary(out)
    assert s["final_model"] == "global" and s["per_rank_val_accuracy"] is None
    assert s["headline_val_accuracy"] == s["final_val_accuracy"] and s["headline_measure"] == "global"
    assert s["partition_mean_val_accuracy"] is None
    done = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("done: "))
    assert done.startswith(f"done: final val accuracy {s['final_val_accuracy']:.4f} (global model; partitions hold "
                           "global models")


def test_a_summary_written_before_the_headline_keys_reads_the_same():
    """The report's rule on an older summary.json (no headline keys) gives what the run would write now."""
    old_gaia = {"final_val_accuracy": 0.8858, "final_model": "average_of_weights",
                "per_rank_val_accuracy": [0.251, 0.220, 0.279, 0.251, 0.212]}
    value, measure = headline(old_gaia)
    assert measure == "partition_mean" and value == pytest.approx(1.213 / 5, abs=1e-12)
    assert headline({"final_val_accuracy": 0.9, "final_model": "global", "per_rank_val_accuracy": [0.9, 0.9]}) == (
        0.9, "global")   # BatchNorm-free BSP scored with --partition-scores all: one model, one number


def test_done_text_of_the_issue_example(tmp_path):
    """The run the newcomer saw ('done: final val accuracy 0.8858 (average_of_weights model; ...)') now leads with
    0.2426 = (0.251 + 0.220 + 0.279 + 0.251 + 0.212) / 5."""
    s = {"final_val_accuracy": 0.8858, "final_model": "average_of_weights", "headline_measure": "partition_mean",
         "headline_val_accuracy": 0.2426, "per_rank_val_accuracy": [0.251, 0.220, 0.279, 0.251, 0.212],
         "wan_bytes_total": 1000, "emulated_seconds": 1.0, "wall_seconds": 1.0, "algo": "gaia", "world_size": 5,
         "bsp_equivalent_wan_bytes": 0, "wan_savings_vs_bsp": None, "steps": 10, "final_train_loss": 0.1}
    assert done_text(s, tmp_path).splitlines()[0] == (
        "done: mean val accuracy of the partitions' own models 0.2426 (per partition 0.251, 0.220, 0.279, 0.251, 0.212; "
        "the average of their weights, a model no partition holds: 0.8858), WAN bytes 1.00 KB (1,000 B), emulated 1.0 s, "
        "wall 1.0 s")
