"""Interleaved A/B measurement of CPU per step, for targets of a few microseconds a step.

What it does against noise (a shared machine; the step itself costs ~100 us, the target 5 us):

- **process CPU**, not wall time (``time.process_time``: every thread of the process), so that
  time spent waiting for a CPU does not count;
- **many short rounds**, each measuring every variant once, in an order drawn at random each
  round (no variant always runs first, or right after the same one, or in step with work the
  process does every so many runs): a slow spell of the machine lands on all variants alike;
- **per-round differences**: each variant minus the baseline *of the same round*, so the
  machine's drift between rounds cancels; the figure is the **median** of those differences,
  with a **bootstrap 95% interval** of that median and the differences' IQR;
- **an A/A control**: the baseline measured twice per round (the second time as its own
  variant), so the table shows the noise floor of the very same run next to every figure;
- **GC state controlled**: a full collection, then ``gc.freeze()``, before every measured run
  (what earlier runs left is neither collected nor scanned during the next; collections the
  run's own allocations cause still count);
- **warm-up rounds** measured and thrown away.
"""

from __future__ import annotations

import gc
import os
import random
import statistics
from collections.abc import Collection, Mapping, Sequence

#: the name of the A/A control: the baseline measured a second time in every round
CONTROL = "A/A control"


def order_of(variants: Sequence[str], round_: int) -> list[str]:
    """The variants in round ``round_``'s order: a permutation drawn at random (seeded by the
    round: the same in every run of the benchmark). Not a fixed rotation: work the process
    does every so many runs (a WAL checkpoint, a heartbeat) would fall on the same variant
    again and again under a pattern with the same period, and bias it (seen: +13 us for a
    copy of the baseline under a rotation)."""
    names = list(variants)
    random.Random(1_000_003 * round_ + 17).shuffle(names)
    return names


def settle_gc() -> None:
    """Before a measured run: collect everything, then freeze what is left (see above)."""
    gc.collect()
    gc.freeze()


def bootstrap_median(
    values: Sequence[float], draws: int = 2000, seed: int = 7
) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval of the median of ``values`` (rounds resampled)."""
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def iqr(values: Sequence[float]) -> tuple[float, float]:
    """The 25th and 75th percentiles of ``values``."""
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q1, q3


def differences(per_round: Mapping[str, Sequence[float]], baseline: str) -> dict[str, list[float]]:
    """Each variant's value minus the baseline's of the same round, round by round."""
    base = per_round[baseline]
    return {
        name: [value - b for value, b in zip(values, base, strict=True)]
        for name, values in per_round.items()
        if name != baseline
    }


def diff_rows(
    per_round: Mapping[str, Sequence[float]],
    baseline: str,
    target_us: float | None = None,
    judged: Collection[str] | None = None,
) -> list[tuple[str, ...]]:
    """Table rows: the variant, its median CPU us/step, the median of its per-round
    differences against ``baseline`` with the bootstrap interval and the IQR, and (with
    ``target_us``) whether the interval lies below the target: for the rows named in
    ``judged`` (None: every row), never for the A/A control nor a row named a breakdown (such
    a figure never resolves a target)."""
    rows: list[tuple[str, ...]] = [
        (baseline, f"{statistics.median(per_round[baseline]):.1f}", "(baseline)", "", "", "")
    ]
    for name, diffs in differences(per_round, baseline).items():
        low, high = bootstrap_median(diffs)
        q1, q3 = iqr(diffs)
        verdict = ""
        if (
            target_us is not None
            and name != CONTROL
            and "breakdown" not in name
            and (judged is None or name in judged)
        ):
            verdict = f"< {target_us:g} us" if high < target_us else "not shown"
        rows.append(
            (
                name,
                f"{statistics.median(per_round[name]):.1f}",
                f"{statistics.median(diffs):+.2f}",
                f"[{low:+.2f}, {high:+.2f}]",
                f"[{q1:+.1f}, {q3:+.1f}]",
                verdict,
            )
        )
    return rows


DIFF_HEADERS = (
    "variant",
    "CPU us/step (median)",
    "minus baseline, same round (median)",
    "95% interval (bootstrap)",
    "IQR of the differences",
    "target",
)


def load() -> str:
    """The machine's load averages (1, 5, 15 min)."""
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())
