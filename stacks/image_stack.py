"""The image stack: the training image repository and the bundled trainer image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import Stack
from constructs import Construct

from constructs_lib import TrainingImage
from platform_config import PlatformConfig
from stacks._removal import removal_policy
from trn_catalog import neuron_stacks

# The image builds from the repository root; its .dockerignore lets in the trainer and catalog.
REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
CUDA_DOCKERFILE = "training_image/Dockerfile.cuda"


class ImageStack(Stack):
    """Composes :class:`TrainingImage` over this repository's training_image/Dockerfile, and
    its CUDA variant (training_image/Dockerfile.cuda) only when the config has a GPU group."""

    def __init__(
        self, scope: Construct, construct_id: str, *, config: PlatformConfig, **kwargs: Any
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.image = TrainingImage(
            self,
            "TrainingImage",
            directory=str(REPOSITORY_ROOT),
            # TorchNeuron where it runs (trn2, trn3); the PyTorch/XLA stack on trn1.
            neuron_stack=neuron_stacks.default_stack(config.trn.instance_type),
            removal_policy=removal_policy(config),
            cuda_dockerfile=CUDA_DOCKERFILE if config.gpu is not None else None,
        )
