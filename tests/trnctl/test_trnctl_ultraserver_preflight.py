"""Preflight and validate know the UltraServers and read the device mode and LNC back from the
trn nodes' labels (a fake API server with the real kubernetes client, moto for AWS)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
import yaml
from fake_kube import FakeKube, serve

from tests.conftest import sample_outputs
from trnctl import kube, preflight, validation
from trnctl.errors import TrnctlError

A, B = "cr-0123456789abcdef2", "cr-0123456789abcdef3"
ULTRA = sample_outputs(
    instance_type="trn2u.48xlarge",
    trn_nodes=8,
    lnc=2,
    ultraserver_type="u-trn2x64",
    ultraserver_ids=f"{A},{B}",
)
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def labels(
    ultraserver: str | None = None, devices: str = "plugin", lnc: str = "2"
) -> dict[str, str]:
    found = {
        "trn-platform/node-type": "trainium",
        "trn-platform/devices": devices,
        "trn-platform/lnc": lnc,
    }
    if ultraserver:
        found["trn-platform/ultraserver-id"] = ultraserver
    return found


def fleet(per_server: dict[str, int]) -> dict[str, dict[str, str]]:
    return {
        f"ip-{uid[-1]}-{i}": labels(uid) for uid, count in per_server.items() for i in range(count)
    }


def by_name(checks: list[preflight.Check]) -> dict[str, preflight.Check]:
    return {c.name: c for c in checks}


def test_nodes_that_agree_with_the_outputs_pass_and_list_the_ultraservers() -> None:
    checks = by_name(preflight.check_nodes(ULTRA, fleet({A: 4, B: 4})))

    assert checks["devices on the nodes"].status is preflight.Status.PASS
    assert checks["devices on the nodes"].detail == "trn-platform/devices=plugin on all 8 nodes"
    assert checks["LNC on the nodes"].detail == "trn-platform/lnc=2 on all 8 nodes"
    ultra = checks["UltraServers"]
    assert ultra.status is preflight.Status.PASS
    assert ultra.detail == f"u-trn2x64 x 2: {A}: 4/4 nodes; {B}: 4/4 nodes"


def test_a_node_whose_labels_differ_from_the_outputs_fails_naming_it() -> None:
    nodes = fleet({A: 4})
    nodes["ip-2-1"] = labels(A, devices="dra", lnc="per-job")

    checks = by_name(preflight.check_nodes(sample_outputs(), nodes))

    devices = checks["devices on the nodes"]
    assert devices.status is preflight.Status.FAIL
    assert devices.detail == (
        "trn-platform/devices differs from the environment's outputs (plugin) on ip-2-1: dra"
    )
    assert checks["LNC on the nodes"].detail.endswith("(2) on ip-2-1: per-job")
    # A node of an UltraServer the outputs do not list.
    assert checks["UltraServers"].status is preflight.Status.FAIL


def test_dra_nodes_say_lnc_per_job() -> None:
    dra = replace(ULTRA, devices="dra", lnc=0)
    nodes = {n: labels(A, devices="dra", lnc="per-job") for n in ("a", "b", "c", "d")}
    checks = by_name(preflight.check_nodes(dra, nodes))
    assert checks["LNC on the nodes"].status is preflight.Status.PASS


def test_a_short_or_missing_ultraserver_warns() -> None:
    check = preflight.check_ultraservers(ULTRA, fleet({A: 3}))

    assert check.status is preflight.Status.WARN
    assert check.detail == f"u-trn2x64 x 2: {A}: 3/4 nodes; {B}: 0/4 nodes"
    assert check.fix.startswith(f"not yet full: {A}, {B}")


SERVER_4 = "neuron.amazonaws.com/ultraserver-server-id-4"
NODE_4 = "neuron.amazonaws.com/ultraserver-node-id-4"


def with_neuron_labels(
    nodes: dict[str, dict[str, str]], server_of: dict[str, str]
) -> dict[str, dict[str, str]]:
    """The Neuron docs' labels as their guide lists them: a server id per UltraServer and each
    node's position in it (here: per block, in name order)."""
    positions: dict[str, int] = {}
    labelled = {}
    for name, found in sorted(nodes.items()):
        block = found["trn-platform/ultraserver-id"]
        position = positions.get(block, 0)
        positions[block] = position + 1
        labelled[name] = {**found, SERVER_4: server_of[block], NODE_4: str(position)}
    return labelled


def test_neuron_labels_that_agree_with_the_blocks_pass() -> None:
    nodes = with_neuron_labels(fleet({A: 4, B: 4}), {A: "bog79p1y8tetj5uu", B: "u5wy80u0o2saugxy"})

    check = by_name(preflight.check_nodes(ULTRA, nodes))["Neuron UltraServer labels"]

    assert check.status is preflight.Status.PASS
    assert check.detail == f"each UltraServer block is one {SERVER_4} with distinct node ids"


def test_without_neuron_labels_preflight_warns_and_says_jobs_still_place() -> None:
    check = by_name(preflight.check_nodes(ULTRA, fleet({A: 4})))["Neuron UltraServer labels"]

    assert check.status is preflight.Status.WARN
    assert check.detail == f"{SERVER_4} is on none of the 4 UltraServer nodes"
    assert "jobs place by trn-platform/ultraserver-id" in check.fix


def test_a_block_over_two_neuron_ultraservers_fails_naming_them() -> None:
    nodes = with_neuron_labels(fleet({A: 4}), {A: "s1"})
    nodes["ip-2-3"][SERVER_4] = "s2"
    nodes["ip-2-2"][NODE_4] = "0"

    check = preflight.check_neuron_ultraserver_labels(ULTRA, nodes)

    assert check.status is preflight.Status.FAIL
    assert check.detail == (
        f"{A} spans {SERVER_4} s1, s2; {A} has {NODE_4} 0 on more than one node"
    )
    assert "describe-instance-topology" in check.fix


def test_no_nodes_warns() -> None:
    (check,) = preflight.check_nodes(ULTRA, {})
    assert check.status is preflight.Status.WARN
    assert "no trn node of trn-dev has joined" in check.detail


# --- validate on one or two UltraServers --------------------------------------------------


def test_validate_inside_one_ultraserver_runs_on_its_servers() -> None:
    job = validation.render(ULTRA, now=NOW, ultraserver=True)

    assert job["spec"]["trainer"]["numNodes"] == 4
    (patch,) = job["spec"]["runtimePatches"]
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    affinity = pod["spec"]["template"]["spec"]["affinity"]
    assert affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "topologyKey"
    ] == ("trn-platform/ultraserver-id")


def test_validate_across_two_ultraservers_runs_on_both() -> None:
    job = validation.render(ULTRA, now=NOW, across_ultraservers=True)

    assert job["spec"]["trainer"]["numNodes"] == 8
    (patch,) = job["spec"]["runtimePatches"]
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    affinity = pod["spec"]["template"]["spec"]["affinity"]
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "trn-platform/ultraserver-id", "operator": "In", "values": [A, B]}
    ]
    assert "podAffinity" not in affinity


@pytest.mark.parametrize(
    ("outputs", "kwargs", "message"),
    [
        (
            replace(ULTRA, ultraserver_ids=A, trn_nodes=4),
            {"across_ultraservers": True},
            rf"--across-ultraservers needs two UltraServers; trn-dev has 1 \({A}\)",
        ),
        (
            sample_outputs(),
            {"across_ultraservers": True},
            r"--ultraserver: trn-dev has no UltraServer capacity",
        ),
        (
            ULTRA,
            {"ultraserver": True, "across_ultraservers": True},
            r"--ultraserver and --across-ultraservers exclude each other",
        ),
    ],
)
def test_validate_placements_the_environment_cannot_make_are_refused(
    outputs: Any, kwargs: dict[str, bool], message: str
) -> None:
    with pytest.raises(TrnctlError, match=message):
        validation.render(outputs, now=NOW, **kwargs)


# --- end to end: preflight --env reads the nodes, validate prints the UltraServers ---------


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, moto: None) -> Iterator[FakeKube]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=ULTRA.to_json(), Type="String"
    )
    boto3.client("eks").create_cluster(
        name=ULTRA.cluster_name,
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": ["subnet-0123"]},
    )
    real = kube.describe
    for state in serve():

        def describe(eks: Any, name: str, state: FakeKube = state) -> kube.ClusterEndpoint:
            return replace(real(eks, name), url=state.url, ca_data=None)

        monkeypatch.setattr(kube, "describe", describe)
        yield state


def test_preflight_env_reads_the_node_labels(fake: FakeKube, trnctl: Any, aws: Any) -> None:
    fake.nodes = {**fleet({A: 4, B: 2}), "ip-system": {"trn-platform/node-type": "system"}}
    aws(quota=1536, instance_type="trn2u.48xlarge")

    run = trnctl(
        "preflight", "--az", "us-east-2a", "--instance-type", "trn2u.48xlarge", "--count", "4",
        "--env", "trn-dev",
    )  # fmt: skip

    (listed,) = [r for r in fake.requests if r.path == "/api/v1/nodes"]
    assert listed.query["labelSelector"] == ["trn-platform/node-type=trainium"]
    assert "trn-platform/devices=plugin on all 6 nodes" in run.stdout
    assert f"{A}: 4/4 nodes; {B}: 2/4 nodes" in run.stdout
    assert f"not yet full: {B}" in run.stdout


def test_preflight_env_warns_when_the_cluster_cannot_be_read(
    moto: None, trnctl: Any, aws: Any
) -> None:
    boto3.client("ssm").put_parameter(
        Name="/trn-platform/trn-dev/outputs", Value=ULTRA.to_json(), Type="String"
    )
    aws(quota=1536, instance_type="trn2u.48xlarge")

    run = trnctl(
        "preflight", "--az", "us-east-2a", "--instance-type", "trn2u.48xlarge", "--count", "4",
        "--env", "trn-dev",
    )  # fmt: skip

    assert "could not read the nodes of trn-dev: EKS cluster 'trn-dev' not found" in run.stdout


def test_validate_across_dry_run(fake: FakeKube, trnctl: Any) -> None:
    run = trnctl("validate", "--env", "trn-dev", "--across-ultraservers", "--dry-run")

    assert run.exit_code == 0, run.stderr
    job = yaml.safe_load(run.stdout)
    assert job["spec"]["trainer"]["numNodes"] == 8
    assert fake.requests == []


def test_validate_prints_the_ultraservers_before_submitting(fake: FakeKube, trnctl: Any) -> None:
    fake.nodes = fleet({A: 4, B: 4})
    fake.errors["create"] = (403, "forbidden")  # stop after the listing: no job runs here

    run = trnctl("validate", "--env", "trn-dev", "--ultraserver", "--name", "v-1")

    assert f"UltraServers (PASS): u-trn2x64 x 2: {A}: 4/4 nodes; {B}: 4/4 nodes" in run.stderr
    (created,) = [r for r in fake.requests if r.method == "POST"]
    assert created.body["spec"]["trainer"]["numNodes"] == 4
