"""Which of the training image's two Neuron stacks runs on which Trainium generation.

``native`` is TorchNeuron (Neuron's own PyTorch device), which Neuron documents for Trn2 and Trn3
only ("Applies to Trn2 and Trn3"); ``xla`` is the last PyTorch/XLA stack (torch-neuronx), which
also runs on Trn1. Shared by the image and workload stacks, the workspace construct and the
trainer's entrypoint, so that a mismatch is refused at synth and again when a job starts.
"""

from __future__ import annotations

from trn_catalog.instances import get

NEURON_STACKS: tuple[str, ...] = ("native", "xla")
MIN_GENERATION: dict[str, int] = {"native": 2, "xla": 1}


def default_stack(instance_type: str) -> str:
    """``native`` where TorchNeuron runs, else ``xla``.

    Raises:
        UnknownInstanceTypeError: the type is not in the catalog.
    """
    generation = get(instance_type).generation
    return "native" if generation >= MIN_GENERATION["native"] else "xla"


def stack_problem(stack: str, instance_type: str) -> str | None:
    """Why ``stack`` cannot train on ``instance_type``, or None.

    Raises:
        UnknownInstanceTypeError: the type is not in the catalog.
    """
    if stack not in NEURON_STACKS:
        return f"neuron stack {stack!r} is unknown; use {' or '.join(NEURON_STACKS)}"
    generation = get(instance_type).generation
    if generation < MIN_GENERATION[stack]:
        return (
            f"instance type {instance_type} is Trainium{generation}, which the {stack} stack "
            f"does not support; use the {default_stack(instance_type)} stack (build the image "
            f"with --build-arg NEURON_STACK={default_stack(instance_type)})"
        )
    return None
