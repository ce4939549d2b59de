"""The cross-kernel tolerance (tests/tolerance.py): FP32 roundings of the largest magnitude; and
the run's report of which ATen CPU kernels it chose (``make test-isa``)."""

from __future__ import annotations

import re

import pytest
import torch

from tests.conftest import pytest_report_header
from tests.tolerance import FP32_EPS, assert_fp32_close


def test_the_bound_is_roundings_of_the_largest_magnitude_for_every_element() -> None:
    expected = torch.tensor([4.0, -0.5, 0.0])
    bound = 64 * FP32_EPS * 4.0
    # An element near zero is held to the largest's rounding, not to its own.
    assert_fp32_close(expected + torch.tensor([0.0, 0.0, bound]), expected)
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        assert_fp32_close(expected + torch.tensor([0.0, 2 * bound, 0.0]), expected)
    assert_fp32_close(expected + torch.tensor([0.0, 2 * bound, 0.0]), expected, ulps=128)


def test_floats_zeros_and_the_message() -> None:
    assert_fp32_close(2.0 * (1 + 60 * FP32_EPS), 2.0)
    with pytest.raises(AssertionError, match=re.escape("step 1's loss: Scalars are not close")):
        assert_fp32_close(2.0 * (1 + 70 * FP32_EPS), 2.0, msg="step 1's loss")
    with pytest.raises(AssertionError):
        assert_fp32_close(torch.tensor([1e-30]), torch.zeros(1))


def test_the_header_names_the_kernels_torch_took_where_the_variable_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert pytest_report_header() is None
    # torch read the variable at its import: what it reports is what this process runs.
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    running = torch.backends.cpu.get_cpu_capability()
    assert pytest_report_header() == f"ATen CPU kernels: {running} (ATEN_CPU_CAPABILITY=default)"
