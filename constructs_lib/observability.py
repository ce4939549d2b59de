"""TrainingObservability: one environment's dashboard, alarms, alert topic and monthly budget."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy, Stack, Token
from aws_cdk import aws_budgets as budgets
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_logs as logs
from constructs import Construct

from constructs_lib._alerts import BUDGETS, CLOUDWATCH, alert_topic, monthly_budget
from constructs_lib._common import log_group_key, retention
from constructs_lib._props import props_of
from trn_catalog import devices as device_modes
from trn_catalog import formats
from trn_catalog import observability as obs
from trn_catalog.outputs import PREVIEW_REGIONS, TAG_ENVIRONMENT

PERIOD = Duration.minutes(1)
WIDE, HALF, THIRD = 24, 12, 8
# Beside a widget or alarm whose metrics a DRA node does not get (obs.DEVICE_PLUGIN_ONLY).
DRA_NOTE = "device-plugin nodes only: none from DRA trn nodes"


@dataclass(frozen=True)
class NodeGroupSummary:
    """One node group as the dashboard's header names it."""

    role: str
    instance_type: str
    nodes: int
    capacity: str


@dataclass(frozen=True)
class TrainingObservabilityProps:
    """What a :class:`TrainingObservability` was built with (its ``props``): the keyword
    arguments of its constructor, where each is documented with its default."""

    environment: str
    cluster_name: str
    namespace: str
    file_system_id: str | None
    node_groups: Sequence[NodeGroupSummary]
    stalled_minutes: int
    alert_email: str | None
    budget_usd: int | None
    log_retention_days: int
    removal_policy: RemovalPolicy
    devices: device_modes.DeviceMode


class TrainingObservability(Construct):
    """What an environment's operators watch, in CloudWatch.

    Default settings: a dashboard named after the environment with the nodes (count, failed,
    readiness per node), NeuronCore utilization and device memory per node, EFA traffic per node
    and EFA errors, FSx throughput, and per job tokens/s, loss and MFU (the trainer's metrics,
    :mod:`trn_catalog.observability`); three alarms, to a KMS-encrypted SNS topic: Neuron
    hardware (ECC) errors on any node, EFA errors on any node, and a stall (training pods run
    but no job logged a step for ``stalled_minutes``); the log group the trainer's EMF
    documents land in, encrypted and with retention; and, with ``budget_usd``, a monthly budget.

    Container Insights has no node count per instance type: the header lists the node groups and
    their types; readiness is per node.

    Attributes:
        dashboard, topic, alert_key, alarms (name -> cw.Alarm), log_group, budget (None
        without ``budget_usd``).

    Raises:
        ValueError: an ``environment`` or ``cluster_name`` that is empty or a token,
            ``stalled_minutes`` outside 5..1440, a malformed ``alert_email``, a ``budget_usd``
            below 1, a ``budget_usd`` in a region whose CloudFormation has no
            AWS::Budgets::Budget, a log retention CloudWatch does not offer, or ``devices``
            neither ``plugin`` nor ``dra``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        environment: str,
        cluster_name: str,
        namespace: str = "training",
        file_system_id: str | None = None,
        node_groups: Sequence[NodeGroupSummary] = (),
        stalled_minutes: int = 30,
        alert_email: str | None = None,
        budget_usd: int | None = None,
        log_retention_days: int = 30,
        removal_policy: RemovalPolicy = RemovalPolicy.DESTROY,
        devices: device_modes.DeviceMode = "plugin",
    ) -> None:
        """The props, each with its default (a missing required one: TypeError).

        Args:
            environment: the environment's name, e.g. ``trn-dev`` (required): the trainer's metric
                dimension, the dashboard's name and the budget's tag value.
            cluster_name: the EKS cluster's name as Container Insights reports it (required; a plain
                string, not a token: Metrics Insights queries are text).
            namespace: the jobs' namespace. Default ``training``.
            file_system_id: the FSx for Lustre file system whose throughput is drawn. Default none.
            node_groups: the node groups the dashboard's header lists. Default none.
            stalled_minutes: a training pod runs and no job logged a step for this many minutes: the
                stall alarm fires. 5 to 1440. Default 30.
            alert_email: an address subscribed to the alert topic. Default none.
            budget_usd: the environment's monthly cost budget on the tag
                ``trn-platform:environment`` (activate it as a cost allocation tag in Billing),
                alerting the topic at 50, 80 and 100 percent. Default None: no budget (a preview has
                its own, :class:`PreviewLifecycle`).
            log_retention_days: of the trainer's EMF log group. Default 30.
            removal_policy: of that log group and its key. Default DESTROY (the metrics are kept by
                CloudWatch; the log group holds their raw documents).
            devices: how the trn nodes get their devices, ``plugin`` or ``dra``. Under ``dra`` the
                widgets and the alarm whose metrics need a device plugin
                (:data:`trn_catalog.observability.DEVICE_PLUGIN_ONLY`: EFA's) say that DRA trn nodes
                report none. Default ``plugin``.
        """
        super().__init__(scope, construct_id)
        props = props_of(TrainingObservabilityProps, locals())
        _validate(props, Stack.of(self).region)
        self.props = props
        self.topic, self.alert_key = alert_topic(
            self,
            f"Encrypts the alerts of {props.environment}",
            publishers=(BUDGETS, CLOUDWATCH),
            email=props.alert_email,
        )
        self.log_group = logs.LogGroup(
            self,
            "TrainingMetricsLogs",
            log_group_name=obs.training_log_group(props.environment),
            retention=retention("log_retention_days", props.log_retention_days),
            encryption_key=log_group_key(self, "TrainingMetricsKey", props.removal_policy),
            removal_policy=props.removal_policy,
        )
        self.alarms = self._alarms()
        self.dashboard = self._dashboard()
        self.budget: budgets.CfnBudget | None = None
        if props.budget_usd is not None:
            self.budget = monthly_budget(
                self,
                name=props.environment,
                usd=props.budget_usd,
                tag=(TAG_ENVIRONMENT, props.environment),
                topic=self.topic,
            )

    # Metrics.
    def _agent(
        self, metric: obs.AgentMetric, statistic: str, dimensions: dict[str, str] | None = None
    ) -> cw.Metric:
        return cw.Metric(
            namespace=obs.CONTAINER_INSIGHTS_NAMESPACE,
            metric_name=metric.name,
            dimensions_map={"ClusterName": self.props.cluster_name, **(dimensions or {})},
            statistic=statistic,
            period=PERIOD,
        )

    def _per_node(self, metric: obs.AgentMetric, statistic: str, label: str) -> cw.MathExpression:
        """A Metrics Insights query: ``metric`` per node of the cluster."""
        dimensions = ", ".join(obs.NODE)
        query = (
            f"SELECT {statistic}({metric.name}) FROM SCHEMA({obs.CONTAINER_INSIGHTS_NAMESPACE}, "
            f"{dimensions}) WHERE ClusterName = '{self.props.cluster_name}' GROUP BY NodeName"
        )
        return cw.MathExpression(expression=query, label=label, period=PERIOD)

    def _per_job(self, metric: str, statistic: str) -> cw.MathExpression:
        """A Metrics Insights query: the trainer's ``metric`` per job of the environment."""
        dimensions = ", ".join(obs.DIMENSIONS)
        query = (
            f'SELECT {statistic}({metric}) FROM SCHEMA("{obs.NAMESPACE}", {dimensions}) '
            f"WHERE {obs.ENVIRONMENT} = '{self.props.environment}' GROUP BY {obs.JOB}"
        )
        return cw.MathExpression(expression=query, label=metric, period=PERIOD)

    def _trainer(self, metric: str, statistic: str) -> cw.Metric:
        return cw.Metric(
            namespace=obs.NAMESPACE,
            metric_name=metric,
            dimensions_map={obs.ENVIRONMENT: self.props.environment},
            statistic=statistic,
            period=PERIOD,
        )

    # Alarms.
    def _alarms(self) -> dict[str, cw.Alarm]:
        props = self.props
        ecc = self._agent(obs.NEURON_ECC_EVENTS, "Sum")
        efa_errors = cw.MathExpression(
            expression=" + ".join(f"FILL(e{i}, 0)" for i in range(len(obs.EFA_ERRORS))),
            using_metrics={f"e{i}": self._agent(m, "Sum") for i, m in enumerate(obs.EFA_ERRORS)},
            label="EFA errors (dropped, retransmit timeouts, impaired or unresponsive peers)",
            period=PERIOD,
        )
        stalled = cw.MathExpression(
            expression="IF(pods > 0 AND FILL(steps, 0) == 0, 1, 0)",
            using_metrics={
                "pods": self._agent(
                    obs.NAMESPACE_RUNNING_PODS, "Maximum", {"Namespace": props.namespace}
                ),
                "steps": self._trainer(obs.LOGGED_INTERVALS, "Sum"),
            },
            label="training pods running, no step logged",
            period=PERIOD,
        )
        found = {
            "NeuronHardwareErrors": self._alarm(
                "NeuronHardwareErrors",
                ecc,
                f"{props.environment}: a Neuron device reported ECC errors (corrected or not); "
                "see the dashboard's nodes and the node problem detector's NeuronHealth condition",
                periods=1,
            ),
            "EfaErrors": self._alarm(
                "EfaErrors",
                efa_errors,
                f"{props.environment}: EFA dropped packets or lost peers on a node; "
                "multi-node jobs slow down or hang" + self._dra_note(*obs.EFA_ERRORS),
                periods=1,
            ),
            "TrainingStalled": self._alarm(
                "TrainingStalled",
                stalled,
                f"{props.environment}: pods run in namespace {props.namespace} but no job "
                f"logged a step for {props.stalled_minutes} minutes (trnctl job top NAME)",
                periods=props.stalled_minutes,
            ),
        }
        return found

    def _alarm(
        self, construct_id: str, metric: cw.IMetric, description: str, *, periods: int
    ) -> cw.Alarm:
        alarm = cw.Alarm(
            self,
            construct_id,
            alarm_name=f"{self.props.environment}-{construct_id}",
            alarm_description=description,
            metric=metric,
            threshold=0,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=periods,
            datapoints_to_alarm=periods,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )
        alarm.add_alarm_action(actions.SnsAction(self.topic))
        alarm.add_ok_action(actions.SnsAction(self.topic))
        return alarm

    # The dashboard.
    def _dashboard(self) -> cw.Dashboard:
        props = self.props
        dashboard = cw.Dashboard(
            self, "Dashboard", dashboard_name=props.environment, default_interval=Duration.hours(3)
        )
        dashboard.add_widgets(
            cw.TextWidget(markdown=self._header(), width=WIDE, height=3),
        )
        dashboard.add_widgets(
            cw.GraphWidget(
                title="Nodes",
                left=[
                    self._agent(obs.CLUSTER_NODE_COUNT, "Maximum"),
                    self._agent(obs.CLUSTER_FAILED_NODE_COUNT, "Maximum"),
                ],
                width=HALF,
            ),
            cw.GraphWidget(
                title="Node ready (1) per node",
                left=[self._per_node(obs.NODE_READY, "MIN", "ready")],
                width=HALF,
            ),
        )
        dashboard.add_widgets(
            cw.GraphWidget(
                title="NeuronCore utilization per node (%)",
                left=[self._per_node(obs.NEURONCORE_UTILIZATION, "AVG", "utilization")],
                width=HALF,
            ),
            cw.GraphWidget(
                title="Neuron device memory used per node (bytes)",
                left=[self._per_node(obs.NEURON_DEVICE_MEMORY, "MAX", "device memory")],
                width=HALF,
            ),
        )
        dashboard.add_widgets(
            cw.GraphWidget(
                title="EFA received per node (bytes/s)" + self._dra_note(obs.EFA_RX_BYTES),
                left=[self._per_node(obs.EFA_RX_BYTES, "SUM", "rx")],
                width=THIRD,
            ),
            cw.GraphWidget(
                title="EFA sent per node (bytes/s)" + self._dra_note(obs.EFA_TX_BYTES),
                left=[self._per_node(obs.EFA_TX_BYTES, "SUM", "tx")],
                width=THIRD,
            ),
            cw.GraphWidget(
                title="EFA errors and Neuron ECC events" + self._dra_note(*obs.EFA_ERRORS),
                left=[self.alarms["EfaErrors"].metric, self.alarms["NeuronHardwareErrors"].metric],
                width=THIRD,
            ),
        )
        dashboard.add_widgets(
            cw.GraphWidget(
                title="Tokens/s per job",
                left=[self._per_job(obs.TOKENS_PER_SECOND, "AVG")],
                width=THIRD,
            ),
            cw.GraphWidget(
                title="Loss per job", left=[self._per_job(obs.LOSS, "AVG")], width=THIRD
            ),
            cw.GraphWidget(
                title="MFU per job (%)", left=[self._per_job(obs.MFU, "AVG")], width=THIRD
            ),
        )
        bottom: list[cw.IWidget] = [
            cw.AlarmStatusWidget(alarms=list(self.alarms.values()), title="Alarms", width=HALF)
        ]
        if props.file_system_id is not None:
            bottom.insert(0, self._fsx_widget(props.file_system_id))
        dashboard.add_widgets(*bottom)
        return dashboard

    def _fsx_widget(self, file_system_id: str) -> cw.GraphWidget:
        def fsx(name: str) -> cw.Metric:
            return cw.Metric(
                namespace=obs.FSX_NAMESPACE,
                metric_name=name,
                dimensions_map={"FileSystemId": file_system_id},
                statistic="Sum",
                period=PERIOD,
            )

        seconds = int(PERIOD.to_seconds())
        return cw.GraphWidget(
            title="FSx for Lustre throughput (bytes/s)",
            left=[
                cw.MathExpression(
                    expression=f"read / {seconds}",
                    using_metrics={"read": fsx(obs.FSX_READ_BYTES)},
                    label="read",
                    period=PERIOD,
                ),
                cw.MathExpression(
                    expression=f"write / {seconds}",
                    using_metrics={"write": fsx(obs.FSX_WRITE_BYTES)},
                    label="write",
                    period=PERIOD,
                ),
            ],
            width=HALF,
        )

    def _dra_note(self, *metrics: obs.AgentMetric) -> str:
        """:data:`DRA_NOTE` in brackets where ``devices`` is ``dra`` and one of ``metrics`` needs
        a device plugin; nothing otherwise."""
        if self.props.devices != "dra" or not set(metrics) & set(obs.DEVICE_PLUGIN_ONLY):
            return ""
        return f" ({DRA_NOTE})"

    def _header(self) -> str:
        props = self.props
        groups = "; ".join(
            f"{g.role}: {g.nodes} x {g.instance_type} ({g.capacity})" for g in props.node_groups
        )
        devices = (
            " Devices by DRA: Neuron figures are per node (none per pod), and Container Insights "
            "has no EFA figures for the trn nodes (docs/observability-and-cost.md)."
            if props.devices == "dra"
            else ""
        )
        return (
            f"# {props.environment}\n"
            f"Cluster `{props.cluster_name}`, jobs in `{props.namespace}`. "
            f"Node groups: {groups or 'not listed'}.{devices} "
            "Per job: `trnctl job top NAME`, `trnctl job cost NAME`."
        )


def _validate(props: TrainingObservabilityProps, region: str) -> None:
    for name in ("environment", "cluster_name"):
        value = getattr(props, name)
        if not value or Token.is_unresolved(value):
            raise ValueError(
                f"{name} {value!r} is not allowed; give the name as a plain string (Metrics "
                "Insights queries and the dashboard name are text)"
            )
    if not 5 <= props.stalled_minutes <= 1440:
        raise ValueError(
            f"stalled_minutes {props.stalled_minutes} is not allowed; use 5 to 1440 (a day)"
        )
    if props.alert_email is not None and not formats.EMAIL.fullmatch(props.alert_email):
        raise ValueError(f"alert_email {props.alert_email!r} is not an email address")
    if props.budget_usd is not None:
        if props.budget_usd < 1:
            raise ValueError(f"budget_usd {props.budget_usd} is not allowed; use 1 or more")
        if not Token.is_unresolved(region) and region not in PREVIEW_REGIONS:
            raise ValueError(
                f"budget_usd: region {region!r} has no AWS::Budgets::Budget in CloudFormation; "
                f"it is offered in {', '.join(sorted(PREVIEW_REGIONS))}; leave budget_usd out"
            )
    retention("log_retention_days", props.log_retention_days)
    if props.devices not in device_modes.DEVICE_MODES:
        raise ValueError(
            f"devices {props.devices!r} is not allowed; use "
            f"{' or '.join(device_modes.DEVICE_MODES)}"
        )
