"""`--ultraserver`: every pod of a job inside one UltraServer.

On the device-plugin path a TrainJob (Kubeflow Trainer v2.3.0) patches its runtime's pod
template through ``spec.runtimePatches``, whose pod level takes ``affinity``: the job's pods
require each other on nodes of one ``trn-platform/ultraserver-id`` (the id of the UltraServer
Capacity Block the node group launched into), and refuse nodes of an UltraServer where pods of
another job run. The first pod may land on any UltraServer with room: Kubernetes lets a pod
whose required pod affinity matches only itself schedule anywhere.

Under DRA the Neuron chart's UltraServer operator (chart 1.9.0, operator 0.1.0, beta; its
NeuronUltraServerWorkload, neuron.aws.com/v1beta1) would place the job instead, but the operator
serves Trn3 UltraServer (Trn3pds) instance types only (aws-neuron-sdk
deploy/eks/ultraserver-operator.rst) and no Trn3 UltraServer type is confirmed
(trn_catalog.ultraservers), so ``--ultraserver`` is refused there.
"""

from __future__ import annotations

from typing import Any

from trn_catalog import ultraservers
from trn_catalog.outputs import EnvironmentOutputs
from trn_catalog.workspace import TRAINER_CONTAINER
from trnctl.errors import TrnctlError

# Who owns the job's runtime patch (runtimePatches is a list keyed by manager).
PATCH_MANAGER = "trnctl.trn-platform/ultraserver"
# JobSet labels each pod with its JobSet's name, which is the TrainJob's (JobSet v0.12.0,
# api/jobset/v1alpha2 JobSetNameKey): the pods of one job, and those of other jobs.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
# The label Kubernetes puts on every namespace, its own name (by default since 1.21, GA 1.22).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def check(outputs: EnvironmentOutputs, nodes: int, target: str) -> ultraservers.UltraServerSpec:
    """The environment's UltraServer type, when a job of ``nodes`` nodes fits in one.

    Raises:
        TrnctlError: USAGE, naming ``--ultraserver``: a GPU job, an environment without
            UltraServer blocks, devices 'dra' (see the module), or more nodes than one
            UltraServer has.
    """
    if target != "trn":
        raise TrnctlError("--ultraserver places Trainium jobs; leave it out for --target gpu")
    if not outputs.ultraserver_type:
        raise TrnctlError(
            f"--ultraserver: {outputs.environment} has no UltraServer capacity; deploy it with "
            "-c ultraserver_reservation_ids=<the reservation ids trnctl capacity buy prints>"
        )
    if outputs.devices == "dra":
        raise TrnctlError(
            f"--ultraserver: {outputs.environment} runs devices 'dra', where the Neuron "
            "UltraServer operator places UltraServer jobs; it serves Trn3 UltraServer (Trn3pds) "
            f"types only (Neuron docs) and {outputs.ultraserver_type} is not one; deploy with "
            "-c devices=plugin to place jobs by pod affinity"
        )
    spec = ultraservers.get(outputs.ultraserver_type)
    if nodes > spec.servers:
        raise TrnctlError(
            f"--ultraserver: --nodes {nodes} is more than one {spec.name} UltraServer has "
            f"({spec.servers} servers)"
        )
    return spec


def check_across(outputs: EnvironmentOutputs) -> tuple[ultraservers.UltraServerSpec, list[str]]:
    """The UltraServer type and the first two UltraServers of the environment, for a job that
    spans two (``trnctl validate --across-ultraservers``).

    Raises:
        TrnctlError: USAGE, as :func:`check`, or fewer than two UltraServers.
    """
    spec = check(outputs, 1, "trn")
    ids = outputs.ultraserver_id_list
    if len(ids) < 2:
        raise TrnctlError(
            f"--across-ultraservers needs two UltraServers; {outputs.environment} has "
            f"{len(ids)} ({', '.join(ids)})"
        )
    return spec, ids[:2]


def runtime_patch(job_name: str, namespace: str) -> dict[str, Any]:
    """The TrainJob ``runtimePatches`` entry that keeps the pods of ``job_name`` (in
    ``namespace``) in one UltraServer and other jobs' pods out of it."""
    same_server = {
        "labelSelector": {"matchLabels": {JOBSET_NAME_LABEL: job_name}},
        "topologyKey": ultraservers.ULTRASERVER_ID_LABEL,
    }
    on_ultraservers = _on_nodes({"key": ultraservers.ULTRASERVER_ID_LABEL, "operator": "Exists"})
    return _patch(
        {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": on_ultraservers},
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [same_server]},
            "podAntiAffinity": _apart_from_other_jobs(job_name, namespace),
        }
    )


def across_patch(job_name: str, namespace: str, ids: list[str]) -> dict[str, Any]:
    """The ``runtimePatches`` entry that keeps ``job_name``'s pods on the UltraServers ``ids``
    (one pod per node: a job of all their nodes fills both) and other jobs' pods off them."""
    on_these = _on_nodes(
        {"key": ultraservers.ULTRASERVER_ID_LABEL, "operator": "In", "values": list(ids)}
    )
    return _patch(
        {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": on_these},
            "podAntiAffinity": _apart_from_other_jobs(job_name, namespace),
        }
    )


def _on_nodes(expression: dict[str, Any]) -> dict[str, Any]:
    return {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}


def _apart_from_other_jobs(job_name: str, namespace: str) -> dict[str, Any]:
    """Pods of every other TrainJob off the job's UltraServer: those of its own namespace but
    itself, and those of every other namespace whatever their name (JobSet names pods after
    their TrainJob, which is unique only within a namespace). A namespace whose ResourceQuota
    has the CrossNamespacePodAffinity scope refuses the second term."""
    ours = {
        "labelSelector": {
            "matchExpressions": [
                {"key": JOBSET_NAME_LABEL, "operator": "Exists"},
                {"key": JOBSET_NAME_LABEL, "operator": "NotIn", "values": [job_name]},
            ]
        },
        "topologyKey": ultraservers.ULTRASERVER_ID_LABEL,
    }
    elsewhere = {
        "labelSelector": {"matchExpressions": [{"key": JOBSET_NAME_LABEL, "operator": "Exists"}]},
        "namespaceSelector": {
            "matchExpressions": [
                {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": [namespace]}
            ]
        },
        "topologyKey": ultraservers.ULTRASERVER_ID_LABEL,
    }
    return {"requiredDuringSchedulingIgnoredDuringExecution": [ours, elsewhere]}


def _patch(affinity: dict[str, Any]) -> dict[str, Any]:
    # The torch runtime names its trainer job as its container ("node").
    pod = {"spec": {"template": {"spec": {"affinity": affinity}}}}
    return {
        "manager": PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {"spec": {"replicatedJobs": [{"name": TRAINER_CONTAINER, "template": pod}]}}
        },
    }
