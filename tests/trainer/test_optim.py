import math
from itertools import pairwise

import pytest

from trainer.optim import lr_at


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 1e-3 / 10),  # warm-up starts above zero so step 0 trains
        (4, 5e-3 / 10),
        (9, 1e-3),  # last warm-up step reaches the peak
        (10, 1e-3),  # cosine starts at the peak
        (55, 1e-4 + 0.5 * 9e-4),  # halfway down the cosine
        (100, 1e-4),  # floor at min_ratio * peak
        (150, 1e-4),  # and flat after the end
    ],
)
def test_warmup_then_cosine(step: int, expected: float) -> None:
    assert math.isclose(
        lr_at(step, peak=1e-3, warmup=10, total=100, min_ratio=0.1), expected, rel_tol=1e-12
    )


def test_cosine_is_monotone_after_warmup() -> None:
    values = [lr_at(s, peak=1.0, warmup=5, total=50) for s in range(5, 51)]
    assert all(a >= b for a, b in pairwise(values))


def test_no_warmup() -> None:
    assert lr_at(0, peak=2.0, warmup=0, total=10) == 2.0
