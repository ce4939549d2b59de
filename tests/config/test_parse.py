from datetime import UTC, datetime
from typing import Any

import pytest

from platform_config import PROFILES, ConfigError, parse_config
from platform_config.parse import CONTEXT_KEYS

BASE = {"account": "210987654321", "region": "us-east-2", "availability_zone": "us-east-2b"}
RESERVATION = "cr-0123456789abcdef0"


def parse(**overrides: Any) -> Any:
    return parse_config({**BASE, **overrides})


def test_no_context_gives_the_offline_defaults() -> None:
    config = parse_config({})
    assert (config.account, config.region, config.availability_zone) == (
        "123456789012",
        "us-east-2",
        "us-east-2a",
    )
    assert config.env == "dev" and config.name == "trn-dev"
    assert config.trn.instance_type == "trn3.48xlarge"
    assert config.trn.nodes == 2 and config.trn.capacity == "on-demand"
    assert config.trn.capacity_reservation_id is None
    assert (config.fsx.storage_gib, config.fsx.throughput_per_tib, config.fsx.efa) == (
        1200,
        125,
        False,
    )
    assert config.preview is None and config.ttl_hours is None and config.admin_role_arn is None


def test_cli_strings_are_converted() -> None:
    config = parse(
        trn_nodes="4",
        fsx_storage_gib="9600",
        fsx_throughput_per_tib="500",
        efa_fsx="true",
        capacity="odcr",
        capacity_reservation_id=RESERVATION,
        instance_type="trn3.48xlarge",
        admin_role_arn="arn:aws:iam::210987654321:role/PlatformAdmin",
    )
    assert config.trn.nodes == 4 and config.trn.spec.efa_interfaces == 16
    assert config.fsx.storage_gib == 9600 and config.fsx.throughput_per_tib == 500
    assert config.fsx.efa is True
    assert config.trn.capacity_reservation_id == RESERVATION
    assert config.admin_role_arn == "arn:aws:iam::210987654321:role/PlatformAdmin"


def test_json_values_from_cdk_json_are_accepted() -> None:
    config = parse(trn_nodes=0, fsx_throughput_per_tib=1000, efa_fsx=False)
    assert config.trn.nodes == 0 and config.fsx.throughput_per_tib == 1000


def test_prod_profile_retains_and_protects() -> None:
    config = parse(env="prod")
    assert config.profile is PROFILES["prod"] and config.name == "trn-prod"
    assert config.profile.retain_data and config.profile.termination_protection
    assert config.fsx.storage_gib == 4800 and config.profile.nat_gateways == 3


def test_preview_expires_ttl_hours_after_now() -> None:
    now = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
    config = parse_config({"preview": "nlp", "ttl_hours": "12"}, now=now)
    assert config.expires_at == datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    assert parse_config({}, now=now).expires_at is None
    assert parse_config({"preview": "nlp", "budget_email": "ml@example.com"}).budget_email == (
        "ml@example.com"
    )


def test_preview_profile() -> None:
    config = parse(preview="team-nlp", ttl_hours="12")
    assert config.env == "preview" and config.name == "trn-pv-team-nlp"
    assert config.ttl_hours == 12 and not config.profile.retain_data
    assert parse(preview="team-nlp").ttl_hours == 48


def test_every_environment_has_a_budget_its_profiles_by_default() -> None:
    assert parse(preview="team-nlp").budget_usd == 500
    assert parse(preview="team-nlp", budget_usd="2500").budget_usd == 2500
    assert parse().budget_usd == 10_000
    assert parse(env="prod").budget_usd == 50_000
    assert parse(env="prod", budget_usd="80000").budget_usd == 80_000
    assert parse(budget_email="ml@example.com").budget_email == "ml@example.com"


def test_the_project_tag_is_the_context_keys() -> None:
    assert parse(project="nlp-team").project == "nlp-team"
    assert parse().project is None
    assert parse(preview="alpha").project is None  # a preview is tagged with its name already


BAD_INPUT = [
    ({"instance_type": "trn9.1xlarge"}, r"instance_type: 'trn9\.1xlarge' .*trn3\.48xlarge"),
    ({"instance_type": "p5.48xlarge"}, r"instance_type: 'p5\.48xlarge' .*instance catalog"),
    ({"availability_zone": "us-west-2a"}, r"availability_zone: 'us-west-2a' .*region 'us-east-2'"),
    ({"availability_zone": "use2-az1"}, r"availability_zone: 'use2-az1' .*such as us-east-2a"),
    ({"region": "us-west-2"}, r"availability_zone: 'us-east-2b' .*region 'us-west-2'"),
    ({"region": "ohio"}, r"region: 'ohio' is not allowed; expected a region name"),
    ({"account": "12345"}, r"account: '12345' .*12-digit AWS account id"),
    ({"capacity": "spot"}, r"capacity: 'spot' .*on-demand, capacity-block, odcr"),
    ({"capacity": "capacity-block"}, r"capacity_reservation_id: missing; .*'capacity-block' needs"),
    ({"capacity": "odcr"}, r"capacity_reservation_id: missing; capacity 'odcr' needs"),
    (
        {"capacity": "odcr", "capacity_reservation_id": "cr-123"},
        r"capacity_reservation_id: 'cr-123' .*'cr-' and 17 hexadecimal digits",
    ),
    (
        {"capacity_reservation_id": RESERVATION},
        r"capacity_reservation_id: .*only used with capacity 'capacity-block' or 'odcr'",
    ),
    ({"trn_nodes": "65"}, r"trn_nodes: '65' .*whole number from 0 to 64"),
    ({"trn_nodes": "-1"}, r"trn_nodes: '-1' .*whole number from 0 to 64"),
    ({"trn_nodes": "two"}, r"trn_nodes: 'two' .*whole number"),
    ({"trn_nodes": True}, r"trn_nodes: True .*whole number"),
    ({"fsx_storage_gib": "3000"}, r"fsx_storage_gib: 3000 .*1200 GiB or a multiple of 2400"),
    ({"fsx_storage_gib": "0"}, r"fsx_storage_gib: '0' .*whole number from 1"),
    ({"fsx_throughput_per_tib": "200"}, r"fsx_throughput_per_tib: 200 .*125, 250, 500, 1000"),
    ({"efa_fsx": "maybe"}, r"efa_fsx: 'maybe' .*true or false"),
    (
        {"efa_fsx": "true", "fsx_storage_gib": "4800", "fsx_throughput_per_tib": "500"},
        r"fsx_storage_gib: 4800 .*with efa_fsx, .*500 MB/s per TiB is a multiple of 9600 GiB",
    ),
    (
        {"efa_fsx": "true", "fsx_storage_gib": "38400", "instance_type": "trn2.48xlarge"},
        r"efa_fsx: True .*serves no EFA to the trn2 family; instance_type is trn2.48xlarge",
    ),
    ({"env": "staging"}, r"env: 'staging' .*one of: dev, prod"),
    ({"preview": "Team_NLP"}, r"preview: 'Team_NLP' .*DNS-safe project name"),
    ({"preview": "nlp-"}, r"preview: 'nlp-' .*not ending with '-'"),
    ({"preview": "a" * 21}, r"preview: 'a{21}' .*at most 20 characters"),
    ({"preview": "nlp", "env": "prod"}, r"env: 'prod' .*a preview is its own environment"),
    ({"ttl_hours": "24"}, r"ttl_hours: '24' .*only used with preview=<project>"),
    ({"preview": "nlp", "ttl_hours": "0"}, r"ttl_hours: '0' .*whole number from 1 to 336"),
    ({"admin_role_arn": "PlatformAdmin"}, r"admin_role_arn: 'PlatformAdmin' .*IAM role ARN"),
    (
        {"admin_role_arn": "arn:aws:iam::210987654321:user/alice"},
        r"admin_role_arn: .*:user/alice' .*IAM role ARN",
    ),
    ({"preview": "nlp", "budget_email": "ml"}, r"budget_email: 'ml' .*email address"),
    ({"budget_usd": "0"}, r"budget_usd: '0' .*whole number from 1 to 1000000"),
    ({"project": "NLP Team"}, r"project: 'NLP Team' .*expected"),
    ({"preview": "nlp", "budget_usd": "0"}, r"budget_usd: '0' .*whole number from 1 to 1000000"),
    ({"preview": "nlp", "budget_usd": "lots"}, r"budget_usd: 'lots' .*whole number"),
    (
        {"preview": "nlp", "region": "ap-south-2", "availability_zone": "ap-south-2a"},
        r"region: 'ap-south-2' .*preview's budget needs CloudFormation's AWS::Budgets::Budget",
    ),
    (
        {"region": "mx-central-1", "availability_zone": "mx-central-1a"},
        r"region: 'mx-central-1' .*EFA device plugin and aws-dranet images come from the "
        r"region's EKS registry, and the catalog lists none for it",
    ),
    ({"instance-type": "trn2.48xlarge"}, r"instance-type: unknown context key; .*'instance_type'"),
    ({"TRN_NODES": "2"}, r"TRN_NODES: unknown context key; did you mean 'trn_nodes'"),
    # A typo would otherwise synthesize the default type and exit 0.
    (
        {"instance_typ": "trn2.48xlarge"},
        r"instance_typ: unknown context key; did you mean 'instance_type'",
    ),
    ({"avaliability_zone": "us-east-2b"}, r"did you mean 'availability_zone'"),
    ({"colour": "blue"}, r"colour: unknown context key; the app reads account, region, "),
    # The GPU node group's keys.
    (
        {"gpu_instance_type": "p4d.24xlarge"},
        r"gpu_instance_type: 'p4d\.24xlarge' is not allowed; .*GPU instance catalog: "
        r"p5\.48xlarge",
    ),
    (
        {"gpu_instance_type": "trn2.48xlarge"},
        r"gpu_instance_type: 'trn2\.48xlarge' .*GPU instance catalog",
    ),
    (
        {"gpu_instance_type": "p5.48xlarge", "gpu_nodes": "65"},
        r"gpu_nodes: '65' is not allowed; expected a whole number from 0 to 64",
    ),
    (
        {"gpu_instance_type": "p5.48xlarge", "gpu_nodes": "-1"},
        r"gpu_nodes: '-1' .*whole number from 0 to 64",
    ),
    (
        {"gpu_instance_type": "p5.48xlarge", "gpu_nodes": "one"},
        r"gpu_nodes: 'one' .*whole number",
    ),
    (
        {"gpu_instance_type": "p5.48xlarge", "gpu_capacity": "spot"},
        r"gpu_capacity: 'spot' is not allowed; expected one of: on-demand, capacity-block, odcr",
    ),
    (
        {"gpu_instance_type": "p5.48xlarge", "gpu_capacity": "capacity-block"},
        r"gpu_capacity_reservation_id: missing; gpu_capacity 'capacity-block' needs the id",
    ),
    (
        {"gpu_instance_type": "p5.48xlarge", "gpu_capacity": "odcr"},
        r"gpu_capacity_reservation_id: missing; gpu_capacity 'odcr' needs the id",
    ),
    (
        {
            "gpu_instance_type": "p5.48xlarge",
            "gpu_capacity": "odcr",
            "gpu_capacity_reservation_id": "cr-12",
        },
        r"gpu_capacity_reservation_id: 'cr-12' .*'cr-' and 17 hexadecimal digits",
    ),
    (
        {"gpu_instance_type": "p5.48xlarge", "gpu_capacity_reservation_id": RESERVATION},
        r"gpu_capacity_reservation_id: .*only used with gpu_capacity 'capacity-block' or "
        r"'odcr'; gpu_capacity is 'on-demand'",
    ),
    ({"gpu_nodes": "2"}, r"gpu_nodes: '2' is not allowed; only used with gpu_instance_type"),
    ({"gpu_capacity": "odcr"}, r"gpu_capacity: 'odcr' .*only used with gpu_instance_type"),
    (
        {"gpu_capacity_reservation_id": RESERVATION},
        r"gpu_capacity_reservation_id: .*only used with gpu_instance_type",
    ),
    ({"gpu-instance-type": "p5.48xlarge"}, r"did you mean 'gpu_instance_type'"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_INPUT, ids=[m for _, m in BAD_INPUT])
def test_bad_input_is_rejected_with_key_value_and_rule(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(**overrides)


# Context CDK itself puts in every app's context: cdk.json's feature flags, the keys the CLI passes
# to the app (aws-cdk 2.1148.1, `settings.ts`), the lookups it caches in cdk.context.json, and the
# plain keys of its own commands (`cdk acknowledge`, `cdk cli-telemetry`, `cdk migrate`).
CDK_CONTEXT = {
    "@aws-cdk/core:checkSecretUsage": True,
    "@aws-cdk/core.slowSynthThreshold": 10,
    "@aws-cdk/aws-iam.arnSizeEstimate": 100,
    "aws:cdk:enable-path-metadata": True,
    "aws:cdk:enable-asset-metadata": True,
    "aws:cdk:version-reporting": True,
    "aws:cdk:bundling-stacks": ["**"],
    "aws-cdk:enableDiffNoFail": True,
    "availability-zones:account=210987654321:region=us-east-2": ["us-east-2a", "us-east-2b"],
    "acknowledged-issue-numbers": [32775],
    "cli-telemetry": False,
    "cdk-migrate": True,
    "assets-ecr-repository-name": "assets",
}


def test_cdk_own_context_keys_are_not_ours_to_refuse() -> None:
    assert parse(**CDK_CONTEXT).trn.instance_type == "trn3.48xlarge"


def test_an_unknown_key_is_reported_with_the_other_problems() -> None:
    with pytest.raises(ConfigError) as caught:
        parse(instance_typ="trn2.48xlarge", trn_nodes="99")
    assert [p.split(":")[0] for p in caught.value.problems] == ["instance_typ", "trn_nodes"]


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        parse(instance_type="trn9.1xlarge", trn_nodes="99", capacity="spot", efa_fsx="maybe")
    keys = [problem.split(":")[0] for problem in caught.value.problems]
    assert keys == ["instance_type", "trn_nodes", "capacity", "efa_fsx"]


def test_context_keys_are_the_documented_names() -> None:
    assert CONTEXT_KEYS == (
        "account",
        "region",
        "availability_zone",
        "instance_type",
        "trn_nodes",
        "capacity",
        "capacity_reservation_id",
        "env",
        "preview",
        "ttl_hours",
        "fsx_storage_gib",
        "fsx_throughput_per_tib",
        "efa_fsx",
        "admin_role_arn",
        "budget_email",
        "budget_usd",
        "project",
        "gpu_instance_type",
        "gpu_nodes",
        "gpu_capacity",
        "gpu_capacity_reservation_id",
        "devices",
        "lnc",
        "ultraserver_reservation_ids",
        "model_registry",
    )


def test_no_gpu_node_group_by_default() -> None:
    assert parse().gpu is None


@pytest.mark.parametrize("gpu_type", ["p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge"])
def test_a_gpu_type_gives_one_on_demand_node_by_default(gpu_type: str) -> None:
    config = parse(gpu_instance_type=gpu_type)
    assert config.gpu is not None
    assert (config.gpu.instance_type, config.gpu.nodes, config.gpu.capacity) == (
        gpu_type,
        1,
        "on-demand",
    )
    assert config.gpu.capacity_reservation_id is None and config.gpu.spec.gpus == 8


def test_gpu_keys_from_the_cli_and_cdk_json() -> None:
    block = parse(
        gpu_instance_type="g6e.48xlarge",
        gpu_nodes="4",
        gpu_capacity="capacity-block",
        gpu_capacity_reservation_id=RESERVATION,
    )
    assert block.gpu is not None and block.gpu.nodes == 4
    assert (block.gpu.capacity, block.gpu.capacity_reservation_id) == (
        "capacity-block",
        RESERVATION,
    )
    assert block.trn.capacity == "on-demand" and block.trn.capacity_reservation_id is None
    none = parse(gpu_instance_type="p5.48xlarge", gpu_nodes=0)
    assert none.gpu is not None and none.gpu.nodes == 0


def test_cdk_feature_flags_are_not_mistaken_for_misspellings() -> None:
    config = parse(**{"@aws-cdk/core:checkSecretUsage": True, "availability-zones:x": ["a"]})
    assert config.env == "dev"
