"""The progress line (docs/monitoring.md "The progress line"): labelled units, the step of the shown evaluation,
steps per second and an ETA from a moving rate that is right after a resume. A scripted clock, numbers by hand."""

import io

from geodml.metrics.sinks import ConsoleProgress, human_duration


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _rec(step: int, **extra) -> dict:
    return {"step": step, "epoch": step / 600, "train_loss": 1.5, "wan_bytes_total": 12_340_000,
            "emulated_s": 639.6, **extra}


def test_human_duration():
    assert [human_duration(s) for s in (0, 12.4, 65, 3723, float("inf"), -1)] == ["0s", "12s", "1m05s", "1h02m03s",
                                                                                   "?", "?"]


def test_line_fields_and_the_rate_after_a_resume():
    """A run resumed at step 2,000 of 3,000: 10 steps a second. The old rule (steps since 0 over the time since
    start) gave 2,010 steps/s and an ETA of 0 s at the first record; the moving rate has none until a second
    record, then 10 steps/s and (3,000 - 2,020) / 10 = 98 s."""
    clock, out = Clock(), io.StringIO()
    p = ConsoleProgress(3000, stream=out, min_interval_s=0.0, clock=clock)
    p.log(_rec(2010))
    clock.t += 1.0
    p.log(_rec(2020, val_accuracy=0.8123))
    first, second = out.getvalue().splitlines()
    assert first == ("step 2010/3000 (epoch 3.35) | loss 1.5000 | val acc - | WAN 12.34 MB | emulated 639.6 s | "
                     "- steps/s | eta ?")
    assert second == ("step 2020/3000 (epoch 3.37) | loss 1.5000 | val acc 0.8123 (step 2020) | WAN 12.34 MB | "
                      "emulated 639.6 s | 10 steps/s | eta 1m38s")


def test_the_rate_moves_with_the_window():
    """10 steps/s for 60 s, then 2 steps/s: after 40 s at the new speed the 30 s window sees only it
    (2 steps/s, ETA (10,000 - 680) / 2 = 4,660 s = 1h17m40s), where the average since the start would say
    680 / 100 = 6.8 steps/s."""
    clock, out = Clock(), io.StringIO()
    p = ConsoleProgress(10_000, stream=out, min_interval_s=0.0, window_s=30.0, clock=clock)
    step = 0
    for _ in range(60):
        clock.t += 1.0
        step += 10
        p.log(_rec(step))
    for _ in range(40):
        clock.t += 1.0
        step += 2
        p.log(_rec(step))
    assert step == 680 and p.rate() == 2.0
    assert out.getvalue().splitlines()[-1].endswith("| 2 steps/s | eta 1h17m40s")


def test_not_a_terminal_prints_at_most_every_interval_but_always_at_evaluations():
    clock, out = Clock(), io.StringIO()
    p = ConsoleProgress(100, stream=out, min_interval_s=5.0, clock=clock)
    for step in range(1, 11):
        clock.t += 1.0
        p.log(_rec(step, **({"val_accuracy": 0.5} if step == 7 else {})))
    # printed at steps 1 (first), 6 (5 s later), 7 (an evaluation); 8-10 are within 5 s of step 7
    assert [int(line.split()[1].split("/")[0]) for line in out.getvalue().splitlines()] == [1, 6, 7]
