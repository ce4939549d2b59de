"""The trainer package's shape: its import graph has no circle, so that each module can be
read, and changed, after the ones it imports (config is data; the model, the Hugging Face
files, LoRA, the task and the loop build on it in that order); and no function of it is longer
than a screen."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

import trainer

PACKAGE = Path(trainer.__file__).parent


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """``path``'s module under ``package``, without ``trainer.`` (``classify.model``; a
    subpackage's ``__init__.py`` is the subpackage, the package's own ``__init__``)."""
    parts = path.relative_to(package).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, package: Path, modules: set[str]) -> set[str]:
    """The trainer modules ``path`` imports anywhere: at module level, inside functions and
    under ``TYPE_CHECKING`` alike (a deferred import still ties the two modules together;
    it only hides the circle from the interpreter). Relative imports count as their absolute
    names."""
    here = ["trainer", *module_name(path, package).split(".")]
    if path.name != "__init__.py":
        here = here[:-1]  # a module's relative imports start from its package
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1] if node.level else [])
            module = ".".join(filter(None, [base, node.module or ""]))
            names = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(name.removeprefix("trainer.") for name in names if name.startswith("trainer."))
    return found & modules


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of ``package`` and its subpackages (by name, without ``trainer.``) and the
    ones it imports."""
    paths = sorted(package.rglob("*.py"))
    modules = {module_name(p, package) for p in paths}
    return {
        module_name(p, package): _imports(p, package, modules) - {module_name(p, package)}
        for p in paths
    }


def test_the_trainer_imports_no_module_in_a_circle() -> None:
    graph = import_graph()
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        # graphlib lists a circle as each module before one that imports it.
        circle = " imports ".join(reversed(error.args[1]))
        pytest.fail(f"import circle in training_image/trainer: {circle}")
    assert order.index("config") < order.index("model") < order.index("loop")


def test_the_graph_sees_imports_inside_functions_and_type_checking(tmp_path: Path) -> None:
    """What the check counts, on a package of three modules."""
    (tmp_path / "a.py").write_text("from trainer import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from trainer.c import x\n")
    (tmp_path / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import trainer.a\n"
    )
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("")
    (tmp_path / "sub" / "d.py").write_text("from . import e\nfrom ..a import f\n")
    (tmp_path / "sub" / "e.py").write_text("from trainer.sub import d\n")
    graph = import_graph(tmp_path)
    assert graph == {
        "a": {"b"},
        "b": {"c"},
        "c": {"a"},
        "sub": set(),
        "sub.d": {"sub", "sub.e", "a"},
        "sub.e": {"sub", "sub.d"},
    }
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter(graph).prepare()


# Our own limit (issue 32): a function longer than this no longer reads at once; the median
# of the package is 9 lines. Measured from ``def`` to the last line, docstring included.
MAX_FUNCTION_LINES = 60


def long_functions(package: Path = PACKAGE) -> list[str]:
    """``file:line name (lines)`` of each function of ``package`` above
    :data:`MAX_FUNCTION_LINES`."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    where = path.relative_to(package)
                    found.append(f"{where}:{node.lineno} {node.name} ({lines})")
    return found


def test_every_trainer_function_reads_at_once() -> None:
    assert long_functions() == []


def test_the_length_counts_from_def_to_the_last_line(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    (tmp_path / "m.py").write_text(f"def fits():\n{body}\n\ndef over():\n{body}    return x0\n")
    assert long_functions(tmp_path) == [f"m.py:{MAX_FUNCTION_LINES + 3} over (61)"]
