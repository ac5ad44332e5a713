"""benchmarks/results/ is a record, not a scratch folder: every file in it is cited
by its path from the documentation, and every citation names a file that exists.

Citations are `benchmarks/results/<name>` or `results/<name>` paths in README.md,
benchmarks/README.md and docs/**/*.md (topic pages under docs/topics/ included).
`name.{json,png}` cites both files; a name without an extension cites the files
`name.*` (at least one must exist). Globs (`*`) and placeholders (`<model>`) cite nothing.
"""

import glob
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(ROOT, "benchmarks", "results")

CITATION = re.compile(r"(?<![\w/.-])(?:benchmarks/)?results/([\w.{},-]+)(?![\w.{},*<-])")
IGNORED = {".gitignore"}


def pages() -> list[str]:
    found = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "benchmarks", "README.md")]
    found += [p for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
              if os.sep + "_build" + os.sep not in p]
    return [p for p in found if os.path.exists(p)]


def expand(name: str) -> list[str]:
    """`a.{json,png}` -> [a.json, a.png]; `a{,_P2}.json` -> [a.json, a_P2.json]."""
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [n for alt in m.group(1).split(",")
            for n in expand(name[:m.start()] + alt + name[m.end():])]


def citations() -> dict[str, list[str]]:
    """Each cited name (expanded, trailing punctuation stripped) -> the pages citing it."""
    cited: dict[str, list[str]] = {}
    for page in pages():
        text = open(page, encoding="utf-8").read()
        for raw in CITATION.findall(text):
            for name in expand(raw.rstrip(".,")):
                name = name.rstrip(".,")
                if name:
                    cited.setdefault(name, []).append(os.path.relpath(page, ROOT))
    return cited


def result_files() -> list[str]:
    return sorted(f for f in os.listdir(RESULTS)
                  if os.path.isfile(os.path.join(RESULTS, f)) and f not in IGNORED)


def files_cited_by(name: str, files: list[str]) -> list[str]:
    if name in files:
        return [name]
    if "." not in name:  # a stem: its .json, .png, ...
        return [f for f in files if f.startswith(name + ".")]
    return []


def test_every_result_file_is_cited():
    files = result_files()
    cited = set()
    for name in citations():
        cited.update(files_cited_by(name, files))
    uncited = [f for f in files if f not in cited]
    assert not uncited, (
        f"{len(uncited)} file(s) in benchmarks/results/ cited by no page (README.md, "
        f"benchmarks/README.md, docs/**/*.md): {uncited}. Cite each by its path, e.g. "
        f"`benchmarks/results/{uncited[0]}`, or delete it (git keeps the history).")


def test_every_citation_names_an_existing_file():
    files = result_files()
    missing = {name: where for name, where in citations().items()
               if not files_cited_by(name, files)}
    assert not missing, (
        f"citations of files that are not in benchmarks/results/: {missing}")


def test_expand_and_the_citation_pattern():
    assert expand("a.{json,png}") == ["a.json", "a.png"]
    assert expand("a{,_P2}.json") == ["a.json", "a_P2.json"]
    text = ("see `benchmarks/results/x_1.{json,png}`, results/y.json. and "
            "results/z_*.json; results/v_<model>.json; not other/results/w.json")
    found = CITATION.findall(text)
    assert found == ["x_1.{json,png}", "y.json."]


def test_a_timeline_record_holds_its_traced_step():
    """grouping.py --timeline-only writes its record even when no plan was traced (its
    --timeline-plan named none of --plans: step_timeline None); such a record shows nothing
    its page says it shows."""
    import json

    names = sorted(glob.glob(os.path.join(RESULTS, "grouping_timeline_*.json")))
    assert names
    for path in names:
        with open(path) as f:
            data = json.load(f)
        for run in data["runs"]:
            st = run.get("step_timeline")
            assert st and st.get("groups") and st.get("ranks"), (
                f"{os.path.basename(path)}: no traced step (step_timeline {st!r}); re-run with "
                "--timeline-plan naming one of --plans")
