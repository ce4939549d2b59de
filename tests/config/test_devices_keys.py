"""The `devices` and `lnc` context keys: validated like the others, refusals naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from platform_config import ConfigError, parse_config


def parse(**context: Any) -> Any:
    return parse_config(context)


def test_the_default_is_device_plugins_at_the_types_lnc() -> None:
    config = parse()

    assert config.devices == "plugin"
    assert config.trn.lnc is None


def test_dra_and_a_node_lnc_are_read() -> None:
    assert parse(devices="dra").devices == "dra"
    assert parse(lnc="1", instance_type="trn2.48xlarge").trn.lnc == 1


def test_an_unknown_mode_is_refused_naming_the_key() -> None:
    with pytest.raises(
        ConfigError, match=r"devices: 'gpu' is not allowed; expected one of: plugin, dra"
    ):
        parse(devices="gpu")


def test_dra_before_kubernetes_1_34_is_refused_naming_key_and_value() -> None:
    with pytest.raises(
        ConfigError,
        match=r"devices: 'dra' is not allowed; DRA needs Kubernetes 1\.34 or later .*runs 1\.33",
    ):
        parse_config({"devices": "dra"}, kubernetes_version="1.33")
    assert parse_config({"devices": "dra"}, kubernetes_version="1.34").devices == "dra"


def test_dra_on_trn1_is_refused() -> None:
    with pytest.raises(
        ConfigError,
        match=r"devices: 'dra' is not allowed; the Neuron DRA driver serves trn2 and trn3 "
        r"types; instance_type is trn1\.32xlarge",
    ):
        parse(devices="dra", instance_type="trn1.32xlarge")


def test_lnc_on_trn1_is_refused_naming_the_key() -> None:
    with pytest.raises(
        ConfigError, match=r"lnc: '1' is not allowed; trn1n\.32xlarge has no logical NeuronCore"
    ):
        parse(lnc="1", instance_type="trn1n.32xlarge")


@pytest.mark.parametrize("value", ["3", "0", "two"])
def test_lnc_outside_one_and_two_is_refused(value: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"lnc: '{value}' is not allowed; expected a whole number from 1 to 2"
    ):
        parse(lnc=value)


def test_a_node_lnc_with_dra_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"lnc: '1' is not allowed; only used with devices 'plugin'"
    ):
        parse(devices="dra", lnc="1")
