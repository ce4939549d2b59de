"""Choosing the device backend: what ``auto`` picks, and what a backend refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer import device, stacks


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A machine with neither TorchNeuron nor CUDA, torch_xla installed, and an empty /dev."""
    monkeypatch.setattr(device, "_installed", lambda module: module == "torch_xla")
    monkeypatch.setattr(device.NeuronBackend, "available", classmethod(lambda cls: False))
    monkeypatch.setattr(device.CudaBackend, "available", classmethod(lambda cls: False))
    monkeypatch.delenv("NEURON_STACK", raising=False)
    monkeypatch.setattr(device, "DEV_DIR", tmp_path)
    return tmp_path


def test_auto_picks_xla_in_the_xla_image(machine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_STACK", "xla")
    assert device.select("auto") is device.XlaBackend


def test_auto_picks_xla_where_neuron_devices_show(machine: Path) -> None:
    (machine / "neuron0").touch()
    assert device.select("auto") is device.XlaBackend


def test_auto_leaves_torch_xla_alone_without_neuron(machine: Path) -> None:
    """torch_xla also runs on CPU (PJRT_DEVICE=CPU); there it is only used when named."""
    (machine / "nvme0").touch()
    assert device.select("auto") is device.Backend
    assert device.select("xla") is device.XlaBackend


def test_a_native_image_is_not_taken_for_xla(
    machine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEURON_STACK", "native")
    (machine / "neuron0").touch()
    assert device.select("auto") is device.Backend  # NeuronBackend is unavailable in this fake


def test_a_named_backend_that_is_missing_is_an_error(machine: Path) -> None:
    with pytest.raises(ValueError, match=r"device 'neuron' is not available on this machine"):
        device.select("neuron")
    with pytest.raises(ValueError, match=r"device 'tpu' is unknown; known: auto, neuron"):
        device.select("tpu")


def test_the_device_is_bound_by_start_not_by_resolve() -> None:
    backend = device.resolve("cpu")
    assert not hasattr(backend, "device")  # nothing bound before the process group exists
    assert backend.start().device == device.torch.device("cpu")


def test_torchneuron_refuses_trainium1_naming_the_xla_stack() -> None:
    with pytest.raises(ValueError, match=r"trn1\.32xlarge is Trainium1.*NEURON_STACK=xla"):
        device.NeuronBackend.check_instance("trn1.32xlarge")
    device.NeuronBackend.check_instance("trn2.48xlarge")
    device.NeuronBackend.check_instance("trn3.48xlarge")
    device.XlaBackend.check_instance("trn1.32xlarge")


def test_each_stack_names_a_backend() -> None:
    assert {s.device for s in stacks.STACKS.values()} <= set(device.BACKENDS)
