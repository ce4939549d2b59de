"""The app as the CDK CLI runs it: offline, credential-free, failing early on bad context."""

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.conftest import ROOT, VARIANTS, Synth, context_with
from trn_catalog.outputs import TAG_EXPIRES_AT

CDK = ROOT / "node_modules" / ".bin" / "cdk"


def offline_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_EC2_METADATA_DISABLED="true",
        CDK_DISABLE_VERSION_CHECK="true",
        CDK_DISABLE_CLI_TELEMETRY="true",
        JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20",
        **extra,
    )
    return env


def run_app(context: dict[str, object], outdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "app.py"],
        cwd=ROOT,
        env=offline_env(CDK_CONTEXT_JSON=json.dumps(context), CDK_OUTDIR=str(outdir)),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_bad_context_stops_the_app_with_every_problem(tmp_path: Path) -> None:
    result = run_app({"trn_nodes": "100", "capacity": "odcr", "instance_typ": "trn2"}, tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "trn_nodes: '100' is not allowed; expected a whole number from 0 to 64" in result.stderr
    assert "capacity_reservation_id: missing; capacity 'odcr' needs" in result.stderr
    assert "instance_typ: unknown context key; did you mean 'instance_type'?" in result.stderr
    assert not list(tmp_path.glob("*.template.json"))


@pytest.mark.slow
def test_cdk_cli_synthesizes_the_default_platform_offline(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(CDK), "synth", "--no-notices", "--quiet", "--output", str(tmp_path)],
        cwd=ROOT,
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in tmp_path.glob("*.template.json"))
    assert names == [
        f"trn-dev-{part}.template.json"
        for part in ("cluster", "data", "image", "network", "workloads")
    ]
    network = json.loads((tmp_path / "trn-dev-network.template.json").read_text())
    zones = {
        r["Properties"]["AvailabilityZone"]
        for r in network["Resources"].values()
        if r["Type"] == "AWS::EC2::Subnet"
    }
    assert zones == {"us-east-2a", "us-east-2b"}


def test_a_preview_redeployed_later_changes_only_its_lifecycle(
    synth_variant: Callable[[str], Synth], tmp_path: Path
) -> None:
    """A redeploy hours later moves the expiry, and nothing else: a launch template or node group
    that changed would make EKS replace every node of the preview."""
    from app import build_app

    first = synth_variant("preview")
    later = datetime.now(UTC) + timedelta(hours=2, minutes=7)
    app, platform = build_app(context_with(VARIANTS["preview"]), str(tmp_path), now=later)
    app.synth()
    for path in sorted(first.outdir.glob("*.template.json")):
        again = (tmp_path / path.name).read_bytes()
        if path.name.endswith("-lifecycle.template.json"):
            assert again != path.read_bytes()
        else:
            assert again == path.read_bytes(), f"{path.name} changed with the clock"
    for before, after in zip(first.platform.stacks, platform.stacks, strict=True):
        old, new = before.tags.tag_values(), after.tags.tag_values()
        assert old.pop(TAG_EXPIRES_AT) < new.pop(TAG_EXPIRES_AT)
        assert old == new
