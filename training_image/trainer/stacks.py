"""The image's two Neuron stacks (its ``NEURON_STACK``) and what differs between them.

Standard library only: the entrypoint reads it before anything imports torch. Sources: Neuron's
TorchNeuron environment-variable reference (``TORCH_NEURONX_NEFF_CACHE_DIR``, default
``/tmp/neff_cache``, a file-system path; "Applies to Trn2 and Trn3"), torch-neuronx's
PersistentCacheBackend (atomic temp-file-and-rename writes, safe on a shared file system), the
Neuron persistent-cache guide (``NEURON_COMPILE_CACHE_URL``, a path or ``s3://``, default
``/var/tmp/neuron-compile-cache``) and the neuronx-cc CLI reference of Neuron 2.31
(``--auto-cast`` defaults to ``none`` since Neuron 2.27: without it FP32 matmuls stay FP32).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class NeuronStack:
    """One stack.

    Attributes:
        name: the ``NEURON_STACK`` value.
        device: the trainer's ``--device`` on this stack.
        cc_flags: the default ``NEURON_CC_FLAGS``.
        cache_variable: the variable this stack's compile cache reads.
        cache_base_variable: where the launcher keeps the unkeyed base of that cache.
        default_cache: the cache's own default location.
    """

    name: str
    device: str
    cc_flags: str
    cache_variable: str
    cache_base_variable: str
    default_cache: str


STACKS: dict[str, NeuronStack] = {
    # TorchNeuron: the trainer casts with torch.autocast (bf16), so the compiler must not cast
    # again.
    "native": NeuronStack(
        name="native",
        device="neuron",
        cc_flags="--model-type transformer --auto-cast=none",
        cache_variable="TORCH_NEURONX_NEFF_CACHE_DIR",
        cache_base_variable="TRN_NEFF_CACHE_BASE",
        default_cache="/tmp/neff_cache",
    ),
    # PyTorch/XLA: the trainer does not autocast, so the compiler must cast the matmuls to BF16;
    # its default stopped doing so in Neuron 2.27.
    "xla": NeuronStack(
        name="xla",
        device="xla",
        cc_flags="--model-type transformer --auto-cast=matmult --auto-cast-type=bf16",
        cache_variable="NEURON_COMPILE_CACHE_URL",
        cache_base_variable="NEURON_COMPILE_CACHE_BASE",
        default_cache="/var/tmp/neuron-compile-cache",
    ),
}
DEFAULT_STACK = "native"  # the Dockerfile's default NEURON_STACK


def of(env: Mapping[str, str]) -> NeuronStack:
    """The stack ``env`` names in ``NEURON_STACK`` (default native).

    Raises:
        ValueError: an unknown stack.
    """
    name = env.get("NEURON_STACK", DEFAULT_STACK)
    if name not in STACKS:
        raise ValueError(f"NEURON_STACK {name!r} is unknown; use {' or '.join(STACKS)}")
    return STACKS[name]


def check_instance(stack: NeuronStack, instance_type: str) -> None:
    """Refuses a stack on an instance generation it does not support (TorchNeuron on Trn1);
    the rule is the catalog's (:mod:`trn_catalog.neuron_stacks`).

    Raises:
        ValueError: naming the instance, the stack and the fix; or no instance type given.
        trn_catalog.UnknownInstanceTypeError: the instance type is not in the catalog.
    """
    import trn_catalog
    from trn_catalog import neuron_stacks

    if not instance_type:
        raise ValueError(
            f"the {stack.name} stack needs the node's Trainium instance type (the trainer's "
            "--instance-type; in the image, TRN_INSTANCE_TYPE, which the platform's pods set), "
            f"one of: {', '.join(trn_catalog.CATALOG)}"
        )
    problem = neuron_stacks.stack_problem(stack.name, instance_type)
    if problem:
        raise ValueError(f"{problem}; TrainingImage(neuron_stack=...) sets it")
