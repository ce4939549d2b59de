"""The trainer package's import graph has no circle: each module can be read, and changed,
after the ones it imports (config is data; the model, the Hugging Face files, LoRA, the task
and the loop build on it in that order)."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

import trainer

PACKAGE = Path(trainer.__file__).parent


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The trainer modules ``path`` imports anywhere: at module level, inside functions and
    under ``TYPE_CHECKING`` alike (a deferred import still ties the two modules together;
    it only hides the circle from the interpreter)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(name.removeprefix("trainer.") for name in names if name.startswith("trainer."))
    return found & modules


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of ``package`` (by name, without ``trainer.``) and the ones it imports."""
    modules = {p.stem for p in package.glob("*.py")}
    return {p.stem: _imports(p, modules) - {p.stem} for p in package.glob("*.py")}


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
    graph = import_graph(tmp_path)
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter(graph).prepare()
