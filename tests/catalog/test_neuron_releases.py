"""The image's Neuron releases: one table per stack, internally consistent, sourced."""

import subprocess
import sys

import pytest

from trn_catalog import neuron_releases, neuron_stacks
from trn_catalog.neuron_releases import IMAGE_PYTHON, NATIVE, RELEASES, XLA


def test_every_stack_has_a_release_and_an_environment() -> None:
    assert set(RELEASES) == set(IMAGE_PYTHON) == set(neuron_stacks.NEURON_STACKS)
    for release in RELEASES.values():
        assert release.sources
        assert release.debs.keys() == {
            "aws-neuronx-runtime-lib",
            "aws-neuronx-collectives",
            "aws-neuronx-tools",
        }


def test_torchneuron_family_pairs_with_its_pytorch() -> None:
    """torch-neuronx 2.13.3.0.* is TorchNeuron for PyTorch 2.13; the two move together."""
    torch_minor = ".".join(NATIVE.wheels["torch"].split(".")[:2])
    assert NATIVE.wheels["torch-neuronx"].startswith(torch_minor + ".")
    assert NATIVE.wheels["torch-neuronx"].endswith(".*")


def test_native_base_is_an_os_the_release_ships_wheels_for() -> None:
    assert NATIVE.base_image == "ubuntu:26.04"
    assert NATIVE.version == "2.33.0"


def test_xla_release_is_the_last_supported_for_training_and_older_than_the_rest() -> None:
    def key(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in version.split("."))

    assert XLA.version == neuron_releases.PYTORCH_XLA_LAST_SUPPORTED_FOR_TRAINING
    assert key(XLA.version) < key(neuron_releases.PYTORCH_XLA_LAST_TRAINING_CONTAINER)
    assert key(neuron_releases.PYTORCH_XLA_LAST_TRAINING_CONTAINER) < key(
        neuron_releases.PYTORCH_XLA_LAST_SHIPPED
    )
    assert f"sdk{XLA.version}" in XLA.base_image


def test_unknown_stack_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"neuron stack 'jax' has no release.*known: native, xla"):
        neuron_releases.release("jax")


def test_module_imports_nothing_beyond_the_standard_library() -> None:
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import trn_catalog.neuron_releases\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names) - {'trn_catalog'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
