"""The security gate: cdk-nag, cfn-lint and checkov over every variant, with zero findings."""

import contextlib
import functools
import hashlib
import json
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3
from cfnlint.config import ConfigMixIn
from cfnlint.decode.decode import decode_str
from cfnlint.runner.cli import Runner
from cfnlint.runner.template.runner import run_template_by_data

from constructs_lib.network import AWS_CUSTOM_RESOURCE_PROVIDER
from constructs_lib.preview import REAPER_CODE
from platform_config.parse import DEFAULT_REGION
from tests.conftest import ROOT, VARIANTS, Synth, context_with, synthesize
from trn_catalog.outputs import PREVIEW_REGIONS

CHECKOV = ROOT / ".tools" / "checkov" / "bin" / "checkov"
# cfn-lint knows trn2.48xlarge in us-east-2 only and no trn2u/trn3 at all.
TRN_TYPE_RULE = "E3628"


def trainium_regions() -> list[str]:
    """Where the pinned cfn-lint's EC2 instance-type data (from the AWS Pricing API) lists a
    Trainium type, and the default region. The instance catalog names no regions for trn3 (no
    source lists them), so these are the regions a Trainium platform is known to deploy to."""
    data = resources.files("cfnlint") / "data" / "schemas" / "extensions" / "aws_ec2_instance"
    offered = json.loads((data / "instancetype_enum.json").read_text())
    regions = {
        region
        for region, types in offered.items()
        if isinstance(types, dict) and any(t.startswith("trn") for t in types["enum"])
    }
    return sorted(regions | {DEFAULT_REGION})


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cdk_nag_finds_nothing_unacknowledged(
    synth_variant: Callable[[str], Synth], variant: str
) -> None:
    report = synth_variant(variant).report
    for plugin in report["pluginReports"]:
        assert plugin["violations"] == [], plugin["pluginName"]
        for suppressed in plugin.get("suppressedViolations", []):
            assert len(suppressed["reason"]) >= 20, suppressed
            stack_paths = {s.split("/")[0] for s in synth_variant(variant).templates}
            assert suppressed["acknowledgedAt"] not in stack_paths, suppressed


def test_cdk_nag_gate_is_live(tmp_path: Path) -> None:
    from app import build_app

    app, platform = build_app(context_with({}), outdir=str(tmp_path))
    s3.Bucket(platform.data, "Unsafe")
    with pytest.raises(RuntimeError, match="AwsSolutions-S10"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    rules = {v["ruleName"] for p in report["pluginReports"] for v in p["violations"]}
    assert {"AwsSolutions-S1", "AwsSolutions-S10"} <= rules


@functools.cache
def _cfn_lint_rules() -> Any:
    """cfn-lint's rules, loaded once per test process: loading them is a third of a small
    template's lint."""
    return Runner(ConfigMixIn(regions=[DEFAULT_REGION])).rules


@functools.cache
def _cfn_lint_matches(text: str, region: str) -> list[tuple[int, str, str]]:
    """(line, rule, message) of every match cfn-lint finds in a template's text in ``region``;
    the same text is linted once (several variants share a stack's template)."""
    template, problems = decode_str(text)
    config = ConfigMixIn(regions=[region])
    matches = problems or list(run_template_by_data(template, config, _cfn_lint_rules()))
    return [(m.linenumber, m.rule.id, m.message) for m in matches]


def cfn_lint_errors(*templates: Path, region: str = DEFAULT_REGION) -> list[str]:
    """cfn-lint's errors for ``templates`` in ``region``: a resource type or property that
    CloudFormation does not offer there is an error (E3006, E3002), as the deploy would be.
    Each error reads ``path:line:rule:message``."""
    errors = []
    for path in templates:
        for line, rule, message in _cfn_lint_matches(path.read_text(), region):
            if not rule.startswith("E"):
                continue
            flagged = message.split("'")[1] if message.startswith("'") else ""
            if rule == TRN_TYPE_RULE and flagged.startswith("trn"):
                continue
            errors.append(f"{path}:{line}:{rule}:{message}")
    return errors


def lint(*synths: Synth) -> list[str]:
    """cfn-lint's errors for every template of ``synths``, all in the one region they deploy
    to."""
    (region,) = {cdk.Stack.of(stack).region for s in synths for stack in s.platform.stacks}
    templates = [s.outdir / f"{name}.template.json" for s in synths for name in s.templates]
    assert len(templates) >= 5 * len(synths)
    return cfn_lint_errors(*templates, region=region)


@pytest.mark.slow
def test_cfn_lint_has_no_errors(synth_variant: Callable[[str], Synth]) -> None:
    """Every variant (all deploy to the default region); an error line names its template."""
    assert lint(*map(synth_variant, sorted(VARIANTS))) == []


@pytest.mark.slow
@pytest.mark.parametrize("region", [r for r in trainium_regions() if r != DEFAULT_REGION])
def test_cfn_lint_has_no_errors_in_every_trainium_region(
    tmp_path_factory: pytest.TempPathFactory, region: str
) -> None:
    """The preview variant (every stack, the lifecycle's too) synthesized for each region where
    Trainium runs, or the dev variant where previews cannot go; the variants above cover the
    default region."""
    zones = {
        f"availability-zones:account=123456789012:region={region}": [f"{region}a", f"{region}b"]
    }
    overrides = {
        **(VARIANTS["preview"] if region in PREVIEW_REGIONS else VARIANTS["dev"]),
        **zones,
        "region": region,
        "availability_zone": f"{region}a",
    }
    synth = synthesize(overrides, tmp_path_factory.mktemp(f"cdk-{region}"))
    assert lint(synth) == []


def test_the_gate_lints_in_the_deploy_region(tmp_path: Path) -> None:
    """us-east-2, the default region, has no AWS::EC2::SubnetCidrReservation in cfn-lint 1.58's
    schemas (CloudFormation's regional ones): the same template passes in us-east-1 only."""
    path = tmp_path / "reservation.template.json"
    properties = {
        "SubnetId": "subnet-0123456789abcdef0",
        "Cidr": "10.0.0.0/20",
        "ReservationType": "prefix",
    }
    resource = {"Type": "AWS::EC2::SubnetCidrReservation", "Properties": properties}
    path.write_text(json.dumps({"Resources": {"R": resource}}))
    assert cfn_lint_errors(path, region="us-east-1") == []
    (error,) = cfn_lint_errors(path, region=DEFAULT_REGION)
    assert ":E3006:" in error
    assert {"us-east-1", DEFAULT_REGION} <= set(trainium_regions())


def test_cfn_lint_ignores_unknown_types_only_when_they_are_trn(tmp_path: Path) -> None:
    def template(instance_type: str) -> Path:
        path = tmp_path / f"{instance_type}.template.json"
        data = {"InstanceType": instance_type, "ImageId": "ami-12345678"}
        resource = {"Type": "AWS::EC2::LaunchTemplate", "Properties": {"LaunchTemplateData": data}}
        path.write_text(json.dumps({"Resources": {"T": resource}}))
        return path

    assert cfn_lint_errors(template("trn3.48xlarge")) == []
    assert any(TRN_TYPE_RULE in e for e in cfn_lint_errors(template("p9.48xlarge")))


def test_cfn_lint_would_report_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.template.json"
    bad.write_text(
        json.dumps({"Resources": {"B": {"Type": "AWS::S3::Bucket", "Properties": {"Nope": 1}}}})
    )
    assert cfn_lint_errors(bad)


def distinct(paths: list[Path]) -> list[Path]:
    """The first path of each distinct template text: variants share most stacks' templates."""
    first: dict[bytes, Path] = {}
    for path in paths:
        first.setdefault(hashlib.sha256(path.read_bytes()).digest(), path)
    return list(first.values())


def checkov_failures(*templates: Path) -> dict[str, object]:
    result = subprocess.run(
        [
            str(CHECKOV),
            "--config-file",
            str(ROOT / ".checkov.yaml"),
            "--output",
            "json",
            "--file",
            *map(str, templates),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.stdout, result.stderr
    parsed = json.loads(result.stdout)
    reports = parsed if isinstance(parsed, list) else [parsed]
    summary = {"failed": sum(r["summary"]["failed"] for r in reports)}
    summary["checks"] = [
        (c["check_id"], c["file_abs_path"], c["resource"])
        for r in reports
        for c in r["results"]["failed_checks"]
    ]
    summary["passed"] = sum(r["summary"]["passed"] for r in reports)
    return summary


@pytest.mark.slow
def test_checkov_has_no_failed_checks(
    synth_variant: Callable[[str], Synth], tmp_path: Path
) -> None:
    """Every variant's distinct templates in one checkov run (its start-up is much of its time),
    with an unencrypted bucket beside them to show that the gate fires: only that template may
    fail. A failure names the template's path, which names the (first) variant that has it."""
    unsafe = tmp_path / "unsafe.template.json"
    bucket = {"Type": "AWS::S3::Bucket", "Properties": {}}
    unsafe.write_text(json.dumps({"Resources": {"Unsafe": bucket}}))
    templates = distinct(
        [
            synth.outdir / f"{name}.template.json"
            for synth in map(synth_variant, sorted(VARIANTS))
            for name in synth.templates
        ]
    )
    summary = checkov_failures(unsafe, *templates)
    failed = summary["checks"]
    assert isinstance(failed, list) and failed
    assert {Path(path) for _, path, _ in failed} == {unsafe}, failed
    assert summary["passed"] > 50 * len(VARIANTS)


def test_checkov_skips_are_each_justified() -> None:
    text = (ROOT / ".checkov.yaml").read_text().splitlines()
    skips = [i for i, line in enumerate(text) if line.strip().startswith("- CKV")]
    assert skips
    for index in skips:
        before = text[:index]
        # Each skip sits under a comment block that says why (shared by a group of skips).
        comment = next(line for line in reversed(before) if not line.strip().startswith("- CKV"))
        assert comment.strip().startswith("#"), text[index]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_only_cdk_custom_resource_providers_are_lambda_functions(
    synth_variant: Callable[[str], Synth], variant: str
) -> None:
    synth = synth_variant(variant)
    for name, template in synth.templates.items():
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] == "AWS::Lambda::Function":
                known = (
                    "CustomResourceProvider",
                    "KubectlProvider",
                    "LifecycleReaper",
                    "CustomCDKECRDeployment",
                    AWS_CUSTOM_RESOURCE_PROVIDER,
                )
                assert any(part in logical_id for part in known), (name, logical_id)


def _templates_at(now: datetime, outdir: Path) -> dict[str, str]:
    from app import build_app

    app, _ = build_app(context_with(VARIANTS["preview"]), outdir=str(outdir), now=now)
    app.synth()
    return {path.name: path.read_text() for path in sorted(outdir.glob("*.template.json"))}


def test_synth_is_deterministic(tmp_path: Path) -> None:
    """The preview (every stack) twice at one time, the second with bytecode caches beside
    the sources the image and the reaper's assets hash (Python writes them wherever
    PYTHONDONTWRITEBYTECODE is unset): the same templates, so neither the image's tag nor the
    reaper's code key moves and a deploy from such a checkout rebuilds nothing."""
    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    # Two output directories: CDK keeps an asset's hash per directory and would not look again.
    first = _templates_at(now, tmp_path / "first")
    stray = f"stray-{tmp_path.name}.pyc"
    # The image's context takes trn_catalog/ and training_image/trainer/ (.dockerignore). A stray
    # beside the trainer's modules would land in the ops wheel another worker may be building
    # (its force-include skips __pycache__ only), so that one goes beside the catalog's.
    strays = [ROOT / "trn_catalog" / stray]
    strays += [ROOT / "training_image" / "trainer" / "__pycache__" / stray]
    strays += [REAPER_CODE / stray, REAPER_CODE / "__pycache__" / stray]
    made = [d for d in {s.parent for s in strays} if not d.exists()]
    try:
        for path in strays:
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(b"\0")
        again = _templates_at(now, tmp_path / "again")
    finally:
        for path in strays:
            path.unlink(missing_ok=True)
        for directory in made:
            # Another worker may have cached a module there meanwhile: then it stays.
            with contextlib.suppress(OSError):
                directory.rmdir()
    assert len(first) >= 6 and again == first


def test_data_stack_depends_on_the_network_only(dev: Synth) -> None:
    artifacts = dev.manifest()["artifacts"]
    data = next(a for n, a in artifacts.items() if n.endswith("-data"))
    stacks = {n for n, a in artifacts.items() if a["type"] == "aws:cloudformation:stack"}
    assert set(data.get("dependencies", [])) & stacks == {"trn-dev-network"}
    template = json.dumps(dev.template("data"))
    assert "Cluster" not in template and "AWS::EKS" not in template


def test_stack_tags_name_the_environment(dev: Synth) -> None:
    for synth_stack in dev.platform.stacks:
        tags = cdk.Stack.of(synth_stack).tags.tag_values()
        assert tags["trn-platform:environment"] == "trn-dev"
        assert tags["trn-platform:profile"] == "dev"
