"""The Python examples of README.md and docs/guide/python.md run as written, on the output of
`craterdex demo`."""

import os
import re

import pytest

from conftest import REPO, REAL_HOME


def python_blocks(doc, section=None):
    """The ```python blocks of `doc`: those under the heading `section`, or those before the
    first `## ` heading."""
    text = open(os.path.join(REPO, doc), encoding="utf-8").read()
    if section is None:
        part = text.split("\n## ", 1)[0]
    else:
        part = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", part, flags=re.S)


def run_example(doc, blocks, tmp_path, monkeypatch):
    demo = os.environ.get("CRATERDEX_DEMO_DIR")
    if not demo:
        pytest.skip("CRATERDEX_DEMO_DIR is not set (CI points it at its `craterdex demo` output)")
    assert blocks, f"{doc} has no Python example"
    os.symlink(os.path.abspath(demo), tmp_path / "craterdex-demo")
    monkeypatch.chdir(tmp_path)
    # the default model lives in the user's home, not the tests' fresh one
    if REAL_HOME is None:
        monkeypatch.delenv("CRATERDEX_HOME", raising=False)
    else:
        monkeypatch.setenv("CRATERDEX_HOME", REAL_HOME)
    scope = {}
    for code in blocks:
        exec(compile(code, doc, "exec"), scope)
    return scope


def test_the_readme_example_runs(tmp_path, monkeypatch):
    scope = run_example("README.md", python_blocks("README.md", "Python"), tmp_path, monkeypatch)
    assert 0.3 < scope["found"] <= 1.0


def test_the_python_guide_example_runs(tmp_path, monkeypatch):
    doc = os.path.join("docs", "guide", "python.md")
    scope = run_example(doc, python_blocks(doc), tmp_path, monkeypatch)
    queries, hits, links = scope["queries"], scope["hits"], scope["links"]
    assert set(hits["query"]) == set(queries["id"])
    assert (hits.groupby("query")["rank"].max() <= 3).all()
    assert len(links) == len(queries)
    assert set(links["decision"]) <= {"match", "new", "ambiguous"}
    assert not links["inserted"].any(), "the guide's link must not change the demo's index"
    assert 0.0 < scope["scores"]["regimes"]["inst_fps_k32_white"]["mAP"] <= 1.0
