"""Value keys of the pinned Helm charts, as each chart version's own values file has them.

The cluster's chart values (``constructs_lib.cluster``) are checked against these lists in the
tests (test_conformance_charts.py), so a key that the pinned chart does not read, or reads as
another type, fails before a deploy rather than being ignored by Helm. Each list names the chart
version and the file it was read from; bump it together with the pin in
:mod:`trn_catalog.versions`. Only the tests read it, so it lives here, outside the library
wheel.

Each list also names the chart's pods (:class:`ChartPod`): where their ``resources`` value is,
what turns them on, and what the chart requests for them by default, so that a test finds any
pod the platform starts without CPU and memory requests.

Kinds: ``MAP`` a map of chart keys; ``FREE`` a map whose contents are free (Kubernetes objects
such as ``affinity`` or ``resources``, labels, selectors); ``LIST`` a list, which Helm replaces
whole; ``STRING``, ``BOOL``, ``NUMBER`` scalars; ``ANY`` a key whose default is null.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAP, FREE, LIST, STRING, BOOL, NUMBER, ANY = (
    "map",
    "free",
    "list",
    "string",
    "bool",
    "number",
    "any",
)
_TYPES: dict[str, tuple[type, ...]] = {
    MAP: (dict,),
    FREE: (dict,),
    LIST: (list, tuple),
    STRING: (str,),
    BOOL: (bool,),
    NUMBER: (int, float),
}


REQUESTED = ("cpu", "memory")


@dataclass(frozen=True)
class ChartPod:
    """One workload a chart starts: the dotted path of its ``resources`` value, the switches
    that must all be on for it to run with each one's default, and what its chart requests for
    it by default (of :data:`REQUESTED`)."""

    resources: str
    switches: tuple[tuple[str, bool], ...] = ()
    default_requests: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChartValues:
    """The value keys of one chart version: dotted path -> kind; and its pods (``pods``)."""

    chart: str
    version: str
    source: str
    keys: Mapping[str, str]
    pods: tuple[ChartPod, ...] = ()

    def problems(self, values: Mapping[str, Any]) -> list[str]:
        """Keys of ``values`` this chart version does not have, or has as another kind, as
        ``path: reason`` lines (empty when every key is the chart's own)."""
        return _problems(self, values, "")

    def unrequested(self, values: Mapping[str, Any]) -> list[str]:
        """The pods that ``values`` turns on and that would run without a CPU or memory request
        (neither the chart's default nor ``values`` gives one; Helm merges the two maps), as
        ``path: no ... request`` lines."""
        found = []
        for pod in self.pods:
            if not all(_at(values, path, default) for path, default in pod.switches):
                continue
            given = _at(values, pod.resources, {}).get("requests", {})
            missing = [r for r in REQUESTED if r not in given and r not in pod.default_requests]
            if missing:
                found.append(f"{pod.resources}: no {' or '.join(missing)} request")
        return found


def _at(values: Mapping[str, Any], path: str, default: Any) -> Any:
    node: Any = values
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _problems(chart: ChartValues, values: Mapping[str, Any], prefix: str) -> list[str]:
    found: list[str] = []
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        kind = chart.keys.get(path)
        if kind is None:
            found.append(f"{path}: not a value of {chart.chart} {chart.version}")
        elif kind != ANY and not (
            isinstance(value, _TYPES[kind]) and not (kind == NUMBER and isinstance(value, bool))
        ):
            found.append(f"{path}: {kind} in {chart.chart} {chart.version}, given {value!r}")
        elif kind == MAP:
            found += _problems(chart, value, path)
    return found


# aws-neuron/neuron-helm-charts at commit b77a6f90 (Chart.yaml version 1.9.0).
NEURON = ChartValues(
    chart="neuron-helm-chart",
    version="1.9.0",
    source=(
        "aws-neuron/neuron-helm-charts@b77a6f90bb00dc0ee57d21e35e275b05e26b79c1 "
        "charts/neuron-helm-chart/values.yaml"
    ),
    keys={
        "neuronInstances": LIST,
        "draDriver": MAP,
        "draDriver.enabled": BOOL,
        "draDriver.nameOverride": STRING,
        "draDriver.namespaceOverride": STRING,
        "draDriver.fullnameOverride": STRING,
        "draDriver.selectorLabelsOverride": FREE,
        "draDriver.priorityClassName": ANY,
        "draDriver.runtimeClassName": ANY,
        "draDriver.imagePullSecrets": LIST,
        "draDriver.image": MAP,
        "draDriver.image.repository": STRING,
        "draDriver.image.pullPolicy": STRING,
        "draDriver.image.tag": STRING,
        "draDriver.podSecurityContext": FREE,
        "draDriver.serviceAccount": MAP,
        "draDriver.serviceAccount.create": BOOL,
        "draDriver.serviceAccount.annotations": FREE,
        "draDriver.serviceAccount.name": STRING,
        "draDriver.updateStrategy": FREE,
        "draDriver.podAnnotations": FREE,
        "draDriver.securityContext": FREE,
        "draDriver.resources": FREE,
        "draDriver.nodeSelector": FREE,
        "draDriver.tolerations": LIST,
        "draDriver.env": LIST,
        "draDriver.affinity": FREE,
        "draDriver.volumeMounts": LIST,
        "draDriver.volumes": LIST,
        "draDriver.livenessProbe": FREE,
        "devicePlugin": MAP,
        "devicePlugin.enabled": BOOL,
        "devicePlugin.nameOverride": STRING,
        "devicePlugin.namespaceOverride": STRING,
        "devicePlugin.fullnameOverride": STRING,
        "devicePlugin.selectorLabelsOverride": FREE,
        "devicePlugin.priorityClassName": STRING,
        "devicePlugin.runtimeClassName": ANY,
        "devicePlugin.imagePullSecrets": LIST,
        "devicePlugin.image": MAP,
        "devicePlugin.image.repository": STRING,
        "devicePlugin.image.pullPolicy": STRING,
        "devicePlugin.image.tag": STRING,
        "devicePlugin.podSecurityContext": FREE,
        "devicePlugin.serviceAccount": MAP,
        "devicePlugin.serviceAccount.create": BOOL,
        "devicePlugin.serviceAccount.annotations": FREE,
        "devicePlugin.serviceAccount.name": STRING,
        "devicePlugin.updateStrategy": FREE,
        "devicePlugin.podAnnotations": FREE,
        "devicePlugin.securityContext": FREE,
        "devicePlugin.resources": FREE,
        "devicePlugin.nodeSelector": FREE,
        "devicePlugin.tolerations": LIST,
        "devicePlugin.env": LIST,
        "devicePlugin.affinity": FREE,
        "devicePlugin.volumeMounts": LIST,
        "devicePlugin.volumes": LIST,
        "scheduler": MAP,
        "scheduler.enabled": BOOL,
        "scheduler.image": MAP,
        "scheduler.image.repository": STRING,
        "scheduler.image.pullPolicy": STRING,
        "scheduler.image.tag": STRING,
        "scheduler.imagePullSecrets": LIST,
        "scheduler.nameOverride": STRING,
        "scheduler.namespaceOverride": STRING,
        "scheduler.fullnameOverride": STRING,
        "scheduler.replicaCount": NUMBER,
        "scheduler.strategy": FREE,
        "scheduler.priorityClassName": STRING,
        "scheduler.serviceAccount": MAP,
        "scheduler.serviceAccount.create": BOOL,
        "scheduler.serviceAccount.annotations": FREE,
        "scheduler.serviceAccount.name": STRING,
        "scheduler.podAnnotations": FREE,
        "scheduler.podSecurityContext": FREE,
        "scheduler.securityContext": FREE,
        "scheduler.nodeSelector": FREE,
        "scheduler.tolerations": LIST,
        "scheduler.affinity": FREE,
        "scheduler.env": LIST,
        "scheduler.resources": FREE,
        "scheduler.customScheduler": MAP,
        "scheduler.customScheduler.enabled": BOOL,
        "scheduler.customScheduler.nameOverride": STRING,
        "scheduler.customScheduler.namespaceOverride": STRING,
        "scheduler.customScheduler.fullnameOverride": STRING,
        "scheduler.customScheduler.extraArgs": LIST,
        "scheduler.customScheduler.image": MAP,
        "scheduler.customScheduler.image.repository": STRING,
        "scheduler.customScheduler.image.pullPolicy": STRING,
        "scheduler.customScheduler.image.tag": STRING,
        "scheduler.customScheduler.replicaCount": NUMBER,
        "scheduler.customScheduler.serviceAccount": MAP,
        "scheduler.customScheduler.serviceAccount.create": BOOL,
        "scheduler.customScheduler.serviceAccount.annotations": FREE,
        "scheduler.customScheduler.serviceAccount.name": STRING,
        "scheduler.customScheduler.livenessProbe": FREE,
        "scheduler.customScheduler.readinessProbe": FREE,
        "scheduler.customScheduler.resources": FREE,
        "scheduler.customScheduler.securityContext": FREE,
        "scheduler.customScheduler.nodeSelector": FREE,
        "scheduler.customScheduler.tolerations": LIST,
        "scheduler.customScheduler.affinity": FREE,
        "scheduler.defaultScheduler": MAP,
        "scheduler.defaultScheduler.enabled": BOOL,
        "scheduler.defaultScheduler.nodeSelector": FREE,
        "scheduler.defaultScheduler.tolerations": LIST,
        "ultraserverOperator": MAP,
        "ultraserverOperator.enabled": BOOL,
        "ultraserverOperator.nameOverride": STRING,
        "ultraserverOperator.namespaceOverride": STRING,
        "ultraserverOperator.fullnameOverride": STRING,
        "ultraserverOperator.imagePullSecrets": LIST,
        "ultraserverOperator.image": MAP,
        "ultraserverOperator.image.repository": STRING,
        "ultraserverOperator.image.pullPolicy": STRING,
        "ultraserverOperator.image.tag": STRING,
        "ultraserverOperator.serviceAccount": MAP,
        "ultraserverOperator.serviceAccount.create": BOOL,
        "ultraserverOperator.serviceAccount.annotations": FREE,
        "ultraserverOperator.serviceAccount.name": STRING,
        "ultraserverOperator.podAnnotations": FREE,
        "ultraserverOperator.podSecurityContext": FREE,
        "ultraserverOperator.resources": FREE,
        "ultraserverOperator.nodeSelector": FREE,
        "ultraserverOperator.tolerations": LIST,
        "ultraserverOperator.affinity": FREE,
        "ultraserverOperator.leaderElect": BOOL,
        "ultraserverOperator.healthPort": NUMBER,
        "ultraserverOperator.metricsPort": NUMBER,
        "ultraserverOperator.verbosity": NUMBER,
        "npd": MAP,
        "npd.enabled": BOOL,
        "npd.updateStrategy": FREE,
        "npd.config": MAP,
        "npd.config.name": STRING,
        "npd.config.kernelMonitor": STRING,
        "npd.imagePullSecrets": LIST,
        "npd.nameOverride": STRING,
        "npd.namespaceOverride": STRING,
        "npd.fullnameOverride": STRING,
        "npd.selectorLabelsOverride": FREE,
        "npd.serviceAccount": MAP,
        "npd.serviceAccount.create": BOOL,
        "npd.serviceAccount.annotations": FREE,
        "npd.serviceAccount.name": STRING,
        "npd.podAnnotations": FREE,
        "npd.podSecurityContext": FREE,
        "npd.priorityClassName": STRING,
        "npd.runtimeClassName": STRING,
        "npd.nodeSelector": FREE,
        "npd.tolerations": LIST,
        "npd.nodeProblemDetector": MAP,
        "npd.nodeProblemDetector.image": MAP,
        "npd.nodeProblemDetector.image.repository": STRING,
        "npd.nodeProblemDetector.image.pullPolicy": STRING,
        "npd.nodeProblemDetector.image.tag": STRING,
        "npd.nodeProblemDetector.image.command": LIST,
        "npd.nodeProblemDetector.resources": FREE,
        "npd.nodeProblemDetector.securityContext": FREE,
        "npd.nodeProblemDetector.clusterRole": MAP,
        "npd.nodeProblemDetector.clusterRole.create": BOOL,
        "npd.nodeRecovery": MAP,
        "npd.nodeRecovery.enabled": BOOL,
        "npd.nodeRecovery.startupDelaySeconds": NUMBER,
        "npd.nodeRecovery.image": MAP,
        "npd.nodeRecovery.image.repository": STRING,
        "npd.nodeRecovery.image.pullPolicy": STRING,
        "npd.nodeRecovery.image.tag": STRING,
        "npd.nodeRecovery.resources": FREE,
        "npd.nodeRecovery.counters": LIST,
        "npd.nodeRecovery.extraEnvs": LIST,
    },
    pods=(
        ChartPod("devicePlugin.resources", (("devicePlugin.enabled", True),)),
        ChartPod("scheduler.resources", (("scheduler.enabled", False),)),
        ChartPod(
            "scheduler.customScheduler.resources",
            (("scheduler.enabled", False), ("scheduler.customScheduler.enabled", True)),
            ("cpu",),
        ),
        ChartPod("draDriver.resources", (("draDriver.enabled", False),), REQUESTED),
        ChartPod("npd.nodeProblemDetector.resources", (("npd.enabled", True),), REQUESTED),
        ChartPod(
            "npd.nodeRecovery.resources",
            (("npd.enabled", True), ("npd.nodeRecovery.enabled", False)),
            REQUESTED,
        ),
        ChartPod(
            "ultraserverOperator.resources", (("ultraserverOperator.enabled", False),), REQUESTED
        ),
    ),
)

# aws/eks-charts at commit bfe91c4b (Chart.yaml version v0.5.30, image v0.5.20).
EFA = ChartValues(
    chart="aws-efa-k8s-device-plugin",
    version="v0.5.30",
    source=(
        "aws/eks-charts@bfe91c4b9257c80f754ad4b3d6a9a3c239b2b8ec "
        "stable/aws-efa-k8s-device-plugin/values.yaml"
    ),
    keys={
        "image": MAP,
        "image.repository": STRING,
        "image.tag": STRING,
        "securityContext": FREE,
        "supportedInstanceLabels": MAP,
        "supportedInstanceLabels.keys": LIST,
        "supportedInstanceLabels.values": LIST,
        "resources": FREE,
        "nodeSelector": FREE,
        "updateStrategy": FREE,
        "tolerations": LIST,
        "additionalPodAnnotations": FREE,
        "additionalPodLabels": FREE,
        "nameOverride": STRING,
        "fullnameOverride": STRING,
        "imagePullSecrets": LIST,
    },
    pods=(ChartPod("resources", (), REQUESTED),),
)

# The amazon-cloudwatch-observability chart at 5.3.1, the EKS add-on v5.3.1's: only the keys the
# add-on's configuration here sets (the add-on's own schema, eks:DescribeAddonConfiguration, is
# checked by `trnctl addons` before a deploy).
CLOUDWATCH_OBSERVABILITY = ChartValues(
    chart="amazon-cloudwatch-observability",
    version="v5.3.1-eksbuild.1",
    source=(
        "aws-observability/helm-charts@132c642a6e33a54c77c881256500f85b63e1035a "
        "charts/amazon-cloudwatch-observability/values.yaml"
    ),
    keys={
        "agent": MAP,
        "agent.config": ANY,
        "neuronMonitor": MAP,
        "neuronMonitor.affinity": FREE,
    },
)

# kubeflow/trainer at tag v2.3.0. `jobset` and `lws` are subcharts: only the keys this
# chart's own values file sets for them are listed.
TRAINER = ChartValues(
    chart="kubeflow-trainer",
    version="2.3.0",
    source="kubeflow/trainer@v2.3.0 charts/kubeflow-trainer/values.yaml",
    keys={
        "nameOverride": STRING,
        "fullnameOverride": STRING,
        "crds": MAP,
        "crds.enabled": BOOL,
        "jobset": MAP,
        "jobset.install": BOOL,
        "jobset.fullnameOverride": STRING,
        "commonLabels": FREE,
        "image": MAP,
        "image.registry": STRING,
        "image.repository": STRING,
        "image.tag": STRING,
        "image.pullPolicy": STRING,
        "image.pullSecrets": LIST,
        "manager": MAP,
        "manager.replicas": NUMBER,
        "manager.selectorLabels": FREE,
        "manager.podAnnotations": FREE,
        "manager.labels": FREE,
        "manager.volumes": LIST,
        "manager.nodeSelector": FREE,
        "manager.affinity": FREE,
        "manager.tolerations": LIST,
        "manager.env": LIST,
        "manager.envFrom": LIST,
        "manager.volumeMounts": LIST,
        "manager.resources": FREE,
        "manager.securityContext": FREE,
        "manager.config": MAP,
        "manager.config.health": MAP,
        "manager.config.health.healthProbeBindAddress": STRING,
        "manager.config.health.readinessEndpointName": STRING,
        "manager.config.health.livenessEndpointName": STRING,
        "manager.config.metrics": MAP,
        "manager.config.metrics.bindAddress": STRING,
        "manager.config.metrics.secureServing": BOOL,
        "manager.config.webhook": MAP,
        "manager.config.webhook.port": NUMBER,
        "manager.config.webhook.host": STRING,
        "manager.config.leaderElection": MAP,
        "manager.config.leaderElection.leaderElect": BOOL,
        "manager.config.leaderElection.resourceName": STRING,
        "manager.config.leaderElection.resourceNamespace": STRING,
        "manager.config.leaderElection.leaseDuration": STRING,
        "manager.config.leaderElection.renewDeadline": STRING,
        "manager.config.leaderElection.retryPeriod": STRING,
        "manager.config.controller": MAP,
        "manager.config.controller.groupKindConcurrency": MAP,
        "manager.config.controller.groupKindConcurrency.trainJob": NUMBER,
        "manager.config.controller.groupKindConcurrency.trainingRuntime": NUMBER,
        "manager.config.controller.groupKindConcurrency.clusterTrainingRuntime": NUMBER,
        "manager.config.certManagement": MAP,
        "manager.config.certManagement.enable": BOOL,
        "manager.config.certManagement.webhookServiceName": STRING,
        "manager.config.certManagement.webhookSecretName": STRING,
        "manager.config.clientConnection": MAP,
        "manager.config.clientConnection.qps": NUMBER,
        "manager.config.clientConnection.burst": NUMBER,
        "manager.config.statusServer": MAP,
        "manager.config.statusServer.port": NUMBER,
        "manager.config.statusServer.qps": NUMBER,
        "manager.config.statusServer.burst": NUMBER,
        "manager.config.featureGates": FREE,
        "webhook": MAP,
        "webhook.failurePolicy": STRING,
        "dataCache": MAP,
        "dataCache.enabled": BOOL,
        "dataCache.lws": MAP,
        "dataCache.lws.install": BOOL,
        "dataCache.lws.fullnameOverride": STRING,
        "dataCache.cacheImage": MAP,
        "dataCache.cacheImage.registry": STRING,
        "dataCache.cacheImage.repository": STRING,
        "dataCache.cacheImage.tag": STRING,
        "dataCache.runtimes": MAP,
        "dataCache.runtimes.torchDistributedWithCache": MAP,
        "dataCache.runtimes.torchDistributedWithCache.enabled": BOOL,
        "runtimes": MAP,
        "runtimes.defaultEnabled": BOOL,
        "runtimes.commonLabels": FREE,
        "runtimes.installer": MAP,
        "runtimes.installer.image": MAP,
        "runtimes.installer.image.registry": STRING,
        "runtimes.installer.image.repository": STRING,
        "runtimes.installer.image.tag": STRING,
        "runtimes.installer.imagePullSecrets": LIST,
        "runtimes.installer.resources": FREE,
        "runtimes.installer.nodeSelector": FREE,
        "runtimes.installer.affinity": FREE,
        "runtimes.installer.tolerations": LIST,
        "runtimes.torchDistributed": MAP,
        "runtimes.torchDistributed.enabled": BOOL,
        "runtimes.deepspeedDistributed": MAP,
        "runtimes.deepspeedDistributed.enabled": BOOL,
        "runtimes.deepspeedDistributed.image": MAP,
        "runtimes.deepspeedDistributed.image.registry": STRING,
        "runtimes.deepspeedDistributed.image.repository": STRING,
        "runtimes.deepspeedDistributed.image.tag": STRING,
        "runtimes.mlxDistributed": MAP,
        "runtimes.mlxDistributed.enabled": BOOL,
        "runtimes.mlxDistributed.image": MAP,
        "runtimes.mlxDistributed.image.registry": STRING,
        "runtimes.mlxDistributed.image.repository": STRING,
        "runtimes.mlxDistributed.image.tag": STRING,
        "runtimes.jaxDistributed": MAP,
        "runtimes.jaxDistributed.enabled": BOOL,
        "runtimes.xgboostDistributed": MAP,
        "runtimes.xgboostDistributed.enabled": BOOL,
        "runtimes.xgboostDistributed.image": MAP,
        "runtimes.xgboostDistributed.image.registry": STRING,
        "runtimes.xgboostDistributed.image.repository": STRING,
        "runtimes.xgboostDistributed.image.tag": STRING,
        "runtimes.torchtuneDistributed": MAP,
        "runtimes.torchtuneDistributed.image": MAP,
        "runtimes.torchtuneDistributed.image.registry": STRING,
        "runtimes.torchtuneDistributed.image.repository": STRING,
        "runtimes.torchtuneDistributed.image.tag": STRING,
        "runtimes.torchtuneDistributed.llama3_2_1B": MAP,
        "runtimes.torchtuneDistributed.llama3_2_1B.enabled": BOOL,
        "runtimes.torchtuneDistributed.llama3_2_3B": MAP,
        "runtimes.torchtuneDistributed.llama3_2_3B.enabled": BOOL,
        "runtimes.torchtuneDistributed.qwen2_5_1_5B": MAP,
        "runtimes.torchtuneDistributed.qwen2_5_1_5B.enabled": BOOL,
    },
    # The manager; JobSet's controller (subchart jobset 0.12.0, charts/jobset/values.yaml:
    # controller.resources requests 500m and 128Mi). The runtime installer and cleanup Jobs
    # render only with a built-in runtime on (templates/runtimes/_runtimes.tpl), LeaderWorkerSet
    # only with the data cache.
    pods=(
        ChartPod("manager.resources"),
        ChartPod("jobset.controller.resources", (("jobset.install", True),), REQUESTED),
    ),
)

# NVIDIA/k8s-device-plugin at tag v0.20.0. `nfd` is a subchart (node-feature-discovery, off
# unless gfd is on): only the keys this chart's own values file sets for it are listed.
NVIDIA_DEVICE_PLUGIN = ChartValues(
    chart="nvidia-device-plugin",
    version="0.20.0",
    source="NVIDIA/k8s-device-plugin@v0.20.0 deployments/helm/nvidia-device-plugin/values.yaml",
    keys={
        "config": MAP,
        "config.name": STRING,
        "config.map": FREE,
        "config.default": STRING,
        "config.fallbackStrategies": LIST,
        "compatWithCPUManager": ANY,
        "migStrategy": ANY,
        "failOnInitError": ANY,
        "deviceListStrategy": ANY,
        "deviceIDStrategy": ANY,
        "nvidiaDriverRoot": ANY,
        "gdrcopyEnabled": ANY,
        "gdsEnabled": ANY,
        "mofedEnabled": ANY,
        "deviceDiscoveryStrategy": ANY,
        "nameOverride": STRING,
        "fullnameOverride": STRING,
        "namespaceOverride": STRING,
        "selectorLabelsOverride": FREE,
        "allowDefaultNamespace": BOOL,
        "imagePullSecrets": LIST,
        "image": MAP,
        "image.repository": STRING,
        "image.pullPolicy": STRING,
        "image.tag": STRING,
        "updateStrategy": FREE,
        "podAnnotations": FREE,
        "podSecurityContext": FREE,
        "securityContext": FREE,
        "resources": FREE,
        "nodeSelector": FREE,
        "affinity": FREE,
        "tolerations": LIST,
        "priorityClassName": STRING,
        "runtimeClassName": ANY,
        "devicePlugin": MAP,
        "devicePlugin.enabled": BOOL,
        "gfd": MAP,
        "gfd.enabled": BOOL,
        "gfd.nameOverride": STRING,
        "gfd.namespaceOverride": STRING,
        "gfd.noTimestamp": ANY,
        "gfd.sleepInterval": ANY,
        "gfd.securityContext": FREE,
        "nfd": MAP,
        "nfd.nameOverride": STRING,
        "nfd.master": FREE,
        "nfd.worker": FREE,
        "mps": MAP,
        "mps.root": STRING,
        "mps.enableHostPID": BOOL,
        "cdi": MAP,
        "cdi.nvidiaHookPath": ANY,
        "cdi.featureFlags": ANY,
    },
    # The device plugin and its MPS control daemon (only on nodes labelled mps.capable) both
    # take `resources` (templates/daemonset-*.yml); gpu-feature-discovery is off.
    pods=(ChartPod("resources", (("devicePlugin.enabled", True),)),),
)

# aws/eks-charts at commit c043cef4 (Chart.yaml version 1.0.0, appVersion v1.2.0-eksbuild.2),
# the only commit of the chart. The DaemonSet's node affinity is built from
# supportedInstanceLabels; it always tolerates CriticalAddonsOnly and adds `tolerations`.
DRANET = ChartValues(
    chart="aws-dranet",
    version="1.0.0",
    source=(
        "aws/eks-charts@c043cef46c7e50a71094e50b43b8225322a750ff stable/aws-dranet/values.yaml"
    ),
    keys={
        "image": MAP,
        "image.repository": STRING,
        "image.tag": STRING,
        "image.pullPolicy": STRING,
        "securityContext": FREE,
        "resources": FREE,
        "serviceAccount": MAP,
        "serviceAccount.create": BOOL,
        "serviceAccount.name": STRING,
        "tolerations": LIST,
        "supportedInstanceLabels": MAP,
        "supportedInstanceLabels.keys": LIST,
        "supportedInstanceLabels.values": LIST,
        "nodeSelector": FREE,
        "podAnnotations": FREE,
        "podLabels": FREE,
        "nameOverride": STRING,
        "fullnameOverride": STRING,
        "imagePullSecrets": LIST,
        "updateStrategy": FREE,
        "priorityClassName": STRING,
        "deviceClass": MAP,
        "deviceClass.create": BOOL,
        "deviceClass.name": STRING,
        "healthPort": NUMBER,
        "verbosity": NUMBER,
        "filter": STRING,
    },
    pods=(ChartPod("resources", (), REQUESTED),),
)

# By chart name, as ChartPin.chart names them.
CHARTS: Mapping[str, ChartValues] = {
    c.chart: c for c in (NEURON, EFA, TRAINER, NVIDIA_DEVICE_PLUGIN, DRANET)
}
