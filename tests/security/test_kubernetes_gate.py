"""checkov's Kubernetes checks over every object the platform applies, with zero findings: each
variant's manifests, and the pod of each TrainingRuntime (a custom kind checkov does not open)
as a Pod. Skips are in .checkov-kubernetes.yaml, each with its reason."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conformance.kube_objects import manifests
from tests.conftest import ROOT, VARIANTS, Synth
from tests.security.test_gate import CHECKOV

CONFIG = ROOT / ".checkov-kubernetes.yaml"


def scanned(obj: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """``obj``, or for a TrainingRuntime the Pod of each of its replicated jobs."""
    if obj["kind"] != "TrainingRuntime":
        yield dict(obj)
        return
    namespace = obj["metadata"]["namespace"]
    for job in obj["spec"]["template"]["spec"]["replicatedJobs"]:
        name = f"{obj['metadata']['name']}-{job['name']}"
        meta = {"name": name, "namespace": namespace}
        spec = job["template"]["spec"]["template"]["spec"]
        yield {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def failures(folder: Path) -> list[tuple[str, str]]:
    """(check id, resource) of each failed check over the YAML files of ``folder``."""
    done = subprocess.run(
        [str(CHECKOV), "--config-file", str(CONFIG), "--output", "json", "-d", str(folder)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.stdout, done.stderr
    parsed = json.loads(done.stdout)
    reports = parsed if isinstance(parsed, list) else [parsed]
    assert sum(r["summary"]["passed"] for r in reports) > 100
    return [(c["check_id"], c["resource"]) for r in reports for c in r["results"]["failed_checks"]]


@pytest.mark.slow
def test_checkov_finds_nothing_in_the_kubernetes_objects(
    synth_variant: Callable[[str], Synth], tmp_path: Path
) -> None:
    """Every variant's distinct objects in one run, beside a privileged pod that shows the gate
    fires: only that pod may fail."""
    folder = tmp_path / "objects"
    folder.mkdir()
    seen: set[bytes] = set()
    for variant in sorted(VARIANTS):
        for applied in manifests(synth_variant(variant).templates):
            for obj in scanned(applied.obj):
                text = yaml.safe_dump(obj, sort_keys=True)
                digest = hashlib.sha256(text.encode()).digest()
                if digest not in seen:
                    seen.add(digest)
                    (folder / f"{variant}-{len(seen):03d}.yaml").write_text(text)
    container = {"name": "c", "image": "x", "securityContext": {"privileged": True}}
    unsafe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unsafe"}}
    (folder / "unsafe.yaml").write_text(
        yaml.safe_dump({**unsafe, "spec": {"containers": [container]}})
    )

    found = failures(folder)

    assert found and {resource for _, resource in found} == {"Pod.default.unsafe"}, found


def test_kubernetes_skips_are_each_justified() -> None:
    text = CONFIG.read_text().splitlines()
    skips = [i for i, line in enumerate(text) if line.strip().startswith("- CKV")]
    assert skips
    for index in skips:
        comment = next(
            line for line in reversed(text[:index]) if not line.strip().startswith("- CKV")
        )
        assert comment.strip().startswith("#"), text[index]
