"""The app as the CDK CLI runs it: offline, credential-free, failing early on bad context."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

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
    result = run_app({"trn_nodes": "100", "capacity": "odcr"}, tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "trn_nodes: '100' is not allowed; expected a whole number from 0 to 64" in result.stderr
    assert "capacity_reservation_id: missing; capacity 'odcr' needs" in result.stderr
    assert not list(tmp_path.glob("*.template.json"))


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
