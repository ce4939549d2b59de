"""TrainingImage's repository lifecycle (``keep_images``) and the props it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest

from constructs_lib import TrainingImage, TrainingImageProps
from tests.conftest import Synth


def lifecycle_rules(resources: dict[str, Any]) -> list[dict[str, Any]]:
    (repository,) = [r for r in resources.values() if r["Type"] == "AWS::ECR::Repository"]
    policy = repository["Properties"]["LifecyclePolicy"]["LifecyclePolicyText"]
    rules: list[dict[str, Any]] = json.loads(policy)["rules"]
    return rules


def expire_untagged_beyond(count: int) -> dict[str, Any]:
    """The ECR lifecycle rule that expires untagged images beyond the newest ``count`` (ECR
    lifecycle policy syntax: tagStatus untagged, countType imageCountMoreThan)."""
    return {
        "rulePriority": 1,
        "description": "Keep the newest untagged images only",
        "selection": {
            "tagStatus": "untagged",
            "countType": "imageCountMoreThan",
            "countNumber": count,
        },
        "action": {"type": "expire"},
    }


def test_platform_repository_keeps_20_untagged_images(dev: Synth) -> None:
    assert lifecycle_rules(dev.template("image")["Resources"]) == [expire_untagged_beyond(20)]


def image(tmp_path: Path, **overrides: Any) -> TrainingImage:
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    # No asset bundling: the lifecycle rule is all these tests read.
    app = cdk.App(outdir=str(tmp_path / "cdk.out"), context={"aws:cdk:bundling-stacks": []})
    stack = cdk.Stack(app, "I")
    props = TrainingImageProps(directory=str(context), dockerfile="Dockerfile", **overrides)
    return TrainingImage(stack, "Image", props=props)


def test_keep_images_reaches_the_rule(tmp_path: Path) -> None:
    built = image(tmp_path, keep_images=3)
    # The app's own synth: Template.from_stack would add a slow validation pass.
    assembly = built.node.root.synth(skip_validation=True)
    template = assembly.get_stack_by_name("I").template
    assert lifecycle_rules(template["Resources"]) == [expire_untagged_beyond(3)]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"keep_images": 0}, r"^keep_images 0 is not allowed; use >= 1$"),
        ({"keep_images": -5}, r"^keep_images -5 is not allowed; use >= 1$"),
        ({"neuron_stack": "cuda"}, r"^neuron_stack 'cuda' is not allowed; use native or xla$"),
    ],
)
def test_image_rejects_bad_props(tmp_path: Path, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        image(tmp_path, **overrides)
