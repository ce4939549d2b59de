"""The library README's example, extracted and synthesized offline as another app would."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

README = ROOT / "constructs_lib" / "README.md"


def examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_every_example_synthesizes_offline(tmp_path: Path) -> None:
    found = examples()
    assert found
    for number, code in enumerate(found):
        assert "from_lookup" not in code, "lookups need an AWS account; examples stay offline"
        app = tmp_path / f"example{number}"
        app.mkdir()
        (app / "app.py").write_text(code)
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "CDK_OUTDIR": str(app / "out"),
            "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
        }
        result = subprocess.run(
            [sys.executable, "app.py"], cwd=app, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr[-3000:]
        templates = list((app / "out").glob("*.template.json"))
        assert templates
        types = {
            r["Type"]
            for t in templates
            for r in json.loads(t.read_text()).get("Resources", {}).values()
        }
        assert "Custom::AWSCDK-EKS-HelmChart" in types and "AWS::EKS::Nodegroup" in types
