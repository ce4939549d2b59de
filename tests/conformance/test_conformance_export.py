"""The export TrainJobs `trnctl job export [--merge-lora]` creates conform strictly to
Kubernetes and the pinned Trainer release (see kube_objects), and the merged one differs from
the adapter one only in the flag it passes to `trn-train export`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from kube_objects import problems

from tests.conftest import sample_outputs
from trnctl import jobs

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
OUTPUTS = sample_outputs()


def _export(merge_lora: bool) -> dict[str, Any]:
    name = jobs.generated_name("train", "llama-3.2-1b", NOW)
    return jobs.render_export(
        job_name=name,
        export=jobs.export_name(name, NOW),
        outputs=OUTPUTS,
        merge_lora=merge_lora,
    )


@pytest.mark.parametrize("merge_lora", [False, True])
def test_the_export_trainjob_conforms(merge_lora: bool) -> None:
    assert problems(_export(merge_lora)) == []


def test_the_merged_export_only_adds_the_flag() -> None:
    adapter, merged = _export(False), _export(True)
    adapter_args = adapter["spec"]["trainer"]["args"]
    merged_args = merged["spec"]["trainer"]["args"]

    assert merged_args == [*adapter_args, "--merge-lora"]
    merged["spec"]["trainer"]["args"] = adapter_args
    assert merged == adapter
