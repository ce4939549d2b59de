"""constructs_lib as a library: the wheels, installed into another app, and stable ids."""

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, Synth
from tests.template_parts import scaling

OTHER_APP = """
import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks

import constructs_lib
from constructs_lib import TrainingNetwork, TrainiumNodeGroup

assert "site" in constructs_lib.__file__, constructs_lib.__file__
app = cdk.App()
stack = cdk.Stack(app, "TheirApp", env=cdk.Environment(account="210987654321", region="us-west-2"))
vpc = ec2.Vpc(stack, "TheirVpc", availability_zones=["us-west-2a", "us-west-2b"], nat_gateways=1)
network = TrainingNetwork(stack, "Training", trn_availability_zone="us-west-2b", vpc=vpc)
cluster = eks.Cluster.from_cluster_attributes(
    stack, "TheirCluster", cluster_name="research", vpc=network.vpc,
    cluster_security_group_id="sg-0123456789abcdef0",
)
TrainiumNodeGroup(
    stack, "Trn2", cluster=cluster, subnet=network.trn_subnet, instance_type="trn2.48xlarge",
    desired_size=4, capacity="capacity-block", capacity_reservation_id="cr-0123456789abcdef0",
)
app.synth()
"""
# What each distribution may put at the top of site-packages: names of ours alone.
LIBRARY_TOP_LEVEL = {"constructs_lib", "trn_catalog"}
OPS_TOP_LEVEL = {"trnctl", "trainer"}


# For pip and the build backends: no bytecode, which :func:`_tree_state` would not see.
NO_BYTECODE = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}


def _pip(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
        check=True,
        capture_output=True,
        env=NO_BYTECODE,
    )


def _tree_state() -> list[str]:
    """Every changed, untracked and ignored path of the checkout but bytecode caches: where
    the environment lets Python write them (pytest run outside `make test`), the other worker
    writes them as it imports, and the determinism test in tests/security/test_gate.py puts
    stray ones beside the sources for a moment."""
    listed = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    return [line for line in listed if "__pycache__/" not in line and not line.endswith(".pyc")]


# The wheels are built and installed once per worker that runs a test of this module: all of it
# runs on one worker, first (tests/scheduling.py), as the builds and synths take ~40 s of CPU.
pytestmark = [pytest.mark.xdist_group("library-wheels"), pytest.mark.slow]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The library's and the ops tools' wheels, built from the checkout (no download: the build
    backend is a dev requirement) and checked to write nothing into it."""
    out = tmp_path_factory.mktemp("wheels")
    before = _tree_state()
    for project in (ROOT, ROOT / "ops"):
        _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(project))
    assert _tree_state() == before, "building a wheel wrote into the checkout"
    (library,) = out.glob("trn_platform-*.whl")
    (ops,) = out.glob("trn_platform_ops-*.whl")
    return {"library": library, "ops": ops}


def _install(wheel: Path, target: Path) -> Path:
    """``wheel`` installed, without dependencies, into a bare folder (its scripts in bin/)."""
    _pip("install", "--no-deps", "--target", str(target), str(wheel))
    return target


@pytest.fixture(scope="module")
def installed(wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("library")
    _install(wheels["library"], work / "site")
    return work


def _top_level(site: Path) -> set[str]:
    return {
        p.name
        for p in site.iterdir()
        if not p.name.endswith(".dist-info") and p.name not in {"bin", "__pycache__"}
    }


def _console_scripts(site: Path) -> list[str]:
    (info,) = site.glob("*.dist-info")
    entry_points = info / "entry_points.txt"
    if not entry_points.exists():
        return []
    lines = entry_points.read_text().split("[console_scripts]", 1)[-1].splitlines()
    return [line.split("=")[0].strip() for line in lines if "=" in line]


def test_the_library_installs_only_its_own_names_and_no_command(installed: Path) -> None:
    site = installed / "site"
    assert _top_level(site) == LIBRARY_TOP_LEVEL
    assert _console_scripts(site) == []
    assert not (site / "bin").exists()


def test_the_library_needs_only_aws_cdk_lib_and_constructs(installed: Path) -> None:
    (info,) = (installed / "site").glob("*.dist-info")
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in (info / "METADATA").read_text().splitlines()
        if line.startswith("Requires-Dist: ")
    ]
    always = sorted(r.split("<")[0].split(">")[0] for r in requires if "extra ==" not in r)
    assert always == ["aws-cdk-lib", "constructs"]
    assert any(r.startswith("cdk-ecr-deployment") and "extra == 'image'" in r for r in requires)


def test_every_command_of_the_ops_wheel_runs(
    wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    site = _install(wheels["ops"], tmp_path_factory.mktemp("ops") / "site")
    assert _top_level(site) == OPS_TOP_LEVEL
    scripts = _console_scripts(site)
    assert sorted(scripts) == ["trn-train", "trnctl"]
    env = {**os.environ, "PYTHONPATH": str(site)}
    for script in scripts:
        result = subprocess.run(
            [str(site / "bin" / script), "--help"], env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, (script, result.stderr[-2000:])
        assert "usage" in result.stdout.lower(), script


def test_prepare_data_from_the_ops_wheel_finds_its_shipped_corpus(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    site = _install(wheels["ops"], tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = tmp_path / "data"
    result = subprocess.run(
        [str(site / "bin" / "trn-train"), "prepare-data", "--out", str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"] == "bytes-v1" and manifest["shards"]


def _requirements(wheel: Path) -> set[str]:
    """Distribution names the wheel requires, with or without an extra."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = archive.read(name).decode()
    return {
        re.split(r"[<>=!~;\[ ]", line.removeprefix("Requires-Dist: "), maxsplit=1)[0].lower()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist: ")
    }


def _imported_top_levels(wheel: Path) -> set[str]:
    """Top-level modules that the wheel's Python files import, at module level or inside
    functions alike."""
    found: set[str] = set()
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if not name.endswith(".py"):
                continue
            for node in ast.walk(ast.parse(archive.read(name))):
                if isinstance(node, ast.Import):
                    found |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.add(node.module.split(".")[0])
    return found


def test_the_ops_wheel_declares_every_distribution_it_imports(wheels: dict[str, Path]) -> None:
    """Every third-party module trnctl or the trainer imports comes from a distribution that
    the ops wheel requires (always or through an extra)."""
    declared = _requirements(wheels["ops"])
    providers = importlib.metadata.packages_distributions()
    ours = OPS_TOP_LEVEL | LIBRARY_TOP_LEVEL
    missing = {}
    for module in _imported_top_levels(wheels["ops"]) - ours - set(sys.stdlib_module_names):
        dists = {d.lower() for d in providers.get(module, [module])}
        if not dists & declared:
            missing[module] = sorted(dists)
    assert missing == {}


def test_the_ops_wheel_builds_from_its_sdist_alone(wheels: dict[str, Path], tmp_path: Path) -> None:
    before = _tree_state()
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d", str(tmp_path / "sdist")],
        cwd=ROOT / "ops",
        check=True,
        capture_output=True,
        env=NO_BYTECODE,
    )
    assert _tree_state() == before, "building the sdist wrote into the checkout"
    (sdist,) = (tmp_path / "sdist").glob("trn_platform_ops-*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "w"), str(unpacked))
    (rebuilt,) = (tmp_path / "w").glob("trn_platform_ops-*.whl")
    with zipfile.ZipFile(rebuilt) as again, zipfile.ZipFile(wheels["ops"]) as first:
        assert sorted(again.namelist()) == sorted(first.namelist())


def test_the_set_up_environment_runs_the_checkout_not_copies() -> None:
    """make setup's editable installs put the checkout on sys.path: no copy of trnctl or the
    trainer in site-packages that would go stale as the tree changes."""
    code = "import trainer, trnctl; print(trainer.__file__); print(trnctl.__file__)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd="/", capture_output=True, text=True, check=True
    )
    for path in result.stdout.split():
        assert Path(path).is_relative_to(ROOT), path


# Where the library, the ops tools and the platform app import from (the sources the wheels
# and the app are built from), against each folder that is their import root.
PROJECT_SOURCES = {
    ROOT: ["app.py", "constructs_lib", "trn_catalog", "stacks", "platform_config", "trnctl"],
    ROOT / "training_image": ["trainer", "entrypoint.py"],
}
# Modules the library wheel ships that no code of the project imports, and why each ships.
# Anything else that only the tests read stays out of the wheel (the charts' value keys live in
# tests/conformance/chart_values.py).
SHIPPED_NOT_IMPORTED = {
    # The preview reaper's Lambda code: PreviewLifecycle bundles the file as an asset.
    "constructs_lib.preview_reaper.handler",
    # The Neuron releases the image's stages install: catalog facts (versions, host driver)
    # that the Dockerfile's pins follow, checked by tests/trainer/test_image.py.
    "trn_catalog.neuron_releases",
}


def _module(relative: Path) -> str:
    """The dotted module name of a source file's path from its import root."""
    parts = relative.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(source: Path, root: Path) -> set[str]:
    """The modules ``source`` imports, absolute and relative alike, with each ``from X import
    name`` also as ``X.name`` (where name may be a module)."""
    module = _module(source.relative_to(root))
    package = module if source.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = (
                package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            )
            name = ".".join([*base, *([node.module] if node.module else [])])
            found |= {name, *(f"{name}.{alias.name}" for alias in node.names)}
    return found


def imported_by_the_project() -> set[str]:
    """Every module the library, the ops tools or the platform app imports."""
    found: set[str] = set()
    for root, entries in PROJECT_SOURCES.items():
        for entry in entries:
            path = root / entry
            for source in [path] if path.is_file() else path.rglob("*.py"):
                found |= _imports(source, root)
    return found


def test_the_library_wheel_ships_no_module_only_the_tests_read(wheels: dict[str, Path]) -> None:
    with zipfile.ZipFile(wheels["library"]) as archive:
        shipped = {_module(Path(n)) for n in archive.namelist() if n.endswith(".py")}
    assert "trn_catalog.versions" in shipped
    assert shipped - imported_by_the_project() == SHIPPED_NOT_IMPORTED


def test_wheel_carries_types_and_the_reaper(installed: Path) -> None:
    site = installed / "site"
    assert (site / "constructs_lib" / "py.typed").exists()
    assert (site / "trn_catalog" / "py.typed").exists()
    assert (site / "constructs_lib" / "preview_reaper" / "handler.py").exists()
    assert (site / "trn_catalog" / "crds" / "trainer.kubeflow.org-v1alpha1.json").exists()


def test_another_app_composes_the_installed_constructs(apps_synthesized: dict[str, Path]) -> None:
    out = _synthesized(apps_synthesized, OTHER_APP_NAME)
    template = json.loads((out / "TheirApp.template.json").read_text())
    groups = [r for r in template["Resources"].values() if r["Type"] == "AWS::EKS::Nodegroup"]
    (group,) = groups
    assert group["Properties"]["CapacityType"] == "CAPACITY_BLOCK"
    # Created empty, sized once active.
    assert group["Properties"]["ScalingConfig"] == {"MinSize": 0, "MaxSize": 64, "DesiredSize": 0}
    assert scaling(template)["desiredSize"] == 4
    vpcs = [r for r in template["Resources"].values() if r["Type"] == "AWS::EC2::VPC"]
    assert len(vpcs) == 1  # theirs; the construct created none


WITHOUT_OPTIONAL = """
import sys
# As if cdk-ecr-deployment, cdk-nag and the kubectl layer were not installed.
for name in ("cdk_ecr_deployment", "cdk_nag", "aws_cdk.lambda_layer_kubectl_v35"):
    sys.modules[name] = None
import aws_cdk as cdk
import constructs_lib
stack = cdk.Stack(cdk.App(), "S")
try:
    constructs_lib.TrainingImage(stack, "Image", directory=".")
except ImportError as error:
    print(error)
"""


def test_the_library_imports_without_its_optional_dependencies() -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_OPTIONAL],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TrainingImage needs the cdk-ecr-deployment package" in result.stdout
    assert "trn-platform[image]" in result.stdout


def test_importing_the_library_has_no_side_effects() -> None:
    code = (
        "import sys, os\n"
        "before = set(os.listdir('.'))\n"
        "import constructs_lib\n"
        "assert set(os.listdir('.')) == before\n"
        "assert 'aws_cdk' in sys.modules\n"
        "print(sorted(constructs_lib.__all__))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    exported = set(json.loads(result.stdout.strip().replace("'", '"')))
    assert {
        "TrainingNetwork",
        "TrainingDataPaths",
        "NeuronCluster",
        "TrainiumNodeGroup",
        "TrainingImage",
        "PreviewLifecycle",
        "CATALOG",
        "instance_spec",
    } <= exported


CONSTRUCTS_PAGE = ROOT / "docs" / "constructs.md"
# Per adoption path of docs/constructs.md: resource types its app must make and must not.
ADOPTION_PATHS = {
    "Whole platform in your app": (
        {
            "AWS::EKS::Cluster",
            "AWS::EKS::Nodegroup",
            "AWS::FSx::FileSystem",
            "Custom::AWSCDK-EKS-HelmChart",
            "Custom::AWSCDK-EKS-KubernetesResource",
        },
        set(),
    ),
    "Plugins on your cluster": (
        {"Custom::AWSCDK-EKS-HelmChart", "AWS::EKS::Nodegroup"},
        {"AWS::EKS::Cluster"},
    ),
    "Node group only": ({"AWS::EKS::Nodegroup"}, {"Custom::AWSCDK-EKS-HelmChart", "AWS::EC2::VPC"}),
    "Data paths only": ({"AWS::FSx::FileSystem"}, {"AWS::EC2::VPC"}),
}
# The apps (the documented examples, another app) run one after another in one process against the
# installed wheel: one interpreter and one jsii runtime instead of one per app (about 8 s of CPU
# each). The runtime reads CDK_OUTDIR once, when it starts: each app's assembly is moved to its
# own folder after it ran; an app's traceback is kept in its folder for its test to show.
RUN_INSTALLED = """
import os, runpy, shutil, sys, traceback
import constructs_lib
assert 'site' in constructs_lib.__file__, constructs_lib.__file__
for app_dir in sys.argv[1:]:
    os.chdir(app_dir)
    try:
        runpy.run_path('app.py', run_name='__main__')
    except BaseException:
        with open('error.txt', 'w') as error:
            error.write(traceback.format_exc())
    if os.path.isdir(os.environ['CDK_OUTDIR']):
        shutil.move(os.environ['CDK_OUTDIR'], os.path.join(app_dir, 'out'))
"""
OTHER_APP_NAME = "Their app"


def constructs_page_examples() -> dict[str, str]:
    """The examples of docs/constructs.md (the constructs in your own app), by the title of the
    section each opens."""
    sections = re.split(r"^## ", CONSTRUCTS_PAGE.read_text(), flags=re.M)[1:]
    found = {}
    for section in sections:
        title, _, body = section.partition("\n")
        code = re.search(r"^```python\n(.*?)^```", body, flags=re.S | re.M)
        if code:
            found[title] = code.group(1)
    return found


def library_readme_examples() -> dict[str, str]:
    """The examples of the library's own README (constructs_lib/README.md, the package's long
    description), by their place in it."""
    text = (ROOT / "constructs_lib" / "README.md").read_text()
    found = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    return {f"constructs_lib/README.md example {n}": code for n, code in enumerate(found, 1)}


def test_the_constructs_page_shows_one_example_per_adoption_path() -> None:
    examples = constructs_page_examples()
    assert set(examples) == set(ADOPTION_PATHS)
    for code in examples.values():
        assert "from_lookup" not in code, "lookups need an AWS account; examples stay offline"
        assert "props=" not in code, "the docs show keyword arguments"


@pytest.fixture(scope="module")
def apps_synthesized(installed: Path) -> dict[str, Path]:
    """Each example of docs/constructs.md and of the library's README, and another app
    (OTHER_APP), synthesized against the installed wheel with CDK's defaults, in one process (a
    new jsii runtime's first synth costs seconds); the folder of each by its name (an ``out``
    assembly, or ``error.txt``)."""
    codes = {**constructs_page_examples(), **library_readme_examples(), OTHER_APP_NAME: OTHER_APP}
    folders = {name: installed / re.sub(r"\W+", "-", name.lower()) for name in codes}
    for name, code in codes.items():
        folders[name].mkdir()
        (folders[name] / "app.py").write_text(code)
    env = {
        **os.environ,
        "PYTHONPATH": str(installed / "site"),
        "CDK_OUTDIR": str(installed / "out"),
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    }
    result = subprocess.run(
        [sys.executable, "-s", "-c", RUN_INSTALLED, *map(str, folders.values())],
        cwd=installed,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return folders


def _synthesized(apps: dict[str, Path], name: str) -> Path:
    """The assembly of app ``name``; its traceback if it failed."""
    error = apps[name] / "error.txt"
    assert not error.exists(), error.read_text()[-3000:]
    return apps[name] / "out"


@pytest.mark.parametrize("path", sorted(ADOPTION_PATHS))
def test_each_constructs_page_example_synthesizes_against_the_wheel(
    apps_synthesized: dict[str, Path], path: str
) -> None:
    out = _synthesized(apps_synthesized, path)
    resources = {
        name: resource
        for template in out.glob("*.template.json")
        for name, resource in json.loads(template.read_text()).get("Resources", {}).items()
    }
    types = {r["Type"] for r in resources.values()}
    wanted, unwanted = ADOPTION_PATHS[path]
    assert wanted <= types, wanted - types
    assert not unwanted & types, unwanted & types
    if path == "Data paths only":
        policies = json.dumps([r for r in resources.values() if r["Type"] == "AWS::IAM::Policy"])
        assert "kms:Decrypt" in policies and "key/0123abcd-0123-4567-89ab-0123456789ab" in policies


def test_the_library_readmes_examples_synthesize_against_the_wheel(
    apps_synthesized: dict[str, Path],
) -> None:
    """The package's own README: a cluster with the Neuron charts and a Trainium node group,
    offline."""
    examples = library_readme_examples()
    assert examples
    for name, code in examples.items():
        assert "from_lookup" not in code, "lookups need an AWS account; examples stay offline"
        types = {
            resource["Type"]
            for template in _synthesized(apps_synthesized, name).glob("*.template.json")
            for resource in json.loads(template.read_text()).get("Resources", {}).values()
        }
        assert {"Custom::AWSCDK-EKS-HelmChart", "AWS::EKS::Nodegroup"} <= types, name


# Changing one of these replaces a stateful resource (and its data) on the next deploy.
STATEFUL_IDS = {
    "data": {
        "AWS::FSx::FileSystem": {"DataPathsFileSystemF22FB407"},
        "AWS::S3::Bucket": {
            "DataPathsAccessLogs9FF08411",
            "DataPathsDatasets9CD8D47B",
            "DataPathsCheckpoints3A0F6633",
            "DataPathsCompileCache78ECA761",
        },
        "AWS::KMS::Key": {"DataPathsDataKeyBA4D10B4"},
    },
    "image": {"AWS::ECR::Repository": {"TrainingImageRepositoryA4686A09"}},
}


def test_stateful_logical_ids_are_stable(dev: Synth) -> None:
    for stack, by_type in STATEFUL_IDS.items():
        for resource_type, expected in by_type.items():
            assert set(dev.resources(stack, resource_type)) == expected, resource_type
