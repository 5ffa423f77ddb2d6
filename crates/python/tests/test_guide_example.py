"""The Python guide's example (docs/guide/python.md) runs as written, on the output of
`craterdex demo`."""

import os
import re

import pytest

from conftest import REPO, REAL_HOME


GUIDE = os.path.join("docs", "guide", "python.md")


def guide_python_blocks():
    """The ```python blocks before the guide's first section (the notebook example)."""
    text = open(os.path.join(REPO, GUIDE), encoding="utf-8").read()
    opening = text.split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", opening, flags=re.S)


def test_the_python_guide_example_runs(tmp_path, monkeypatch):
    demo = os.environ.get("CRATERDEX_DEMO_DIR")
    if not demo:
        pytest.skip("CRATERDEX_DEMO_DIR is not set (CI points it at its `craterdex demo` output)")
    blocks = guide_python_blocks()
    assert blocks, f"{GUIDE} has no Python example"
    os.symlink(os.path.abspath(demo), tmp_path / "craterdex-demo")
    monkeypatch.chdir(tmp_path)
    # the default model lives in the user's home, not the tests' fresh one
    if REAL_HOME is None:
        monkeypatch.delenv("CRATERDEX_HOME", raising=False)
    else:
        monkeypatch.setenv("CRATERDEX_HOME", REAL_HOME)
    scope = {}
    for code in blocks:
        exec(compile(code, GUIDE, "exec"), scope)
    assert 0.3 < scope["found"] <= 1.0
