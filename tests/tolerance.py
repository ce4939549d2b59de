"""How closely two FP32 results computed by different kernels must agree.

Two kernels given the same inputs (another ISA's vector width, a fused op against the ops it
stands in for, one matrix product against two halves of it) round their sums in their own
order, so their results differ by a few roundings of the largest terms: an AVX-512 CPU puts
3.6e-7 between logits of magnitude 2.2 that an AVX2 one computes bit for bit. Such results are
compared to within a number of FP32 roundings of the largest magnitude, an error that scales
with that magnitude and not with each element's (an element near zero after cancellation
carries the rounding of the large terms that cancelled). The same computation done twice (a
resumed run against an uninterrupted one, a checkpoint round trip) stays bitwise equal: compare
it with ``torch.equal``.
"""

from __future__ import annotations

import torch

FP32_EPS = torch.finfo(torch.float32).eps


def assert_fp32_close(
    actual: torch.Tensor | float,
    expected: torch.Tensor | float,
    *,
    ulps: int = 64,
    msg: str | None = None,
) -> None:
    """Asserts that ``actual`` and ``expected`` (FP32 tensors, or floats read back from FP32)
    differ elementwise by at most ``ulps * FP32_EPS * max|expected|``; an all-zero ``expected``
    wants zeros. ``msg`` is added to the failure's message.

    Default 64 roundings (7.6e-6 of the largest magnitude): the cross-kernel errors of this
    suite's comparisons measured at most 7.4 of them, over 40 seeds each under ATen's AVX2 and
    default kernels (the commit that added this module says how), and 1.4 on an AVX-512 Xeon.

    Raises:
        AssertionError: where an element differs by more, with torch.testing's report.
    """
    scale = torch.as_tensor(expected, dtype=torch.float64).abs().max().item()
    torch.testing.assert_close(
        actual,
        expected,
        rtol=0.0,
        atol=ulps * FP32_EPS * scale,
        msg=None if msg is None else lambda report: f"{msg}: {report}",
    )
