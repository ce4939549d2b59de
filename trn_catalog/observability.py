"""The metric names the platform's dashboard and alarms (constructs), ``trnctl job top`` and the
trainer share: one definition each, so that what is drawn and alarmed on is what is emitted.

Standard library only, like the rest of the catalog: the trainer inside the container imports it.

Two sources:

- the trainer's own metrics, which it sends as CloudWatch embedded metric format (EMF) documents
  to the CloudWatch agent's EMF listener (:data:`EMF_AGENT_ENDPOINT`), in :data:`NAMESPACE`
  with the dimensions :data:`DIMENSIONS` (environment and job) and, for the stall alarm,
  :data:`ENVIRONMENT_DIMENSIONS`;
- the node and pod metrics of CloudWatch Container Insights with enhanced observability, which
  the ``amazon-cloudwatch-observability`` add-on's agent publishes in
  :data:`CONTAINER_INSIGHTS_NAMESPACE`. The names and dimension sets are those the agent
  declares in aws/amazon-cloudwatch-agent v1.300066.0 (the add-on v5.3.1's agent 1.300066.0b1367),
  ``translator/translate/otel/exporter/awsemf/kubernetes.go``
  (``getAwsNeuronMetricDeclarations``, ``getEFAMetricDeclarations``, the node and cluster
  metrics), and the CloudWatch user guide's "Amazon EKS and Kubernetes Container Insights with
  enhanced observability metrics".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

# The trainer's metrics.
NAMESPACE = "TrnPlatform/Training"
ENVIRONMENT = "Environment"
JOB = "Job"
DIMENSIONS: tuple[str, ...] = (ENVIRONMENT, JOB)
# Each document also carries its figures per environment alone, so that an alarm can watch an
# environment without knowing its jobs.
ENVIRONMENT_DIMENSIONS: tuple[str, ...] = (ENVIRONMENT,)

TOKENS_PER_SECOND = "TokensPerSecond"
MFU = "MFU"
LOSS = "Loss"
STEP_TIME = "StepTimeSeconds"
STEP = "Step"
# 1 per logged interval: its sum over a period says whether any job logged a step.
LOGGED_INTERVALS = "LoggedIntervals"
EVAL_LOSS = "EvalLoss"

# Each train record's metric and its CloudWatch unit (EMF MetricDefinition "Unit").
TRAIN_METRICS: Mapping[str, str] = MappingProxyType(
    {
        TOKENS_PER_SECOND: "Count/Second",
        MFU: "Percent",
        LOSS: "None",
        STEP_TIME: "Seconds",
        STEP: "Count",
        LOGGED_INTERVALS: "Count",
    }
)
EVAL_METRICS: Mapping[str, str] = MappingProxyType({EVAL_LOSS: "None"})

# Where the trainer sends its EMF documents: the standard variable of the aws-embedded-metrics
# libraries, set by the workspace's runtimes to the agent's Service. The amazon-cloudwatch-agent
# operator (v3.3.3, internal/manifests/collector/ports.go) opens TCP and UDP 25888 on the
# Service of an agent whose configuration has logs.metrics_collected.emf, and keeps a DaemonSet
# agent's Service node-local (internalTrafficPolicy Local).
EMF_AGENT_ENDPOINT_ENV = "AWS_EMF_AGENT_ENDPOINT"
EMF_AGENT_PORT = 25888
EMF_AGENT_ENDPOINT = f"tcp://cloudwatch-agent.amazon-cloudwatch.svc.cluster.local:{EMF_AGENT_PORT}"
# What the trainer reads to name its dimensions and header: the workspace's runtimes set them,
# the job's name from its pods' JobSet label (JobSet names itself after the TrainJob).
ENVIRONMENT_ENV = "TRN_ENVIRONMENT"
JOB_ENV = "TRN_JOB"
CAPACITY_ENV = "TRN_CAPACITY"
CAPACITY_RESERVATION_ENV = "TRN_CAPACITY_RESERVATION_ID"
JOB_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
# Neuron Observer's daemon (Neuron 2.33, beta; "How to install and configure Neuron Observer on
# Amazon EKS") runs on nodes with this label, which the Neuron device plugin sets; under DRA there
# is no device plugin, so the trn node group sets it.
NEURON_PRESENT_LABEL = "neuron.amazonaws.com/present"
# The training pods' label of their environment; with JOB_NAME_LABEL, what EKS split cost
# allocation data can import as cost allocation tags (activated in Billing).
ENVIRONMENT_LABEL = "trn-platform/environment"


def training_log_group(environment: str) -> str:
    """The log group the trainer's EMF documents go to (named in each document's ``_aws``)."""
    return f"/aws/trn-platform/{environment}/training"


# Container Insights.
CONTAINER_INSIGHTS_NAMESPACE = "ContainerInsights"
CLUSTER = ("ClusterName",)
NODE = ("ClusterName", "InstanceId", "NodeName")
POD = ("ClusterName", "Namespace", "PodName")
NAMESPACE_DIMENSIONS = ("ClusterName", "Namespace")


@dataclass(frozen=True)
class AgentMetric:
    """A Container Insights metric and the dimension sets the agent publishes it under."""

    name: str
    unit: str
    dimension_sets: tuple[tuple[str, ...], ...]


def _metric(name: str, unit: str, *dimension_sets: tuple[str, ...]) -> AgentMetric:
    return AgentMetric(name, unit, dimension_sets)


CLUSTER_NODE_COUNT = _metric("cluster_node_count", "Count", CLUSTER)
CLUSTER_FAILED_NODE_COUNT = _metric("cluster_failed_node_count", "Count", CLUSTER)
NODE_READY = _metric("node_status_condition_ready", "Count", CLUSTER, NODE)
NAMESPACE_RUNNING_PODS = _metric(
    "namespace_number_of_running_pods", "Count", CLUSTER, NAMESPACE_DIMENSIONS
)
NEURONCORE_UTILIZATION = _metric(
    "node_neuroncore_utilization",
    "Percent",
    CLUSTER,
    ("ClusterName", "UltraServer"),
    NODE,
    ("ClusterName", "InstanceType", "InstanceId", "NodeName", "NeuronDevice", "NeuronCore"),
)
NEURON_DEVICE_MEMORY = _metric(
    "node_neurondevice_runtime_memory_used_bytes",
    "Bytes",
    CLUSTER,
    ("ClusterName", "UltraServer"),
    NODE,
)
NEURON_EXECUTION_ERRORS = _metric(
    "node_neuron_execution_errors_total", "Count", CLUSTER, ("ClusterName", "UltraServer"), NODE
)
NEURON_ECC_EVENTS = _metric(
    "node_neurondevice_hw_ecc_events_total",
    "Count",
    CLUSTER,
    ("ClusterName", "UltraServer"),
    NODE,
    ("ClusterName", "InstanceId", "NodeName", "NeuronDevice"),
)
POD_NEURONCORE_UTILIZATION = _metric(
    "pod_neuroncore_utilization", "Percent", CLUSTER, POD, ("ClusterName", "Namespace")
)
_EFA_NODE = (
    CLUSTER,
    NODE,
    ("ClusterName", "InstanceId", "InstanceType", "NodeName", "NetworkInterfaceId"),
)
EFA_RX_BYTES = _metric("node_efa_rx_bytes", "Bytes/Second", *_EFA_NODE)
EFA_TX_BYTES = _metric("node_efa_tx_bytes", "Bytes/Second", *_EFA_NODE)
EFA_RDMA_READ_BYTES = _metric("node_efa_rdma_read_bytes", "Bytes/Second", *_EFA_NODE)
EFA_RDMA_WRITE_BYTES = _metric("node_efa_rdma_write_bytes", "Bytes/Second", *_EFA_NODE)
EFA_RX_DROPPED = _metric("node_efa_rx_dropped", "Count/Second", *_EFA_NODE)
# EFA's error counters the agent has published since before v1.300066.0 (not yet in the user
# guide's table): retransmission timeouts, impaired and unresponsive remote connections.
EFA_RETRANS_TIMEOUTS = _metric("node_efa_retrans_timeout_events", "Count", *_EFA_NODE)
EFA_IMPAIRED_REMOTE = _metric("node_efa_impaired_remote_conn_events", "Count", *_EFA_NODE)
EFA_UNRESPONSIVE_REMOTE = _metric("node_efa_unresponsive_remote_events", "Count", *_EFA_NODE)
EFA_ERRORS: tuple[AgentMetric, ...] = (
    EFA_RX_DROPPED,
    EFA_RETRANS_TIMEOUTS,
    EFA_IMPAIRED_REMOTE,
    EFA_UNRESPONSIVE_REMOTE,
)
AGENT_METRICS: tuple[AgentMetric, ...] = (
    CLUSTER_NODE_COUNT,
    CLUSTER_FAILED_NODE_COUNT,
    NODE_READY,
    NAMESPACE_RUNNING_PODS,
    NEURONCORE_UTILIZATION,
    NEURON_DEVICE_MEMORY,
    NEURON_EXECUTION_ERRORS,
    NEURON_ECC_EVENTS,
    POD_NEURONCORE_UTILIZATION,
    EFA_RX_BYTES,
    EFA_TX_BYTES,
    EFA_RDMA_READ_BYTES,
    EFA_RDMA_WRITE_BYTES,
    *EFA_ERRORS,
)

# What Container Insights can publish only for nodes whose devices a device plugin hands out; on a
# DRA node (``-c devices=dra``) these stay empty:
# - per-pod Neuron metrics: the agent ties a NeuronCore to a pod through the kubelet's
#   device-plugin allocations and, finding none, publishes the node's metric alone ("A metric is
#   duplicated for pod and container only if pod correlation has been done successfully",
#   aws/amazon-cloudwatch-agent v1.300066.0,
#   plugins/processors/gpuattributes/internal/awsneuron_metric_modifier.go, duplicateMetrics);
#   the node-level Neuron metrics above are published either way;
# - every EFA metric: the user guide's enhanced observability page lists the EFA device plugin as
#   their prerequisite, and under DRA the trn nodes' EFA interfaces come from aws-dranet.
DEVICE_PLUGIN_ONLY: tuple[AgentMetric, ...] = (
    POD_NEURONCORE_UTILIZATION,
    EFA_RX_BYTES,
    EFA_TX_BYTES,
    EFA_RDMA_READ_BYTES,
    EFA_RDMA_WRITE_BYTES,
    *EFA_ERRORS,
)

# FSx for Lustre (the FSx user guide's Lustre metrics, namespace AWS/FSx, per FileSystemId).
FSX_NAMESPACE = "AWS/FSx"
FSX_READ_BYTES = "DataReadBytes"
FSX_WRITE_BYTES = "DataWriteBytes"
