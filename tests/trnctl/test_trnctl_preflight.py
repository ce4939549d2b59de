"""trnctl preflight: moto answers offerings and instance types, Stubbers the quota and the
capacity reservations (moto implements neither)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from preflight_answers import QUOTA, image_response, quota_response

import trn_catalog
from tests.conftest import sample_outputs
from trnctl import capacity, preflight

pytestmark = pytest.mark.usefixtures("moto")


def reservation(
    reservation_id: str = "cr-0123456789abcdef0",
    *,
    available: int = 2,
    state: str = "active",
    kind: str = "capacity-block",
) -> dict[str, Any]:
    """A reservation as EC2 describes it; a Capacity Block that has not started shows 0
    instances and keeps its size (``available`` here) in a tag."""
    scheduled_block = state == "scheduled" and kind == "capacity-block"
    return {
        "CapacityReservationId": reservation_id,
        "InstanceType": "trn2.48xlarge",
        "AvailabilityZone": "us-east-2a",
        "TotalInstanceCount": 0 if scheduled_block else 4,
        "AvailableInstanceCount": 0 if scheduled_block else available,
        "State": state,
        "ReservationType": kind,
        "StartDate": datetime(2026, 12, 1, 11, 30, tzinfo=UTC),
        "Tags": [{"Key": capacity.REQUESTED_QUANTITY_TAG, "Value": str(available)}]
        if scheduled_block
        else [],
    }


def rows(stdout: str) -> dict[str, str]:
    """Each table line keyed by the check name it starts with."""
    names = (
        "catalog",
        "offered in region",
        "offered in AZ",
        "EC2 knows type",
        "EFA support",
        "EFA interfaces",
        "network cards",
        "On-Demand vCPU quota",
        "capacity reservations",
        "EKS images in region",
    )
    found = {}
    for line in stdout.splitlines():
        cell = line.strip("│┃ ").split("│")[0].strip()
        if cell in names:
            found[cell] = line
    return found


def test_all_checks_pass_with_a_usable_capacity_block(trnctl: Any, aws: Any) -> None:
    quotas, ec2 = aws(reservations=[reservation()])

    run = trnctl(
        "preflight", "--az", "us-east-2a", "--instance-type", "trn2.48xlarge", "--count", "2"
    )

    assert run.exit_code == 0, run.stdout + run.stderr
    table = rows(run.stdout)
    assert set(table) == {
        "catalog",
        "offered in region",
        "offered in AZ",
        "EFA support",
        "EFA interfaces",
        "network cards",
        "On-Demand vCPU quota",
        "capacity reservations",
        "EKS images in region",
    }
    assert all("PASS" in line for line in table.values())
    assert "EC2: 16, catalog: 16" in table["EFA interfaces"]
    assert "2 x 192 = 384 needed" in table["On-Demand vCPU quota"]
    assert "L-2C3B7624 'Running On-Demand Trn instances'" in table["On-Demand vCPU quota"]
    assert (
        "-c capacity=capacity-block -c capacity_reservation_id=cr-0123456789abcdef0"
        in table["capacity reservations"]
    )
    quotas.assert_no_pending_responses()
    ec2.assert_no_pending_responses()


def test_zone_without_the_type_fails_and_names_the_zones_that_offer_it(
    trnctl: Any, clients: Any, stub: Any
) -> None:
    quotas = stub(clients("service-quotas"))
    quotas.add_response("get_service_quota", quota_response(1024), QUOTA)
    ec2 = stub(clients("ec2"), "DescribeCapacityReservations")
    ec2.add_response("describe_capacity_reservations", {"CapacityReservations": []})

    run = trnctl(
        "preflight", "--az", "us-east-2a", "--instance-type", "trn1.32xlarge", "--count", "1"
    )

    assert run.exit_code == 1
    line = rows(run.stdout)["offered in AZ"]
    assert "FAIL" in line
    assert "trn1.32xlarge is not offered in us-east-2a" in line
    # moto's offering data puts trn1.32xlarge in us-east-2c only.
    assert "use one of us-east-2c" in line


def test_quota_below_the_request_fails_with_the_increase_command(trnctl: Any, aws: Any) -> None:
    aws(quota=192)

    run = trnctl(
        "preflight", "--az", "us-east-2a", "--instance-type", "trn2.48xlarge", "--count", "2"
    )

    assert run.exit_code == 1
    line = rows(run.stdout)["On-Demand vCPU quota"]
    assert "FAIL" in line
    assert (
        "aws service-quotas request-service-quota-increase --region us-east-2 "
        "--service-code ec2 --quota-code L-2C3B7624 --desired-value 384"
    ) in line


def test_no_reservation_is_a_warning_that_points_to_capacity_find(trnctl: Any, aws: Any) -> None:
    aws(
        reservations=[
            reservation(available=1),
            reservation("cr-0fedcba9876543210", available=1, state="scheduled"),
        ]
    )

    run = trnctl(
        "preflight", "--az", "us-east-2a", "--instance-type", "trn2.48xlarge", "--count", "2"
    )

    assert run.exit_code == 0
    line = rows(run.stdout)["capacity reservations"]
    assert "WARN" in line
    assert "cr-0123456789abcdef0 capacity-block active 1/4 free" in line
    assert (
        "cr-0fedcba9876543210 capacity-block scheduled: 1 x trn2.48xlarge from 2026-12-01 11:30 UTC"
        in line
    )
    assert "trnctl capacity find --instance-type trn2.48xlarge --count 2 --days 1" in line


def test_a_scheduled_block_large_enough_passes_with_its_deploy_flags(trnctl: Any, aws: Any) -> None:
    """EC2 gives a block that has not started 0 instances; its size is in a tag. A node group
    deployed into it launches its nodes when it starts."""
    aws(reservations=[reservation(available=4, state="scheduled")])

    run = trnctl(
        "preflight", "--az", "us-east-2a", "--instance-type", "trn2.48xlarge", "--count", "2"
    )

    assert run.exit_code == 0, run.stdout + run.stderr
    line = rows(run.stdout)["capacity reservations"]
    assert "PASS" in line
    assert "scheduled: 4 x trn2.48xlarge from 2026-12-01 11:30 UTC" in line
    assert "-c capacity=capacity-block -c capacity_reservation_id=cr-0123456789abcdef0" in line


def scheduled(reservation_id: str, available: int, start: datetime | None) -> dict[str, Any]:
    """A Capacity Block to come, holding ``available`` instances from ``start`` (None: EC2 gave
    no StartDate, which its model allows)."""
    block = reservation(reservation_id, available=available, state="scheduled")
    if start is None:
        del block["StartDate"]
    else:
        block["StartDate"] = start
    return block


SOON, LATER = datetime(2026, 12, 1, 11, 30, tzinfo=UTC), datetime(2026, 12, 8, 11, 30, tzinfo=UTC)
ODCR = "cr-0fedcba9876543210"


@pytest.mark.parametrize(
    ("reservations", "named"),
    [
        # Capacity usable now before a block that starts later.
        (
            [scheduled("cr-0123456789abcdef0", 4, SOON), reservation(ODCR, kind="targeted")],
            f"-c capacity=odcr -c capacity_reservation_id={ODCR}",
        ),
        # Of two blocks to come, the sooner.
        (
            [scheduled("cr-0123456789abcdef0", 4, LATER), scheduled(ODCR, 2, SOON)],
            f"-c capacity=capacity-block -c capacity_reservation_id={ODCR}",
        ),
        # An unknown start is not taken for the sooner.
        (
            [scheduled("cr-0123456789abcdef0", 4, None), scheduled(ODCR, 2, LATER)],
            f"-c capacity=capacity-block -c capacity_reservation_id={ODCR}",
        ),
    ],
)
def test_the_reservation_named_is_the_one_to_use_first(
    trnctl: Any, aws: Any, reservations: list[dict[str, Any]], named: str
) -> None:
    aws(reservations=reservations)

    run = trnctl(
        "preflight", "--az", "us-east-2a", "--instance-type", "trn2.48xlarge", "--count", "2"
    )

    line = rows(run.stdout)["capacity reservations"]
    assert "PASS" in line and named in line


def test_a_block_without_a_start_date_says_so(trnctl: Any, aws: Any) -> None:
    aws(reservations=[scheduled("cr-0123456789abcdef0", 1, None)])

    run = trnctl(
        "preflight", "--az", "us-east-2a", "--instance-type", "trn2.48xlarge", "--count", "2"
    )

    line = rows(run.stdout)["capacity reservations"]
    assert "cr-0123456789abcdef0 capacity-block scheduled: 1 x trn2.48xlarge from ?" in line


def test_quota_falls_back_to_the_aws_default_when_none_is_applied(clients: Any, stub: Any) -> None:
    quotas = stub(clients("service-quotas"))
    quotas.add_client_error("get_service_quota", "NoSuchResourceException", "no applied quota")
    quotas.add_response("get_aws_default_service_quota", quota_response(0), QUOTA)
    request = preflight.Request("us-east-2", "us-east-2a", "trn2.48xlarge", 1)

    check = preflight.check_quota(clients("service-quotas"), request, 192)

    assert check.status is preflight.Status.FAIL
    assert "= 0 vCPUs" in check.detail
    quotas.assert_no_pending_responses()


def test_type_unknown_to_ec2_fails_and_sizes_the_quota_from_the_catalog(
    trnctl: Any, clients: Any, stub: Any
) -> None:
    quotas = stub(clients("service-quotas"))
    quotas.add_response("get_service_quota", quota_response(384), QUOTA)
    ec2 = stub(clients("ec2"), "DescribeCapacityReservations")
    ec2.add_response("describe_capacity_reservations", {"CapacityReservations": []})

    # moto, like an account where the name is wrong, does not know trn3.48xlarge.
    run = trnctl(
        "preflight", "--az", "us-east-2a", "--instance-type", "trn3.48xlarge", "--count", "2"
    )

    assert run.exit_code == 1
    table = rows(run.stdout)
    assert "EC2 in us-east-2 does not know trn3.48xlarge" in table["EC2 knows type"]
    assert "unverified: " in table["catalog"]
    assert "2 x 192 = 384 needed" in table["On-Demand vCPU quota"]
    assert "offered in no zone of us-east-2" in table["offered in AZ"]


def test_a_type_the_region_does_not_offer_fails_with_the_flags_that_deploy_trn2(
    trnctl: Any, clients: Any, stub: Any
) -> None:
    """moto's offerings (EC2's, as moto 5.2.5 bundles them) have trn2.48xlarge in every zone of
    us-east-2 and no trn3 type anywhere: preflight names trn2 and how to deploy it."""
    quotas = stub(clients("service-quotas"))
    quotas.add_response("get_service_quota", quota_response(384), QUOTA)
    ec2 = stub(clients("ec2"), "DescribeCapacityReservations")
    ec2.add_response("describe_capacity_reservations", {"CapacityReservations": []})

    run = trnctl(
        "preflight", "--az", "us-east-2b", "--instance-type", "trn3.48xlarge", "--count", "2"
    )

    assert run.exit_code == 1
    assert "FAIL" in rows(run.stdout)["offered in region"]
    check = preflight.check_region_offering(
        clients("ec2"), preflight.Request("us-east-2", "us-east-2b", "trn3.48xlarge", 2)
    )
    assert check.detail == (
        "EC2 offers no trn3.48xlarge in us-east-2 (the catalog marks the name unverified)"
    )
    assert check.fix == (
        "deploy trn2.48xlarge instead (offered in us-east-2a, us-east-2b, us-east-2c): npx cdk "
        "deploy --all -c region=us-east-2 -c availability_zone=us-east-2b "
        "-c instance_type=trn2.48xlarge (with your other -c settings); check it first: trnctl "
        "preflight --region us-east-2 --az us-east-2b --instance-type trn2.48xlarge --count 2"
    )


def test_the_region_offering_is_asked_by_location_type_region(clients: Any) -> None:
    ec2 = clients("ec2")
    request = preflight.Request("us-east-2", "us-east-2a", "trn2.48xlarge", 1)

    check = preflight.check_region_offering(ec2, request)

    assert check.status is preflight.Status.PASS
    assert check.detail == "trn2.48xlarge is offered in us-east-2"
    ireland = preflight.Request("eu-west-1", "eu-west-1a", "trn2.48xlarge", 1)
    elsewhere = preflight.check_region_offering(clients("ec2", "eu-west-1"), ireland)
    assert elsewhere.status is preflight.Status.FAIL
    assert "no type of the instance catalog is offered in eu-west-1" in elsewhere.fix


def test_type_missing_from_the_catalog_fails_the_catalog_check() -> None:
    check, spec = preflight.check_catalog("trn3p.48xlarge")

    assert spec is None
    assert check.status is preflight.Status.FAIL
    assert "'trn3p.48xlarge' is not in the instance catalog" in check.detail
    assert "trn_catalog/instances.py" in check.fix


@pytest.mark.parametrize(
    ("network", "failing"),
    [
        (
            {
                "EfaSupported": True,
                "EfaInfo": {"MaximumEfaInterfaces": 8},
                "MaximumNetworkCards": 16,
            },
            {"EFA interfaces"},
        ),
        (
            {
                "EfaSupported": True,
                "EfaInfo": {"MaximumEfaInterfaces": 16},
                "MaximumNetworkCards": 8,
            },
            {"network cards"},
        ),
        ({"EfaSupported": False, "MaximumNetworkCards": 16}, {"EFA support", "EFA interfaces"}),
    ],
)
def test_network_layout_differing_from_the_catalog_fails(
    network: dict[str, Any], failing: set[str]
) -> None:
    request = preflight.Request("us-east-2", "us-east-2a", "trn2.48xlarge", 2)
    described = {"InstanceType": "trn2.48xlarge", "NetworkInfo": network}

    checks = preflight.check_network(described, trn_catalog.get("trn2.48xlarge"), request)

    assert {c.name for c in checks if c.status is preflight.Status.FAIL} == failing
    for check in checks:
        if check.name == "EFA interfaces" and check.status is preflight.Status.FAIL:
            assert "set efa_interfaces=" in check.fix
            assert "for trn2.48xlarge in trn_catalog/instances.py" in check.fix


def test_zone_outside_the_region_is_a_usage_error(trnctl: Any) -> None:
    run = trnctl(
        "preflight",
        "--region",
        "us-east-2",
        "--az",
        "us-west-2a",
        "--instance-type",
        "trn2.48xlarge",
        "--count",
        "1",
    )

    assert run.exit_code == 2
    assert run.stderr == (
        "trnctl: --az 'us-west-2a' is not an availability zone of region 'us-east-2' "
        "(expected a name such as us-east-2a)\n"
    )


def test_access_denied_on_quotas_is_one_line_and_exit_3(
    trnctl: Any, clients: Any, stub: Any
) -> None:
    quotas = stub(clients("service-quotas"))
    quotas.add_client_error(
        "get_service_quota", "AccessDeniedException", "User is not authorized", 400
    )

    run = trnctl(
        "preflight", "--az", "us-east-2a", "--instance-type", "trn2.48xlarge", "--count", "1"
    )

    assert run.exit_code == 3
    assert run.stdout == ""
    assert run.stderr.startswith(
        "trnctl: access denied calling GetServiceQuota (AccessDeniedException): "
        "User is not authorized;"
    )
    assert run.stderr.count("\n") == 1


def test_throttling_is_one_line_and_exit_3(trnctl: Any, clients: Any, stub: Any) -> None:
    quotas = stub(clients("service-quotas"))
    quotas.add_response("get_service_quota", quota_response(384), QUOTA)
    ec2 = stub(clients("ec2"), "DescribeCapacityReservations")
    ec2.add_client_error(
        "describe_capacity_reservations", "RequestLimitExceeded", "Rate exceeded", 503
    )

    run = trnctl(
        "preflight", "--az", "us-east-2a", "--instance-type", "trn2.48xlarge", "--count", "1"
    )

    assert run.exit_code == 3
    assert run.stderr == (
        "trnctl: AWS throttled DescribeCapacityReservations (RequestLimitExceeded) and adaptive "
        "retries gave up: wait a minute and run the command again\n"
    )


@pytest.mark.parametrize(
    ("deployed", "status", "said"),
    [
        ("us-east-2a", preflight.Status.PASS, "trn-dev runs its trn nodes in us-east-2a"),
        (
            "us-east-2b",
            preflight.Status.FAIL,
            "trn-dev runs its trn nodes in us-east-2b; us-east-2a would move them",
        ),
        ("", preflight.Status.WARN, "the outputs of trn-dev predate the zone key"),
    ],
)
def test_the_trn_zone_of_a_deployed_environment_does_not_move(
    deployed: str, status: preflight.Status, said: str
) -> None:
    request = preflight.Request("us-east-2", "us-east-2a", "trn2.48xlarge", 2)

    check = preflight.check_zone(sample_outputs(availability_zone=deployed), request)

    assert (check.name, check.status) == ("trn zone", status)
    assert check.detail.startswith(said)
    if status is preflight.Status.FAIL:
        assert check.fix == (
            "deploy a new environment in us-east-2a (a preview: -c preview=<project> "
            "-c availability_zone=us-east-2a; or destroy trn-dev and deploy it again there), "
            "move its data (docs/deploying.md, Moving the trn zone), then destroy the old one"
        )


def test_the_eks_images_pulled_from_the_region_are_there(clients: Any, stub: Any) -> None:
    images = stub(clients("ecr"), "BatchGetImage")
    for image in preflight.EKS_IMAGES:
        images.add_response(
            "batch_get_image",
            image_response("877085696533", image.repository, image.tag),
            {
                "registryId": "877085696533",
                "repositoryName": image.repository,
                "imageIds": [{"imageTag": image.tag}],
            },
        )

    check = preflight.check_eks_images(clients("ecr"), "af-south-1")

    assert check.status is preflight.Status.PASS
    assert check.detail == (
        "877085696533.dkr.ecr.af-south-1.amazonaws.com has "
        "eks/aws-efa-k8s-device-plugin:v0.5.20, eks/dranet:v1.2.0-eksbuild.2"
    )
    images.assert_no_pending_responses()


def test_an_image_the_regions_registry_lacks_fails(clients: Any, stub: Any) -> None:
    """moto has no EKS registry: the repository is not found there. A tag ECR does not find is
    a failure in its answer."""
    images = stub(clients("ecr", "eu-west-1"), "BatchGetImage")
    images.add_response(
        "batch_get_image",
        {"images": [], "failures": [{"failureCode": "ImageNotFound"}]},
    )
    images.add_client_error("batch_get_image", "AccessDeniedException", "no")

    lacking = preflight.check_eks_images(clients("ecr"), "us-east-2")
    partly = preflight.check_eks_images(clients("ecr", "eu-west-1"), "eu-west-1")

    assert lacking.status is preflight.Status.FAIL
    assert lacking.detail.startswith(
        "602401143452.dkr.ecr.us-east-2.amazonaws.com lacks "
        "eks/aws-efa-k8s-device-plugin:v0.5.20 (RepositoryNotFoundException)"
    )
    assert partly.status is preflight.Status.FAIL
    assert "eks/aws-efa-k8s-device-plugin:v0.5.20 (ImageNotFound)" in partly.detail


def test_a_registry_this_identity_may_not_read_warns(clients: Any, stub: Any) -> None:
    images = stub(clients("ecr"), "BatchGetImage")
    images.add_client_error("batch_get_image", "AccessDeniedException", "no")
    images.add_client_error("batch_get_image", "AccessDeniedException", "no")

    check = preflight.check_eks_images(clients("ecr"), "us-east-2")

    assert check.status is preflight.Status.WARN
    assert "eks/dranet:v1.2.0-eksbuild.2 (AccessDeniedException)" in check.detail
    assert "ecr:BatchGetImage" in check.fix
