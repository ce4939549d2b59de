"""The measured-figures page says which run produced it and shows each figure with its goal and
whether the run met it; a benchmark that did not run is named, not left out."""

import importlib
import json
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT

RESULTS = {
    "run": {
        "command": "make bench",
        "commit": "85e26dd1a2b3",
        "started": "2026-12-02 09:30 UTC",
        "finished": "2026-12-02 09:58 UTC",
        "machine": "AMD EPYC 7B13, 2 cores, 23 GiB memory, Python 3.11.7",
        "load_before": "1.0, 2.0, 3.0",
        "load_after": "2.0, 2.0, 2.0",
        "exit_status": 1,
        "failed": "hf_bench.py",
    },
    "synth": {"make_synth_s": 41.27, "ratio": 1.71, "rounds": 5, "command": "python x"},
    "fine_tuning": {
        "trainer_vs_transformers_tokens_per_s": 1.1834,
        "safetensors_load_vs_read": 0.42,
        "goals": {"trainer_vs_transformers_tokens_per_s": 1.1, "safetensors_load_vs_read": 0.5},
        "meets_goals": {
            "trainer_vs_transformers_tokens_per_s": True,
            "safetensors_load_vs_read": False,
        },
        "details": {"per_round": [1.2, 1.1]},
        "command": f"python {ROOT}/bench/hf_bench.py",
    },
}


@pytest.fixture
def page(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    return importlib.import_module("page")


def test_the_page_names_the_run_that_made_it(page: ModuleType) -> None:
    text = page.render(RESULTS)

    assert "- started: 2026-12-02 09:30 UTC; finished: 2026-12-02 09:58 UTC" in text
    assert "- machine: AMD EPYC 7B13, 2 cores, 23 GiB memory, Python 3.11.7" in text
    assert "- command: `make bench` at commit 85e26dd1a2b3" in text
    assert "- exit status: 1 (scripts that exited non-zero: hf_bench.py)" in text


def test_each_figure_is_shown_with_its_goal_and_whether_it_was_met(page: ModuleType) -> None:
    lines = page.render(RESULTS).splitlines()

    assert "| `trainer_vs_transformers_tokens_per_s` | 1.183 | 1.1 | met |" in lines
    assert "| `safetensors_load_vs_read` | 0.42 | 0.5 | missed |" in lines
    assert "| `ratio` | 1.71 |  |  |" in lines
    assert "| `rounds` | 5 |  |  |" in lines
    assert not [line for line in lines if "per_round" in line or "goals" in line]
    assert "Script: `bench/hf_bench.py`." not in lines  # the interpreter stays, the path shortens
    assert "Script: `python bench/hf_bench.py`." in lines


def test_a_benchmark_that_did_not_run_is_named(page: ModuleType) -> None:
    text = page.render(RESULTS)
    trainer = text.split("## trainer:", 1)[1].split("##", 1)[0]
    assert "Not run (no section in the results file)." in trainer


def test_the_script_writes_the_page_from_the_results_file(page: ModuleType, tmp_path: Path) -> None:
    results, out = tmp_path / "results.json", tmp_path / "measured.md"
    results.write_text(json.dumps(RESULTS))

    assert page.main(["--results", str(results), "--out", str(out)]) == 0
    assert out.read_text() == page.render(RESULTS)
    assert page.main(["--results", str(tmp_path / "none.json"), "--out", str(out)]) == 2


def test_each_script_merges_its_section_and_the_run_section_grows(
    page: ModuleType, tmp_path: Path
) -> None:
    results_file = importlib.import_module("results_file")
    path = tmp_path / "results.json"
    results_file.merge(path, "run", {"started": "a"})
    results_file.merge(path, "synth", {"ratio": 1.5, "rounds": 5})
    results_file.merge(path, "synth", {"ratio": 1.4})
    results_file.merge(path, "run", {"finished": "b"})

    assert json.loads(path.read_text()) == {
        "run": {"started": "a", "finished": "b"},
        "synth": {"ratio": 1.4},
    }


def test_the_run_names_its_commit_and_a_tree_with_other_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """bench/run.py's commit: HEAD's short hash, marked when files other than the page it
    writes have changed; "unknown" outside a checkout."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    run = importlib.import_module("run")
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    (repo / "docs").mkdir()
    page_file = repo / "docs" / "performance-measured.md"
    for path in (repo / "bench" / "x.py", page_file):
        path.write_text("a\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "one"]):
        subprocess.run([*git, *args], check=True)
    head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    monkeypatch.setattr(run, "HERE", repo / "bench")
    monkeypatch.setattr(run, "PAGE", page_file)

    page_file.write_text("b\n")
    assert run.commit() == head.stdout.strip()
    (repo / "bench" / "x.py").write_text("b\n")
    assert run.commit() == head.stdout.strip() + " with uncommitted changes"
    monkeypatch.setattr(run, "HERE", tmp_path / "elsewhere" / "bench")
    (tmp_path / "elsewhere" / "bench").mkdir(parents=True)
    assert run.commit() == "unknown"


def test_make_bench_runs_every_script_after_one_fails_and_fails_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """bench/run.py runs the scripts after one that exits non-zero, exits 1, and its run
    section and page name the one that failed (and only it)."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    run = importlib.import_module("run")
    ran = tmp_path / "ran"
    scripts = {"first.py": 3, "second.py": 0}
    for name, code in scripts.items():
        (tmp_path / name).write_text(
            f"import pathlib, sys\npathlib.Path({str(ran)!r}).open('a').write('{name}\\n')\n"
            f"sys.exit({code})\n"
        )
    monkeypatch.setattr(run, "SCRIPTS", tuple(str(tmp_path / name) for name in scripts))
    monkeypatch.setattr(run, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(run, "PAGE", tmp_path / "page.md")
    monkeypatch.setattr(run, "commit", lambda: "0123456789ab")  # its own test is above

    assert run.main() == 1
    assert ran.read_text().split() == ["first.py", "second.py"]
    section = json.loads((tmp_path / "results.json").read_text())["run"]
    assert section["exit_status"] == 1
    assert section["failed"] == str(tmp_path / "first.py")
    assert f"(scripts that exited non-zero: {tmp_path / 'first.py'})" in run.PAGE.read_text()
