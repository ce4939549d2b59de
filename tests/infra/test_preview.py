"""Preview environments: names, tags, expiry, deletion, budget, and RETAIN refused."""

import json
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3

from constructs_lib import PreviewLifecycle
from platform_config import parse_config
from stacks import build_platform
from tests.conftest import Synth, construct_app, context_with
from trn_catalog.outputs import PREVIEW_REGIONS, TAG_EXPIRES_AT, TAG_PREVIEW

NOW = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)


def preview_app(projects: tuple[str, ...], outdir: Path) -> cdk.App:
    app = construct_app(context=context_with({}), outdir=str(outdir))
    for project in projects:
        config = parse_config(
            {
                "preview": project,
                "ttl_hours": "24",
                "budget_email": "ml@example.com",
                "budget_usd": "1200",
            },
            now=NOW,
        )
        build_platform(app, config)
    return app


@pytest.fixture(scope="module")
def two_previews(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    outdir = tmp_path_factory.mktemp("previews")
    preview_app(("alpha", "beta"), outdir).synth()
    return {
        p.name.removesuffix(".template.json"): json.loads(p.read_text())
        for p in outdir.glob("*.template.json")
    }


def named_values(template: dict[str, Any]) -> set[str]:
    names = set()
    for resource in template["Resources"].values():
        props = resource.get("Properties", {})
        for key in ("Name", "ClusterName", "NodegroupName", "FunctionName", "BudgetName"):
            value = props.get(key) or props.get("Budget", {}).get(key)
            if isinstance(value, str):
                names.add(value)
    return names


def test_two_previews_synthesize_side_by_side(two_previews: dict[str, dict[str, Any]]) -> None:
    parts = ("network", "data", "cluster", "image", "workloads", "lifecycle")
    assert set(two_previews) == {f"trn-pv-{p}-{part}" for p in ("alpha", "beta") for part in parts}
    alpha = set().union(*(named_values(t) for n, t in two_previews.items() if "-alpha-" in n))
    beta = set().union(*(named_values(t) for n, t in two_previews.items() if "-beta-" in n))
    assert alpha and beta and not alpha & beta
    assert all("alpha" in name for name in alpha)
    assert all("beta" in name for name in beta)


def test_preview_stacks_are_tagged_and_expire(synth_variant: Callable[[str], Synth]) -> None:
    synth = synth_variant("preview")
    for stack in synth.platform.stacks:
        tags = cdk.Stack.of(stack).tags.tag_values()
        assert tags[TAG_PREVIEW] == "alpha"
        expiry = datetime.strptime(tags[TAG_EXPIRES_AT], "%Y-%m-%dT%H:%M:%SZ")
        assert expiry.second == 0
    # The expiry is a stack tag only (CloudFormation copies it to resources in place); the
    # preview tag is on every taggable resource too.
    for name, template in synth.templates.items():
        keys = resource_tag_keys(template)
        assert TAG_EXPIRES_AT not in keys, name
        assert TAG_PREVIEW in keys, name


def resource_tag_keys(template: dict[str, Any]) -> set[str]:
    """The tag keys the template's resources carry (``Tags`` as a list or a map)."""
    keys: set[str] = set()
    for resource in template["Resources"].values():
        tags = resource.get("Properties", {}).get("Tags", [])
        keys |= set(tags) if isinstance(tags, dict) else {t["Key"] for t in tags}
    return keys


def test_expiry_schedule_invokes_the_reaper_with_the_stacks(
    two_previews: dict[str, dict[str, Any]],
) -> None:
    lifecycle = two_previews["trn-pv-alpha-lifecycle"]
    (schedule,) = [
        r["Properties"]
        for r in lifecycle["Resources"].values()
        if r["Type"] == "AWS::Scheduler::Schedule"
    ]
    assert schedule["ScheduleExpression"] == "at(2026-11-30T20:00:00)"
    assert schedule["ScheduleExpressionTimezone"] == "Etc/UTC"
    event = json.loads(schedule["Target"]["Input"])
    assert event["project"] == "alpha" and event["self_stack"] == "trn-pv-alpha-lifecycle"
    assert event["stacks"][0] == "trn-pv-alpha-lifecycle"
    assert event["stacks"].index("trn-pv-alpha-network") < event["stacks"].index(
        "trn-pv-alpha-workloads"
    )
    assert event["tags"] == {"preview": TAG_PREVIEW, "expires_at": TAG_EXPIRES_AT}


def test_reaper_may_only_touch_this_previews_stacks(
    two_previews: dict[str, dict[str, Any]],
) -> None:
    lifecycle = two_previews["trn-pv-alpha-lifecycle"]
    policies = [r for r in lifecycle["Resources"].values() if r["Type"] == "AWS::IAM::Policy"]
    statements = [s for p in policies for s in p["Properties"]["PolicyDocument"]["Statement"]]
    (stack_statement,) = [s for s in statements if "cloudformation:DeleteStack" in s["Action"]]
    text = json.dumps(stack_statement["Resource"])
    assert "stack/trn-pv-alpha-" in text and "beta" not in text
    assert all(s["Resource"] != "*" for s in statements)


def test_budget_alerts_at_50_80_100(two_previews: dict[str, dict[str, Any]]) -> None:
    lifecycle = two_previews["trn-pv-alpha-lifecycle"]
    (budget,) = [
        r["Properties"]
        for r in lifecycle["Resources"].values()
        if r["Type"] == "AWS::Budgets::Budget"
    ]
    assert budget["Budget"]["CostFilters"] == {"TagKeyValue": ["user:trn-platform:preview$alpha"]}
    assert budget["Budget"]["BudgetLimit"] == {"Amount": 1200, "Unit": "USD"}
    thresholds = [n["Notification"]["Threshold"] for n in budget["NotificationsWithSubscribers"]]
    assert thresholds == [50, 80, 100]
    for notification in budget["NotificationsWithSubscribers"]:
        assert [s["SubscriptionType"] for s in notification["Subscribers"]] == ["SNS"]
    (topic,) = [r for r in lifecycle["Resources"].values() if r["Type"] == "AWS::SNS::Topic"]
    assert "KmsMasterKeyId" in topic["Properties"]
    # The email hears of budget alerts and of failed deletions through the one topic.
    (subscription,) = [
        r["Properties"]
        for r in lifecycle["Resources"].values()
        if r["Type"] == "AWS::SNS::Subscription"
    ]
    assert (subscription["Protocol"], subscription["Endpoint"]) == ("email", "ml@example.com")


def test_a_failing_reaper_reports_to_the_alert_topic(
    two_previews: dict[str, dict[str, Any]],
) -> None:
    resources = two_previews["trn-pv-alpha-lifecycle"]["Resources"]
    (function,) = [r for r in resources.values() if r["Type"] == "AWS::Lambda::Function"]
    # Reserved concurrency fails on accounts whose unreserved pool is at its minimum.
    assert "ReservedConcurrentExecutions" not in function["Properties"]
    (config,) = [r for r in resources.values() if r["Type"] == "AWS::Lambda::EventInvokeConfig"]
    (topic_id,) = [i for i, r in resources.items() if r["Type"] == "AWS::SNS::Topic"]
    destination = config["Properties"]["DestinationConfig"]["OnFailure"]["Destination"]
    assert destination == {"Ref": topic_id}


def test_reaper_may_move_only_its_own_schedule(two_previews: dict[str, dict[str, Any]]) -> None:
    resources = two_previews["trn-pv-alpha-lifecycle"]["Resources"]
    (schedule,) = [r for r in resources.values() if r["Type"] == "AWS::Scheduler::Schedule"]
    assert schedule["Properties"]["Name"] == "trn-pv-alpha-expiry"
    event = json.loads(schedule["Properties"]["Target"]["Input"])
    assert event["schedule"] == {"name": "trn-pv-alpha-expiry", "group": "default"}
    statements = [
        s
        for r in resources.values()
        if r["Type"] == "AWS::IAM::Policy"
        for s in r["Properties"]["PolicyDocument"]["Statement"]
    ]
    (move,) = [s for s in statements if "scheduler:UpdateSchedule" in s["Action"]]
    assert move["Resource"].endswith(":schedule/default/trn-pv-alpha-expiry")
    (pass_role,) = [s for s in statements if s["Action"] == "iam:PassRole"]
    assert pass_role["Condition"] == {
        "StringEquals": {"iam:PassedToService": "scheduler.amazonaws.com"}
    }
    assert schedule["Properties"]["Target"]["RoleArn"]["Fn::GetAtt"][0] in json.dumps(
        pass_role["Resource"]
    )


def test_preview_instances_and_volumes_carry_the_preview_tags(
    two_previews: dict[str, dict[str, Any]],
) -> None:
    # Node group tags do not reach instances; the budget filters on the preview tag. The expiry
    # stays off: it moves at every redeploy, and a new template version replaces every node.
    templates = [
        r["Properties"]["LaunchTemplateData"]
        for r in two_previews["trn-pv-alpha-cluster"]["Resources"].values()
        if r["Type"] == "AWS::EC2::LaunchTemplate"
    ]
    assert len(templates) == 2
    for data in templates:
        kinds = {spec["ResourceType"]: spec["Tags"] for spec in data["TagSpecifications"]}
        assert set(kinds) == {"instance", "volume"}
        for tags in kinds.values():
            values = {t["Key"]: t["Value"] for t in tags}
            assert values[TAG_PREVIEW] == "alpha"
            assert TAG_EXPIRES_AT not in values


def test_nothing_in_a_preview_is_retained(two_previews: dict[str, dict[str, Any]]) -> None:
    for name, template in two_previews.items():
        for logical_id, resource in template["Resources"].items():
            assert resource.get("DeletionPolicy", "Delete") == "Delete", (name, logical_id)


def test_a_retain_request_in_a_preview_is_refused(tmp_path: Path) -> None:
    app = construct_app(context=context_with({}), outdir=str(tmp_path))
    config = parse_config({"preview": "gamma"}, now=NOW)
    platform = build_platform(app, config)
    s3.Bucket(platform.data, "Keep", removal_policy=cdk.RemovalPolicy.RETAIN)
    with pytest.raises(
        RuntimeError, match=r"trn-pv-gamma-data/Keep/Resource: preview stacks .*RETAIN is refused"
    ):
        app.synth()


def lifecycle(region: str = "us-east-2", **overrides: Any) -> PreviewLifecycle:
    app = construct_app()
    stack = cdk.Stack(app, "L", env=cdk.Environment(account="123456789012", region=region))
    props: dict[str, Any] = {"project": "delta", "expires_at": NOW, "stacks": [stack], **overrides}
    return PreviewLifecycle(stack, "P", **props)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"project": "Delta_1"}, r"project 'Delta_1' is not allowed; use a DNS-safe project name"),
        ({"expires_at": datetime(2026, 12, 1)}, r"expires_at .* must carry a timezone"),
        ({"stacks": []}, r"stacks is empty"),
        ({"budget_usd": 0}, r"budget_usd 0 is not allowed"),
        ({"alert_email": "ops"}, r"alert_email 'ops' is not an email address"),
        ({"thresholds": [50, 0]}, r"thresholds: 0 is not a percentage"),
    ],
)
def test_lifecycle_rejects_bad_props(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lifecycle(**overrides)


def test_a_preview_needs_a_region_whose_cloudformation_makes_budgets() -> None:
    with pytest.raises(ValueError, match=r"region 'ap-south-2' is not allowed: .*Budgets::Budget"):
        lifecycle(region="ap-south-2")


def test_preview_regions_are_where_cloudformation_offers_budgets() -> None:
    """The list follows the regional schemas of the pinned cfn-lint (CloudFormation's own)."""
    providers = resources.files("cfnlint") / "data" / "schemas" / "providers"
    offered = {
        path.name.removesuffix(".json")
        for path in providers.iterdir()
        if path.name.endswith(".json") and "AWS::Budgets::Budget" in json.loads(path.read_text())
    }
    assert offered == PREVIEW_REGIONS
