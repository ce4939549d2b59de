"""The Neuron SDK release each stage of the training image installs, as one table per stage.

Every Neuron pin in ``training_image/Dockerfile`` comes from one row here, and a test parses the
Dockerfile against it, so that an image never mixes components of two releases. Versions are
the ones the release's own tables give; a stage built from a Neuron deep-learning container (the
``xla`` stage) records the components that container's Dockerfile pins.

Standard library only: the trainer image copies the catalog.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class NeuronRelease:
    """One Neuron SDK release as a stage of the image installs it.

    Attributes:
        version: the Neuron SDK release.
        released: its release date (ISO 8601).
        base_image: the image the stage starts from; for ``native`` an OS the release's wheels
            support, for ``xla`` the release's deep-learning container.
        debs: Debian packages (apt), name to upstream version (the Debian revision after it is
            a build hash the release tables leave out; the Dockerfile matches it with ``-*``).
        wheels: pip distributions, name to version; a trailing ``.*`` is a package family the
            release names that way (pip's prefix match).
        python: the Python versions the release's wheels support.
        host_driver: the aws-neuronx-dkms version of the release, for the node AMI.
        sources: where each fact comes from.
    """

    version: str
    released: str
    base_image: str
    debs: Mapping[str, str]
    wheels: Mapping[str, str]
    python: tuple[str, ...]
    host_driver: str
    sources: tuple[str, ...] = field(default=())


# TorchNeuron (the native PyTorch backend) ships first in Neuron 2.33.0, as a public beta for
# Trn2 and Trn3. Sources: the 2.33.0 component release-notes index (docs v2.33.0,
# release-notes/components/index) for the compiler, runtime, collectives, tools, driver, NKI and
# TorchNeuron versions; the TorchNeuron 2.33.0 release notes (release-notes/components/
# torchneuron) for the torch-neuronx 2.13.3.0.* family on PyTorch 2.13.0, Python 3.12-3.14 and
# Ubuntu 24.04/26.04; and the torch-neuronx quickstart (docs v2.33.1, torch/get-started/
# quickstart-torch-neuron), which says this release's standalone wheels support Ubuntu 26.04
# only (24.04 needs the DLAMI or a source build), hence the base image.
NATIVE = NeuronRelease(
    version="2.33.0",
    released="2026-10-19",
    base_image="ubuntu:26.04",
    debs=MappingProxyType(
        {
            "aws-neuronx-runtime-lib": "2.35.30.0",
            "aws-neuronx-collectives": "2.35.43.0",
            "aws-neuronx-tools": "2.33.38.0",
        }
    ),
    wheels=MappingProxyType(
        {
            "torch": "2.13.0",
            "torch-neuronx": "2.13.3.0.*",
            "neuronx-cc": "2.28.7631.0",
            "nki": "0.7.0",
        }
    ),
    python=("3.12", "3.13", "3.14"),
    host_driver="2.31.7.0",
    sources=(
        "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/release-notes/components/index.html",
        "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/release-notes/components/torchneuron.html",
        "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.1/torch/get-started/quickstart-torch-neuron.html",
    ),
)

# The last release in which Neuron supports PyTorch/XLA for training, and its training
# container. Neuron's announcement with 2.30.0 ("Neuron no longer supports PyTorch/XLA for
# training starting with Neuron 2.30") ends training support at 2.29.x. The torch-neuronx 2.9
# (PyTorch/XLA) wheels still shipped in 2.30 and 2.31 (2.31.1 the last; 2.32.0 has none, and
# its install pages say to pin 2.31 for it), and a training container was still published for
# 2.30.0; neither is a supported training stack. Sources: aws-neuron/aws-neuron-sdk@v2.30.0
# about-neuron/announcements/neuron2.x/announce-no-support-pytorch-xla-training.rst;
# src/helperscripts/n2-manifest.json at v2.29.1 (components) and v2.32.0 (no torch-neuronx);
# aws-neuron/deep-learning-containers@2.29.1 pytorch/training/2.9.0/Dockerfile.neuronx (the
# container's pins) and its README (image tags).
XLA = NeuronRelease(
    version="2.29.1",
    released="2026-05-01",
    base_image="public.ecr.aws/neuron/pytorch-training-neuronx:2.9.0-neuronx-py312-sdk2.29.1-ubuntu24.04",
    debs=MappingProxyType(
        {
            "aws-neuronx-runtime-lib": "2.31.24.0",
            "aws-neuronx-collectives": "2.31.24.0",
            "aws-neuronx-tools": "2.29.22.0",
        }
    ),
    wheels=MappingProxyType(
        {
            "torch": "2.9.*",
            "torch-neuronx": "2.9.0.2.13.26312",
            "neuronx-cc": "2.24.8799.0",
        }
    ),
    python=("3.12",),
    host_driver="2.27.4.0",
    sources=(
        "aws-neuron/aws-neuron-sdk@v2.29.1:src/helperscripts/n2-manifest.json",
        "aws-neuron/deep-learning-containers@2.29.1:pytorch/training/2.9.0/Dockerfile.neuronx",
        "aws-neuron/aws-neuron-sdk@v2.30.0:about-neuron/announcements/neuron2.x/"
        "announce-no-support-pytorch-xla-training.rst",
    ),
)

# What the sources above disagree on, each release in one word: supported for training until
# 2.29.x; wheels shipped until 2.31.1; a training container published until 2.30.0.
PYTORCH_XLA_LAST_SUPPORTED_FOR_TRAINING = "2.29.1"
PYTORCH_XLA_LAST_SHIPPED = "2.31.1"
PYTORCH_XLA_LAST_TRAINING_CONTAINER = "2.30.0"

RELEASES: Mapping[str, NeuronRelease] = MappingProxyType({"native": NATIVE, "xla": XLA})

# The EFA installer the native stage runs. Neuron's release manifest names efa-installer 1.47
# for every release from 2.29.1 to 2.32.0 (n2-manifest.json); the 2.33.0 tables read for this
# catalog name no EFA installer, and whether 1.47 supports Ubuntu 26.04 is not confirmed.
EFA_INSTALLER = "1.47.0"
EFA_INSTALLER_SOURCE = "aws-neuron/aws-neuron-sdk@v2.32.0:src/helperscripts/n2-manifest.json"

# The library directories the Neuron deep-learning containers put on LD_LIBRARY_PATH for the
# Neuron runtime and the EFA libfabric (aws-neuron/deep-learning-containers@2.29.1,
# pytorch/training/2.9.0/Dockerfile.neuronx; the same lines at 2.30.0). The native stage sets
# them; the xla stage inherits them from that container.
LIBRARY_DIRS: tuple[str, ...] = (
    "/opt/aws/neuron/lib",
    "/opt/amazon/efa/lib",
    "/opt/amazon/efa/lib64",
)


@dataclass(frozen=True)
class ImagePython:
    """The Python distributions a stage's environment holds for the trainer.

    Attributes:
        installed: distributions the Dockerfile installs itself (pip) in this stage or the
            shared trainer stage.
        from_base: distributions the base image already holds (the xla stage's container).
        transitive: distributions present as a dependency, each with the one that pulls it in.
    """

    installed: tuple[str, ...]
    from_base: tuple[str, ...] = ()
    transitive: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def all(self) -> frozenset[str]:
        return frozenset((*self.installed, *self.from_base, *self.transitive))


# boto3 and safetensors are installed explicitly in both stages (S3 checkpoints import boto3,
# Hugging Face weights safetensors); botocore comes with boto3. In the xla container, torch-xla
# comes with torch-neuronx (Neuron's install pages install torch-neuronx alone and describe
# torch-xla as installed with it) and numpy with torch-xla (its install_requires in pytorch/xla's
# setup.py). trnctl's own (typer, rich, kubernetes, jsonschema, PyYAML) are installed in both for
# pipelines' controllers, which run `python3 -m trnctl` in the image.
TRNCTL_DISTRIBUTIONS = ("typer", "rich", "kubernetes", "jsonschema", "PyYAML")
IMAGE_PYTHON: Mapping[str, ImagePython] = MappingProxyType(
    {
        "native": ImagePython(
            installed=(
                "torch",
                "torch-neuronx",
                "neuronx-cc",
                "nki",
                "numpy",
                "boto3",
                "safetensors",
                *TRNCTL_DISTRIBUTIONS,
            ),
            transitive=MappingProxyType({"botocore": "boto3"}),
        ),
        "xla": ImagePython(
            installed=("boto3", "safetensors", *TRNCTL_DISTRIBUTIONS),
            from_base=("torch", "torch-neuronx", "neuronx-cc"),
            transitive=MappingProxyType(
                {"botocore": "boto3", "torch-xla": "torch-neuronx", "numpy": "torch-xla"}
            ),
        ),
    }
)


def release(stack: str) -> NeuronRelease:
    """The release stage ``stack`` installs.

    Raises:
        ValueError: an unknown stack (the message lists the known ones).
    """
    try:
        return RELEASES[stack]
    except KeyError:
        raise ValueError(
            f"neuron stack {stack!r} has no release in the catalog; known: {', '.join(RELEASES)}"
        ) from None
