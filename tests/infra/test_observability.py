"""The environment's dashboard, alarms, alert topic, budget and Neuron metrics sources, as
synthesized: every metric the dashboard draws or an alarm watches is one the CloudWatch agent or
the trainer emits (trn_catalog.observability, whose trainer names tests/trainer/test_emf.py checks
against a real run), in both device modes."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2

from constructs_lib import TrainingObservability
from constructs_lib.observability import DRA_NOTE
from tests.conformance import chart_values
from tests.conftest import Synth, construct_app
from trn_catalog import GPU_CATALOG, versions
from trn_catalog import observability as obs
from trn_catalog.outputs import TAG_ENVIRONMENT, TAG_PREVIEW

QUERY = re.compile(
    r"SELECT (?P<stat>\w+)\((?P<metric>\w+)\) "
    r"FROM SCHEMA\(\"?(?P<ns>[\w/]+)\"?, (?P<dims>[\w, ]+)\)"
    r" WHERE (?P<where>.*) GROUP BY (?P<group>\w+)$"
)


def _flatten(node: Any) -> str:
    """A template value as text, references as placeholders."""
    if isinstance(node, str):
        return node
    if isinstance(node, dict) and "Fn::Join" in node:
        separator, parts = node["Fn::Join"]
        return str(separator).join(_flatten(p) for p in parts)
    return "TOKEN"


def dashboard(synth: Synth) -> dict[str, Any]:
    (board,) = synth.resources("workloads", "AWS::CloudWatch::Dashboard").values()
    body: dict[str, Any] = json.loads(_flatten(board["Properties"]["DashboardBody"]))
    return body


def used_metrics(widgets: list[dict[str, Any]]) -> set[tuple[str, str, tuple[str, ...]]]:
    """(namespace, metric, dimension names) of every metric and Metrics Insights query drawn."""
    found = set()
    for widget in widgets:
        for line in widget.get("properties", {}).get("metrics", []):
            options = line[-1] if isinstance(line[-1], dict) else {}
            if "expression" in options:
                query = QUERY.match(options["expression"])
                if query:
                    dims = tuple(d.strip() for d in query["dims"].split(","))
                    found.add((query["ns"], query["metric"], dims))
                continue
            names = [x for x in line if isinstance(x, str)]
            if names and names[0] == ".":
                continue
            namespace, metric, *pairs = names
            found.add((namespace, metric, tuple(sorted(pairs[0::2]))))
    return found


def catalog_sets() -> dict[tuple[str, str], set[tuple[str, ...]]]:
    """Each emitted metric's dimension sets, by (namespace, metric)."""
    sets: dict[tuple[str, str], set[tuple[str, ...]]] = {}
    for metric in obs.AGENT_METRICS:
        sets[(obs.CONTAINER_INSIGHTS_NAMESPACE, metric.name)] = {
            tuple(sorted(d)) for d in metric.dimension_sets
        }
    for name in {**obs.TRAIN_METRICS, **obs.EVAL_METRICS}:
        sets[(obs.NAMESPACE, name)] = {
            tuple(sorted(obs.DIMENSIONS)),
            tuple(sorted(obs.ENVIRONMENT_DIMENSIONS)),
        }
    for name in (obs.FSX_READ_BYTES, obs.FSX_WRITE_BYTES):
        sets[(obs.FSX_NAMESPACE, name)] = {("FileSystemId",)}
    return sets


@pytest.mark.parametrize("variant", ["dev", "dra"])
def test_the_dashboard_draws_only_what_the_agent_and_the_trainer_emit(
    synth_variant: Callable[[str], Synth], variant: str
) -> None:
    widgets = dashboard(synth_variant(variant))["widgets"]
    used = used_metrics(widgets)
    known = catalog_sets()

    for namespace, metric, dims in used:
        assert (namespace, metric) in known, (namespace, metric)
        assert tuple(sorted(dims)) in known[(namespace, metric)], (metric, dims)
    drawn = {m for _, m, _ in used}
    assert {
        obs.CLUSTER_NODE_COUNT.name,
        obs.CLUSTER_FAILED_NODE_COUNT.name,
        obs.NODE_READY.name,
        obs.NEURONCORE_UTILIZATION.name,
        obs.NEURON_DEVICE_MEMORY.name,
        obs.EFA_RX_BYTES.name,
        obs.EFA_TX_BYTES.name,
        obs.FSX_READ_BYTES,
        obs.FSX_WRITE_BYTES,
        obs.TOKENS_PER_SECOND,
        obs.LOSS,
        obs.MFU,
    } <= drawn
    titles = [w["properties"].get("title") for w in widgets]
    for title in ("Nodes", "NeuronCore utilization per node (%)", "Tokens/s per job", "Alarms"):
        assert title in titles
    queries = [
        line[-1]["expression"]
        for w in widgets
        for line in w.get("properties", {}).get("metrics", [])
        if isinstance(line[-1], dict) and "expression" in line[-1]
    ]
    assert 'SELECT AVG(TokensPerSecond) FROM SCHEMA("TrnPlatform/Training", Environment, Job)' in (
        "\n".join(queries)
    )
    env = synth_variant(variant).platform.workloads.outputs.environment
    assert all(f"'{env}'" in q for q in queries if q.startswith("SELECT"))


def _alarms(synth: Synth) -> dict[str, dict[str, Any]]:
    return {
        a["Properties"]["AlarmName"].split("-", 2)[-1]: a["Properties"]
        for a in synth.resources("workloads", "AWS::CloudWatch::Alarm").values()
    }


def _alarm_metrics(alarm: dict[str, Any]) -> set[tuple[str, str, tuple[str, ...]]]:
    found = set()
    for query in alarm.get("Metrics", []):
        stat = query.get("MetricStat")
        if stat:
            metric = stat["Metric"]
            dims = tuple(sorted(d["Name"] for d in metric["Dimensions"]))
            found.add((metric["Namespace"], metric["MetricName"], dims))
    if "MetricName" in alarm:
        dims = tuple(sorted(d["Name"] for d in alarm["Dimensions"]))
        found.add((alarm["Namespace"], alarm["MetricName"], dims))
    return found


def test_alarms_watch_emitted_metrics_and_tell_the_topic(dev: Synth) -> None:
    alarms = _alarms(dev)
    assert set(alarms) == {"NeuronHardwareErrors", "EfaErrors", "TrainingStalled"}
    known = catalog_sets()
    watched = set()
    for alarm in alarms.values():
        (action,) = alarm["AlarmActions"]
        assert action == alarm["OKActions"][0]
        assert "Ref" in action  # the environment's alert topic
        assert alarm["TreatMissingData"] == "notBreaching"
        assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (0, "GreaterThanThreshold")
        for namespace, metric, dims in _alarm_metrics(alarm):
            assert dims in known[(namespace, metric)], (metric, dims)
            watched.add(metric)
    assert {obs.NEURON_ECC_EVENTS.name, obs.LOGGED_INTERVALS, obs.NAMESPACE_RUNNING_PODS.name} <= (
        watched
    )
    assert {m.name for m in obs.EFA_ERRORS} <= watched
    stalled = alarms["TrainingStalled"]
    assert stalled["EvaluationPeriods"] == stalled["DatapointsToAlarm"] == 30
    (expression,) = [q["Expression"] for q in stalled["Metrics"] if "Expression" in q]
    assert expression == "IF(pods > 0 AND FILL(steps, 0) == 0, 1, 0)"


def _topic_policy_principals(synth: Synth) -> set[str]:
    (policy,) = synth.resources("workloads", "AWS::SNS::TopicPolicy").values()
    found: set[str] = set()
    for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
        principal = statement.get("Principal")
        service = principal.get("Service", []) if isinstance(principal, dict) else []
        found |= {service} if isinstance(service, str) else set(service)
    return found


def test_the_alert_topic_is_in_the_outputs_and_takes_alarms_and_budgets(dev: Synth) -> None:
    (parameter,) = dev.resources("workloads", "AWS::SSM::Parameter").values()
    text = _flatten(parameter["Properties"]["Value"])
    outputs = json.loads(text.replace("TOKEN", "x"))
    assert outputs["dashboard"] == "trn-dev"
    assert "alert_topic_arn" in outputs
    assert _topic_policy_principals(dev) == {"cloudwatch.amazonaws.com", "budgets.amazonaws.com"}
    (topic,) = dev.resources("workloads", "AWS::SNS::Topic").values()
    assert "KmsMasterKeyId" in topic["Properties"]


@pytest.mark.parametrize(("variant", "amount"), [("dev", 10_000), ("prod", 50_000)])
def test_each_environment_has_a_monthly_budget_on_its_tag(
    synth_variant: Callable[[str], Synth], variant: str, amount: int
) -> None:
    synth = synth_variant(variant)
    (budget,) = synth.resources("workloads", "AWS::Budgets::Budget").values()
    spec = budget["Properties"]["Budget"]
    name = synth.platform.workloads.outputs.environment
    assert spec["BudgetLimit"] == {"Amount": amount, "Unit": "USD"}
    assert spec["TimeUnit"] == "MONTHLY"
    assert spec["CostFilters"] == {"TagKeyValue": [f"user:{TAG_ENVIRONMENT}${name}"]}
    thresholds = [
        n["Notification"]["Threshold"] for n in budget["Properties"]["NotificationsWithSubscribers"]
    ]
    assert thresholds == [50, 80, 100]


def test_a_preview_keeps_its_own_budget_only(synth_variant: Callable[[str], Synth]) -> None:
    synth = synth_variant("preview")
    assert synth.resources("workloads", "AWS::Budgets::Budget") == {}
    (budget,) = synth.resources("lifecycle", "AWS::Budgets::Budget").values()
    assert budget["Properties"]["Budget"]["CostFilters"] == {
        "TagKeyValue": [f"user:{TAG_PREVIEW}$alpha"]
    }


def test_the_trainers_log_group_is_encrypted_with_retention(dev: Synth) -> None:
    (group,) = dev.resources("workloads", "AWS::Logs::LogGroup").values()
    assert group["Properties"]["LogGroupName"] == "/aws/trn-platform/trn-dev/training"
    assert group["Properties"]["RetentionInDays"] == 30
    assert "KmsKeyId" in group["Properties"]


def _cloudwatch_addon(synth: Synth) -> dict[str, Any]:
    (addon,) = [
        a["Properties"]
        for a in synth.resources("cluster", "AWS::EKS::Addon").values()
        if a["Properties"]["AddonName"] == "amazon-cloudwatch-observability"
    ]
    configuration: dict[str, Any] = json.loads(addon["ConfigurationValues"])
    return configuration


def _trn_labels(synth: Synth) -> dict[str, str]:
    groups = synth.resources("cluster", "AWS::EKS::Nodegroup").values()
    (labels,) = [
        g["Properties"]["Labels"]
        for g in groups
        if g["Properties"].get("Labels", {}).get("trn-platform/node-type") == "trainium"
    ]
    return dict(labels)


@pytest.mark.parametrize("variant", ["dev", "dra", "capacity-block"])
def test_every_trn_node_has_a_neuron_metrics_source(
    synth_variant: Callable[[str], Synth], variant: str
) -> None:
    """Container Insights' neuron-monitor runs on the trn group's type (the add-on's own list
    stops at trn2u.48xlarge) and on no GPU node, its agent collects Neuron and EFA metrics and
    listens for the trainer's EMF. Under DRA that neuron-monitor is the Neuron source: the
    dashboard draws the node-level Neuron metrics, which the agent publishes without a device
    plugin; and the nodes carry the label Neuron Observer selects them by."""
    synth = synth_variant(variant)
    configuration = _cloudwatch_addon(synth)
    # The chart (5.3.1 values.yaml) starts neuron-monitor unless told not to.
    assert configuration["neuronMonitor"].get("enabled", True) is True
    affinity = configuration["neuronMonitor"]["affinity"]["nodeAffinity"]
    (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (types,) = [
        e["values"]
        for e in term["matchExpressions"]
        if e["key"] == "node.kubernetes.io/instance-type"
    ]
    assert synth.platform.cluster.trainium.props.instance_type in types
    assert not set(types) & set(GPU_CATALOG)
    metrics = configuration["agent"]["config"]["logs"]["metrics_collected"]
    assert metrics["kubernetes"]["enhanced_container_insights"] is True
    assert metrics["emf"] == {}
    labels = _trn_labels(synth)
    if variant == "dra":
        assert labels[obs.NEURON_PRESENT_LABEL] == "true"
        drawn = {m for _, m, _ in used_metrics(dashboard(synth)["widgets"])}
        neuron = {obs.NEURONCORE_UTILIZATION.name, obs.NEURON_DEVICE_MEMORY.name}
        assert neuron <= drawn
        assert not neuron & {m.name for m in obs.DEVICE_PLUGIN_ONLY}
    else:
        assert obs.NEURON_PRESENT_LABEL not in labels  # the device plugin sets it


@pytest.mark.parametrize("variant", ["dev", "dra"])
def test_under_dra_what_only_a_device_plugin_feeds_says_so(
    synth_variant: Callable[[str], Synth], variant: str
) -> None:
    """Under DRA the widgets and the alarm drawing EFA metrics (none from DRA trn nodes) name
    that, and the header says where the Neuron figures come from; with device plugins, nothing
    does."""
    synth = synth_variant(variant)
    dra = variant == "dra"
    device_plugin_only = {m.name for m in obs.DEVICE_PLUGIN_ONLY}
    widgets = dashboard(synth)["widgets"]
    flagged, others = [], []
    for widget in widgets:
        drawn = {m for _, m, _ in used_metrics([widget])}
        title = widget["properties"].get("title", "")
        (flagged if drawn & device_plugin_only else others).append(title)
    assert len(flagged) == 3
    assert all((DRA_NOTE in title) == dra for title in flagged)
    assert not any(DRA_NOTE in title for title in others)
    (header,) = [w["properties"]["markdown"] for w in widgets if w["type"] == "text"]
    assert ("Devices by DRA" in header) == dra
    alarms = _alarms(synth)
    assert (DRA_NOTE in alarms["EfaErrors"]["AlarmDescription"]) == dra
    assert DRA_NOTE not in alarms["NeuronHardwareErrors"]["AlarmDescription"]


def test_the_addon_configuration_keys_are_the_charts() -> None:
    configuration = versions.addon("amazon-cloudwatch-observability").configuration
    assert configuration is not None
    assert chart_values.CLOUDWATCH_OBSERVABILITY.problems(dict(configuration)) == []
    assert chart_values.CLOUDWATCH_OBSERVABILITY.problems({"neuronMonitor": {"tolerate": 1}}) == [
        "neuronMonitor.tolerate: not a value of amazon-cloudwatch-observability v5.3.1-eksbuild.1"
    ]


def _stack(region: str = "us-east-2") -> cdk.Stack:
    app = construct_app()
    return cdk.Stack(app, "S", env=cdk.Environment(account="123456789012", region=region))


@pytest.mark.parametrize(
    ("props", "match"),
    [
        ({"stalled_minutes": 2}, r"stalled_minutes 2 is not allowed; use 5 to 1440"),
        ({"alert_email": "ops"}, r"alert_email 'ops' is not an email address"),
        ({"budget_usd": 0}, r"budget_usd 0 is not allowed; use 1 or more"),
        ({"environment": ""}, r"environment '' is not allowed; give the name as a plain string"),
        ({"log_retention_days": 2}, r"log_retention_days 2 is not a supported log retention"),
        ({"devices": "cdi"}, r"devices 'cdi' is not allowed; use plugin or dra"),
    ],
)
def test_bad_props_are_refused_naming_the_field(props: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TrainingObservability(
            _stack(), "O", **{"environment": "trn-x", "cluster_name": "trn-x", **props}
        )


def test_a_token_cluster_name_and_a_budget_outside_budget_regions_are_refused() -> None:
    stack = _stack()
    vpc_id = ec2.Vpc(stack, "V").vpc_id
    with pytest.raises(ValueError, match=r"cluster_name .* give the name as a plain string"):
        TrainingObservability(stack, "O", environment="trn-x", cluster_name=vpc_id)
    with pytest.raises(ValueError, match=r"budget_usd: region 'ap-south-2' has no AWS::Budgets"):
        TrainingObservability(
            _stack("ap-south-2"), "O", environment="e", cluster_name="c", budget_usd=10
        )
