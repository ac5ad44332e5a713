"""The documentation's result tables are their records rendered (benchmarks/doc_tables/)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import doc_tables  # noqa: E402


@pytest.mark.parametrize("table", doc_tables.TABLES, ids=lambda t: t.name)
def test_every_table_on_its_page_is_its_records_rendered(table):
    text = (ROOT / table.page).read_text()
    block = doc_tables.block_of(text, table.name)
    assert block is not None, f"{table.page}: the markers of table {table.name} must appear once"
    assert block == doc_tables.render(table), (
        f"{table.page}: table {table.name} differs from its records "
        f"({', '.join(table.records)}); run `python -m benchmarks.doc_tables`")


def test_every_marker_on_the_pages_names_a_table():
    names = {t.name for t in doc_tables.TABLES}
    for page in {t.page for t in doc_tables.TABLES}:
        text = (ROOT / page).read_text()
        for chunk in text.split("<!-- table:")[1:]:
            name = chunk.split(" ", 1)[0].split(":end", 1)[0]
            assert name in names, f"{page}: a marker names table {name!r}, which does not exist"


def test_a_changed_record_shows_on_its_page(tmp_path):
    """A number changed in a record is a difference the check reports, and the rewrite
    puts the new number on the page (and only in the tables that read the record)."""
    results = tmp_path / "results"
    shutil.copytree(doc_tables.RESULTS, results, ignore=shutil.ignore_patterns("*.png"))
    for table in doc_tables.TABLES:
        (tmp_path / table.page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / table.page, tmp_path / table.page)
    assert doc_tables.write_all(tmp_path, results, check=True) == []
    name = "sharded_state_p2.json"
    data = json.loads((results / name).read_text())
    data["rows"]["sharded_dense"]["val_loss"] = 9.8765
    (results / name).write_text(json.dumps(data))
    readers = ["sharded_state_goals", "sharded_state_p2"]  # the goals: every P's record
    assert doc_tables.write_all(tmp_path, results, check=True) == readers
    assert "9.8765" not in (tmp_path / "docs/topics/sharded_state.md").read_text()
    assert doc_tables.write_all(tmp_path, results) == readers
    assert "| 9.8765 |" in (tmp_path / "docs/topics/sharded_state.md").read_text()
    assert doc_tables.write_all(tmp_path, results, check=True) == []


def test_a_missing_marker_is_a_clear_error():
    with pytest.raises(SystemExit, match="markers"):
        doc_tables.replace("no markers here", "step_time_matrix", "x")


def test_the_command_checks_the_pages():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.doc_tables", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"0 of {len(doc_tables.TABLES)} tables differ from their records" in proc.stdout


def test_a_cpp_element_type_is_said_as_numpy_names_it():
    """adam_pass_time's record holds the kernel's C++ type of its ages; pages say dtypes."""
    assert [doc_tables.numpy_name(t) for t in ("float", "double", "int16_t", "uint8_t")] == [
        "float32", "float64", "int16", "uint8"]


def test_a_sharded_state_goal_is_read_from_the_records_targets():
    """One value where every P's record states the same goal, else one per P."""
    targets = {2: {"step_ratio": 1.1, "adamw_state_ratio": 0.51},
               4: {"step_ratio": 1.1, "adamw_state_ratio": 0.26}}
    assert doc_tables.goal(targets, "step_ratio") == "1.1"
    assert doc_tables.goal(targets, "adamw_state_ratio") == "0.51 / 0.26 at P = 2 / 4"


def test_every_topic_module_is_registered():
    """A module of the package that keeps tables adds them to doc_tables.TABLES (through
    TOPICS), so a new topic's tables cannot be left out of the check."""
    package = Path(doc_tables.__file__).parent
    keeping = {p.stem for p in package.glob("*.py") if "\nTABLES = (" in p.read_text()}
    assert keeping == {t.__name__.rsplit(".", 1)[1] for t in doc_tables.TOPICS}
    names = [t.name for t in doc_tables.TABLES]
    assert len(names) == len(set(names)), "two tables share a name"
