"""What the workspace's runtimes hand the trainer for its CloudWatch metrics and metrics header, in
both device modes: the environment, the job (from its pods' JobSet label), the agent's EMF
endpoint and the capacity; and the pods' environment label for EKS split cost allocation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kubernetes_validate
import pytest
from test_runtime_seam import synthesized_runtime, trainer_job

from tests.conftest import Synth
from trn_catalog import devices as device_modes
from trn_catalog import observability as obs
from trn_catalog import workspace as ws


def _pod_template(runtime: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = trainer_job(runtime)["template"]["spec"]["template"]
    return template


def _env(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize(
    ("variant", "runtime", "capacity"),
    [
        ("dev", ws.RUNTIME_NAME, {obs.CAPACITY_ENV: "on-demand"}),
        ("dra", ws.RUNTIME_NAME, {obs.CAPACITY_ENV: "on-demand"}),
        (
            "capacity-block",
            ws.RUNTIME_NAME,
            {
                obs.CAPACITY_ENV: "capacity-block",
                obs.CAPACITY_RESERVATION_ENV: "cr-0123456789abcdef0",
            },
        ),
        ("gpu", ws.GPU_RUNTIME_NAME, {obs.CAPACITY_ENV: "on-demand"}),
    ],
)
def test_runtime_pods_name_the_environment_job_agent_and_capacity(
    synth_variant: Callable[[str], Synth], variant: str, runtime: str, capacity: dict[str, str]
) -> None:
    synth = synth_variant(variant)
    name = synth.platform.workloads.outputs.environment
    template = _pod_template(synthesized_runtime(synth, runtime))
    env = _env(template)

    job_label = f"metadata.labels['{obs.JOB_NAME_LABEL}']"
    assert env[obs.JOB_ENV] == {"fieldRef": {"fieldPath": job_label}}
    assert env[obs.ENVIRONMENT_ENV] == name
    assert env[obs.EMF_AGENT_ENDPOINT_ENV] == obs.EMF_AGENT_ENDPOINT
    assert {k: env.get(k) for k in capacity} == capacity
    assert template["metadata"]["labels"] == {obs.ENVIRONMENT_LABEL: name}
    pod = {"apiVersion": "v1", "kind": "Pod", **template}
    pod["metadata"] = {**template["metadata"], "name": "p"}
    kubernetes_validate.validate(pod, "1.35.0", strict=True)


def test_every_dra_runtime_carries_the_same_wiring(synth_variant: Callable[[str], Synth]) -> None:
    synth = synth_variant("dra")
    spec = synth.platform.cluster.trainium.spec
    names = [device_modes.runtime_name(spec, lnc) for lnc in device_modes.LNC_VALUES]
    for name in names:
        env = _env(_pod_template(synthesized_runtime(synth, name)))
        assert env[obs.EMF_AGENT_ENDPOINT_ENV] == obs.EMF_AGENT_ENDPOINT, name
