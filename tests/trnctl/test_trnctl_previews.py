"""trnctl preview list|extend|reap against moto's CloudFormation."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.stub import ANY

from trn_catalog.outputs import TAG_EXPIRES_AT, TAG_PREVIEW
from trnctl import aws, previews
from trnctl.errors import TrnctlError

NOW = datetime.now(UTC)
PAST = previews.format_expiry(NOW - timedelta(hours=1))
FUTURE = previews.format_expiry(NOW + timedelta(hours=24))
TEMPLATE = json.dumps({"Resources": {"Handle": {"Type": "AWS::SNS::Topic"}}})


@pytest.fixture
def cfn(moto: None) -> Any:
    pytest.importorskip(
        "openapi_spec_validator",
        reason="moto's CloudFormation imports openapi-spec-validator (moto[cloudformation])",
    )
    return aws.client("cloudformation")


def tagged(cfn: Any, name: str, project: str | None, expires: str | None, **other: str) -> None:
    tags = [{"Key": k, "Value": v} for k, v in other.items()]
    if project is not None:
        tags.append({"Key": TAG_PREVIEW, "Value": project})
    if expires is not None:
        tags.append({"Key": TAG_EXPIRES_AT, "Value": expires})
    cfn.create_stack(StackName=name, TemplateBody=TEMPLATE, Tags=tags)


def live(cfn: Any) -> set[str]:
    return {
        s["StackName"]
        for s in cfn.describe_stacks()["Stacks"]
        if s["StackStatus"] != "DELETE_COMPLETE"
    }


def tags_of(cfn: Any, name: str) -> dict[str, str]:
    stack = cfn.describe_stacks(StackName=name)["Stacks"][0]
    return {t["Key"]: t["Value"] for t in stack.get("Tags", [])}


@pytest.fixture
def estate(cfn: Any) -> Any:
    """Every kind of stack the reaper meets, created oldest to newest."""
    tagged(cfn, "trn-dev-network", None, None, owner="platform")
    tagged(cfn, "trn-pv-alpha-network", "alpha", PAST)
    tagged(cfn, "trn-pv-alpha-data", "alpha", PAST)
    tagged(cfn, "trn-pv-beta-network", "beta", PAST)
    tagged(cfn, "trn-pv-gamma-network", "gamma", FUTURE)
    tagged(cfn, "only-project", "delta", None)
    tagged(cfn, "only-expiry", None, PAST)
    tagged(cfn, "not-a-date", "epsilon", "next tuesday")
    tagged(cfn, "no-zone", "zeta", "2020-01-01T00:00:00")
    tagged(cfn, "other-zone", "eta", "2020-01-01T00:00:00+02:00")
    tagged(cfn, "someone-else", None, None, **{"other-product:expires-at": PAST})
    return cfn


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-12-01T12:00:00Z", datetime(2026, 12, 1, 12, tzinfo=UTC)),
        ("2026-12-01T12:00:00+00:00", datetime(2026, 12, 1, 12, tzinfo=UTC)),
        ("2026-12-01T12:00:00.5Z", datetime(2026, 12, 1, 12, 0, 0, 500000, tzinfo=UTC)),
        ("2026-12-01T12:00:00", None),
        ("2026-12-01T12:00:00+01:00", None),
        ("1733054400", None),
        ("", None),
    ],
)
def test_parse_expiry_accepts_only_utc_iso_8601(value: str, expected: datetime | None) -> None:
    assert previews.parse_expiry(value) == expected


def test_reap_without_yes_deletes_nothing(trnctl: Any, estate: Any) -> None:
    before = live(estate)

    run = trnctl("preview", "reap")

    assert live(estate) == before
    assert "would delete: trn-pv-alpha-data" in run.stdout
    assert "dry run: nothing was deleted; rerun with --yes to delete" in run.stdout


def test_reap_deletes_only_expired_stacks_with_both_tags_newest_first(
    trnctl: Any, estate: Any
) -> None:
    run = trnctl("preview", "reap", "--yes")

    assert live(estate) == {
        "trn-dev-network",
        "trn-pv-gamma-network",
        "only-project",
        "only-expiry",
        "not-a-date",
        "no-zone",
        "other-zone",
        "someone-else",
    }
    deleted = [line for line in run.stdout.splitlines() if line.startswith("deleted: ")]
    assert deleted == [
        "deleted: trn-pv-beta-network",
        "deleted: trn-pv-alpha-data",
        "deleted: trn-pv-alpha-network",
    ]
    # Reported, left alone, and the exit code says so.
    assert run.exit_code == 1
    for name in ("not-a-date", "no-zone", "other-zone"):
        assert f"left alone: {name} has a malformed trn-platform:expires-at" in run.stdout
    assert "left alone: only-project lacks the tag trn-platform:expires-at" in run.stdout
    assert "left alone: only-expiry lacks the tag trn-platform:preview" in run.stdout
    assert "someone-else" not in run.stdout and "trn-dev-network" not in run.stdout


def test_reap_of_one_project_leaves_other_projects(trnctl: Any, estate: Any) -> None:
    run = trnctl("preview", "reap", "--project", "alpha", "--yes")

    assert run.exit_code == 0, run.stdout + run.stderr
    assert "trn-pv-beta-network" in live(estate)
    assert not {"trn-pv-alpha-network", "trn-pv-alpha-data"} & live(estate)


def test_reap_with_nothing_expired_exits_0(trnctl: Any, cfn: Any) -> None:
    tagged(cfn, "trn-pv-gamma-network", "gamma", FUTURE)

    run = trnctl("preview", "reap", "--yes")

    assert run.exit_code == 0
    assert "nothing to reap (1 preview stacks not yet expired)" in run.stdout
    assert live(cfn) == {"trn-pv-gamma-network"}


def test_list_shows_preview_stacks_and_their_state(trnctl: Any, estate: Any) -> None:
    run = trnctl("preview", "list")

    assert run.exit_code == 0
    states = {}
    for line in run.stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 5:
            states[cells[0]] = cells[3]
    assert states == {
        "trn-pv-alpha-network": "expired",
        "trn-pv-alpha-data": "expired",
        "trn-pv-beta-network": "expired",
        "trn-pv-gamma-network": "active",
        "only-project": "missing a tag",
        "only-expiry": "missing a tag",
        "not-a-date": "malformed expiry",
        "no-zone": "malformed expiry",
        "other-zone": "malformed expiry",
    }


def test_extend_moves_the_expiry_of_the_projects_stacks_only(trnctl: Any, cfn: Any) -> None:
    tagged(cfn, "trn-pv-gamma-network", "gamma", FUTURE, owner="ml")
    tagged(cfn, "trn-pv-gamma-data", "gamma", PAST)
    tagged(cfn, "trn-pv-beta-network", "beta", FUTURE)

    run = trnctl("preview", "extend", "gamma", "--hours", "12")

    assert run.exit_code == 0, run.stderr
    network = tags_of(cfn, "trn-pv-gamma-network")
    # Still ahead: moved from the current expiry, other tags kept.
    assert previews.parse_expiry(network[TAG_EXPIRES_AT]) == previews.parse_expiry(
        FUTURE
    ) + timedelta(hours=12)
    assert network["owner"] == "ml"
    # Already expired: moved from now.
    data_expiry = previews.parse_expiry(tags_of(cfn, "trn-pv-gamma-data")[TAG_EXPIRES_AT])
    assert data_expiry is not None
    assert timedelta(hours=11) < data_expiry - NOW < timedelta(hours=13)
    assert tags_of(cfn, "trn-pv-beta-network")[TAG_EXPIRES_AT] == FUTURE
    assert "trn-pv-gamma-data: expires-at " in run.stdout


def test_an_extension_ends_at_most_two_weeks_from_now() -> None:
    """Extending again and again moves the expiry, never past two weeks ahead."""
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    stack = previews.PreviewStack(
        name="trn-pv-gamma-network",
        stack_id="arn:aws:cloudformation:us-east-2:123456789012:stack/trn-pv-gamma-network/1",
        status="UPDATE_COMPLETE",
        created=now,
        tags={TAG_PREVIEW: "gamma", TAG_EXPIRES_AT: "2026-12-14T00:00:00Z"},  # 300 h ahead
    )
    assert previews.new_expiry(stack, 336, now) == now + timedelta(hours=336)
    assert previews.capped(stack, 336, now)
    assert previews.new_expiry(stack, 12, now) == now + timedelta(hours=312)
    assert not previews.capped(stack, 12, now)
    # An expiry set further ahead by hand is never shortened, and not reported as capped.
    far = dataclasses.replace(stack, tags={**stack.tags, TAG_EXPIRES_AT: "2027-01-01T00:00:00Z"})
    assert previews.new_expiry(far, 12, now) == datetime(2027, 1, 1, tzinfo=UTC)
    assert not previews.capped(far, 12, now)
    # At the cap, to the tag's second (now carries microseconds): unchanged, not capped.
    at_cap = dataclasses.replace(stack, tags={**stack.tags, TAG_EXPIRES_AT: "2026-12-15T12:00:00Z"})
    late = now.replace(microsecond=500_000)
    assert previews.new_expiry(at_cap, 12, late) == at_cap.expires
    assert not previews.capped(at_cap, 12, late)


def test_a_stack_already_past_the_cap_is_not_updated(trnctl: Any, cfn: Any) -> None:
    """CloudFormation refuses an update that changes nothing (moto accepts one)."""
    far = f"{NOW + timedelta(hours=400):%Y-%m-%dT%H:%M:%SZ}"
    tagged(cfn, "trn-pv-gamma-network", "gamma", far)
    updated: list[str] = []
    real = aws.client

    def client(service: str, region: str | None = None) -> Any:
        made = real(service, region)
        if service == "cloudformation":
            original = made.update_stack
            made.update_stack = lambda **kw: updated.append(kw["StackName"]) or original(**kw)
        return made

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(aws, "client", client)
        run = trnctl("preview", "extend", "gamma", "--hours", "12")

    assert run.exit_code == 0, run.stderr
    assert updated == []
    assert f"expires-at {far} (unchanged: already at or past two weeks from now)" in run.stdout
    assert tags_of(cfn, "trn-pv-gamma-network")[TAG_EXPIRES_AT] == far


def test_extend_says_when_the_cap_applied(trnctl: Any, cfn: Any) -> None:
    far = f"{NOW + timedelta(hours=300):%Y-%m-%dT%H:%M:%SZ}"
    tagged(cfn, "trn-pv-gamma-network", "gamma", far)

    run = trnctl("preview", "extend", "gamma", "--hours", "100")

    assert run.exit_code == 0, run.stderr
    assert "(capped at two weeks from now) (stack update started)" in run.stdout


def test_extend_of_an_unknown_project_exits_4(trnctl: Any, cfn: Any) -> None:
    run = trnctl("preview", "extend", "nope", "--hours", "12")

    assert run.exit_code == 4
    assert run.stderr == (
        "trnctl: no preview stacks of project 'nope' (tag trn-platform:preview=nope)\n"
    )


@pytest.mark.parametrize("hours", ["0", "337"])
def test_extend_refuses_hours_out_of_range(trnctl: Any, cfn: Any, hours: str) -> None:
    run = trnctl("preview", "extend", "gamma", "--hours", hours)

    assert run.exit_code == 2
    assert run.stderr == f"trnctl: --hours {hours} is outside 1 to 336\n"


def test_a_failed_deletion_is_one_line_and_exit_1(trnctl: Any, clients: Any, stub: Any) -> None:
    cfn = stub(clients("cloudformation"))
    stack = {
        "StackName": "trn-pv-alpha-network",
        "StackId": "arn:aws:cloudformation:us-east-2:123456789012:stack/trn-pv-alpha-network/1",
        "CreationTime": NOW - timedelta(days=2),
        "StackStatus": "CREATE_COMPLETE",
        "Tags": [
            {"Key": TAG_PREVIEW, "Value": "alpha"},
            {"Key": TAG_EXPIRES_AT, "Value": PAST},
        ],
    }
    cfn.add_response("describe_stacks", {"Stacks": [stack]})
    cfn.add_response("delete_stack", {}, {"StackName": stack["StackId"]})
    cfn.add_response("describe_stacks", {"Stacks": [{**stack, "StackStatus": "DELETE_FAILED"}]})

    run = trnctl("preview", "reap", "--yes")

    assert run.exit_code == 1
    assert run.stderr.startswith(
        "trnctl: AWS operation did not finish: Waiter StackDeleteComplete failed:"
    )
    assert "DELETE_FAILED" in run.stderr
    assert run.stderr.count("\n") == 1


# CloudFormation's change sets, which moto 5.2.5 does not model for a tag change: it fails a
# change set that changes only stack tags ("didn't contain changes"), reports no Replacement and
# ignores the tags on execution. What CloudFormation answers is queued on a Stubber instead, which
# checks each call against botocore's model; the stacks themselves stay in moto.
CHANGE_SET_OPERATIONS = (
    "CreateChangeSet",
    "DescribeChangeSet",
    "ExecuteChangeSet",
    "DeleteChangeSet",
)
FIXED_NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
CHANGE_SET_NAME = "trnctl-extend-20261202120000"


def change_set_id(stack: str) -> str:
    return f"arn:aws:cloudformation:us-east-2:123456789012:changeSet/{CHANGE_SET_NAME}/{stack}"


def stack_id(cfn: Any, name: str) -> str:
    return str(cfn.describe_stacks(StackName=name)["Stacks"][0]["StackId"])


def resource_change(logical_id: str, resource_type: str, replacement: str) -> dict[str, Any]:
    return {
        "Type": "Resource",
        "ResourceChange": {
            "Action": "Modify",
            "LogicalResourceId": logical_id,
            "ResourceType": resource_type,
            "Replacement": replacement,
            "Scope": ["Tags"],
        },
    }


def expect_created(stubber: Any, cfn: Any, name: str, tags: dict[str, str]) -> None:
    """CloudFormation makes the stack's tag change set: the template and parameters as they are,
    ``tags`` the stack's whole new tag set."""
    stubber.add_response(
        "create_change_set",
        {"Id": change_set_id(name), "StackId": stack_id(cfn, name)},
        {
            "StackName": name,
            "ChangeSetName": CHANGE_SET_NAME,
            "ChangeSetType": "UPDATE",
            "UsePreviousTemplate": True,
            "Parameters": [],
            "Capabilities": previews.CAPABILITIES,
            "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
            "Description": "trnctl preview extend: the expiry tag only",
        },
    )
    stubber.add_response(
        "describe_change_set",
        {"Status": "CREATE_COMPLETE", "ExecutionStatus": "AVAILABLE"},
        {"ChangeSetName": change_set_id(name)},
    )


def expect_changes(stubber: Any, name: str, changes: list[dict[str, Any]]) -> None:
    stubber.add_response(
        "describe_change_set",
        {"Status": "CREATE_COMPLETE", "Changes": changes},
        {"ChangeSetName": change_set_id(name)},
    )


@pytest.fixture
def gamma(clients: Any, moto: None) -> Any:
    """Two stacks of preview gamma (one still ahead, one expired) and one of beta, in moto."""
    pytest.importorskip("openapi_spec_validator")
    cfn = clients("cloudformation")
    tagged(cfn, "trn-pv-gamma-network", "gamma", "2026-12-03T12:00:00Z", owner="ml")
    tagged(cfn, "trn-pv-gamma-cluster", "gamma", "2026-12-01T12:00:00Z")
    tagged(cfn, "trn-pv-beta-network", "beta", "2026-12-03T12:00:00Z")
    return cfn


def test_extend_executes_a_tag_change_set_per_stack_once_none_would_replace(
    gamma: Any, stub: Any
) -> None:
    changes = stub(gamma, *CHANGE_SET_OPERATIONS)
    network_tags = {"owner": "ml", TAG_PREVIEW: "gamma", TAG_EXPIRES_AT: "2026-12-04T00:00:00Z"}
    cluster_tags = {TAG_PREVIEW: "gamma", TAG_EXPIRES_AT: "2026-12-03T00:00:00Z"}
    expect_created(changes, gamma, "trn-pv-gamma-network", network_tags)
    expect_created(changes, gamma, "trn-pv-gamma-cluster", cluster_tags)
    kept = resource_change("Topic", "AWS::SNS::Topic", "False")
    expect_changes(changes, "trn-pv-gamma-network", [kept])
    expect_changes(changes, "trn-pv-gamma-cluster", [kept])
    for name in ("trn-pv-gamma-network", "trn-pv-gamma-cluster"):
        changes.add_response(
            "execute_change_set",
            {},
            {"ChangeSetName": change_set_id(name), "StackName": name},
        )

    moved = previews.extend(gamma, "gamma", 12, FIXED_NOW)

    changes.assert_no_pending_responses()
    assert [(stack.name, previews.format_expiry(expiry)) for stack, expiry in moved] == [
        ("trn-pv-gamma-network", "2026-12-04T00:00:00Z"),
        ("trn-pv-gamma-cluster", "2026-12-03T00:00:00Z"),
    ]


@pytest.mark.parametrize("replacement", ["True", "Conditional"])
def test_extend_refuses_naming_what_a_change_set_would_replace_and_changes_nothing(
    gamma: Any, stub: Any, trnctl: Any, replacement: str
) -> None:
    """A placement group's Tags are create-only: if CloudFormation replaced it for a stack-tag
    change, every on-demand node in it would be replaced."""
    changes = stub(gamma, *CHANGE_SET_OPERATIONS)
    for name in ("trn-pv-gamma-network", "trn-pv-gamma-cluster"):
        changes.add_response(
            "create_change_set", {"Id": change_set_id(name)}, _any_create(gamma, name)
        )
        changes.add_response(
            "describe_change_set",
            {"Status": "CREATE_COMPLETE"},
            {"ChangeSetName": change_set_id(name)},
        )
    expect_changes(changes, "trn-pv-gamma-network", [])
    placement = resource_change(
        "NeuronTrainiumPlacementGroup1A2B3C4D", "AWS::EC2::PlacementGroup", replacement
    )
    expect_changes(changes, "trn-pv-gamma-cluster", [placement])
    for name in ("trn-pv-gamma-network", "trn-pv-gamma-cluster"):
        changes.add_response("delete_change_set", {}, {"ChangeSetName": change_set_id(name)})

    run = trnctl("preview", "extend", "gamma", "--hours", "12")

    assert run.exit_code == 1
    maybe = "" if replacement == "True" else " (conditionally)"
    assert run.stderr == (
        "trnctl: refused: the tag change would replace trn-pv-gamma-cluster: "
        f"NeuronTrainiumPlacementGroup1A2B3C4D (AWS::EC2::PlacementGroup){maybe}. Nothing was "
        'changed; see docs/deploying.md, "Extending a preview"\n'
    )
    changes.assert_no_pending_responses()
    assert tags_of(gamma, "trn-pv-gamma-cluster")[TAG_EXPIRES_AT] == "2026-12-01T12:00:00Z"


def test_an_empty_change_set_is_deleted_and_the_stack_tags_updated_directly(
    gamma: Any, stub: Any
) -> None:
    """A stack none of whose resources takes tags: CloudFormation fails the change set as
    empty, and only the stack's own tags change."""
    changes = stub(gamma, "CreateChangeSet", "DescribeChangeSet", "DeleteChangeSet")
    for name in ("trn-pv-gamma-network", "trn-pv-gamma-cluster"):
        changes.add_response(
            "create_change_set", {"Id": change_set_id(name)}, _any_create(gamma, name)
        )
        changes.add_response(
            "describe_change_set",
            {
                "Status": "FAILED",
                "StatusReason": "The submitted information didn't contain changes. Submit "
                "different information to create a change set.",
            },
            {"ChangeSetName": change_set_id(name)},
        )
        changes.add_response("delete_change_set", {}, {"ChangeSetName": change_set_id(name)})

    previews.extend(gamma, "gamma", 12, FIXED_NOW)

    changes.assert_no_pending_responses()
    assert tags_of(gamma, "trn-pv-gamma-network")[TAG_EXPIRES_AT] == "2026-12-04T00:00:00Z"
    assert tags_of(gamma, "trn-pv-gamma-cluster")[TAG_EXPIRES_AT] == "2026-12-03T00:00:00Z"
    assert tags_of(gamma, "trn-pv-beta-network")[TAG_EXPIRES_AT] == "2026-12-03T12:00:00Z"


def test_a_change_set_that_fails_otherwise_stops_the_extension(gamma: Any, stub: Any) -> None:
    changes = stub(gamma, *CHANGE_SET_OPERATIONS)
    name = "trn-pv-gamma-network"
    changes.add_response("create_change_set", {"Id": change_set_id(name)}, _any_create(gamma, name))
    changes.add_response(
        "describe_change_set",
        {"Status": "FAILED", "StatusReason": "Requires capabilities : [CAPABILITY_IAM]"},
        {"ChangeSetName": change_set_id(name)},
    )
    changes.add_response("delete_change_set", {}, {"ChangeSetName": change_set_id(name)})

    with pytest.raises(TrnctlError, match=r"trn-pv-gamma-network: change set failed: Requires"):
        previews.extend(gamma, "gamma", 12, FIXED_NOW)

    changes.assert_no_pending_responses()


def _stack(cfn: Any, name: str) -> dict[str, Any]:
    stack: dict[str, Any] = cfn.describe_stacks(StackName=name)["Stacks"][0]
    return stack


def _any_create(cfn: Any, name: str) -> dict[str, Any]:
    return {
        "StackName": name,
        "ChangeSetName": ANY,
        "ChangeSetType": "UPDATE",
        "UsePreviousTemplate": True,
        "Parameters": [],
        "Capabilities": previews.CAPABILITIES,
        "Tags": ANY,
        "Description": "trnctl preview extend: the expiry tag only",
    }
