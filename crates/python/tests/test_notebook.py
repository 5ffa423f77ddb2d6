"""What a notebook user sees: progress, warnings for skipped images, indexes closed."""

import gc
import os

import pandas as pd
import pytest

import craterdex
import craterdex._progress as progress_mod


def _with_broken(crops, tmp_path, n=8):
    entries = crops.iloc[:n].copy()
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not an image at all")
    extra = entries.iloc[:1].copy()
    extra["id"], extra["path"] = "broken", str(bad)
    return pd.concat([entries, extra], ignore_index=True)


def test_every_skipped_image_is_a_warning_naming_it_and_why(tiny, crops, tmp_path, capfd):
    entries = _with_broken(crops, tmp_path)
    with pytest.warns(craterdex.SkippedImageWarning) as caught:
        idx = craterdex.Index.build(tmp_path / "i", entries, model=tiny, progress=False)
    assert len(idx) == len(entries) - 1
    skipped = [w for w in caught if issubclass(w.category, craterdex.SkippedImageWarning)]
    assert len(skipped) == 1
    message = str(skipped[0].message)
    assert "broken.png" in message and "skipped" in message
    # attributed to the line that called build, not to craterdex's internals
    assert skipped[0].filename == __file__
    # progress=False: nothing on stderr
    assert capfd.readouterr().err == ""

    with pytest.warns(craterdex.SkippedImageWarning, match="broken.png"):
        f = tiny.extract([entries["path"].iloc[0], str(tmp_path / "broken.png")], progress=False)
    assert len(f["ids"]) == 1


def test_progress_is_a_tqdm_bar_where_tqdm_is_installed_and_plain_lines_otherwise(
        tiny, crops, tmp_path, capfd, monkeypatch):
    pytest.importorskip("tqdm")
    craterdex.Index.build(tmp_path / "a", crops.iloc[:12], model=tiny)
    err = capfd.readouterr().err
    assert "images: 100%" in err and "12/12" in err and "img/s" in err, err

    monkeypatch.setattr(progress_mod, "_tqdm", lambda: None)
    craterdex.Index.build(tmp_path / "b", crops.iloc[:12], model=tiny)
    lines = [l for l in capfd.readouterr().err.splitlines() if l.startswith("images:")]
    assert lines and lines[-1].startswith("images: 12/12 ("), lines


def test_a_closed_index_lets_go_of_its_files_and_refuses_calls(tiny, crops, tmp_path):
    path = tmp_path / "closing"
    idx = craterdex.Index.build(path, crops.iloc[:10], model=tiny, progress=False)
    maps = "/proc/self/maps"
    linux = os.path.exists(maps)
    if linux:
        assert str(path) in open(maps).read()
    idx.close()
    idx.close()  # twice is harmless
    gc.collect()
    if linux:
        assert str(path) not in open(maps).read()
    assert idx.closed and "closed" in repr(idx)
    with pytest.raises(craterdex.InvalidInputError, match="is closed"):
        len(idx)
    with pytest.raises(craterdex.InvalidInputError, match="is closed"):
        idx.search(paths=[crops["path"][0]])

    with craterdex.Index.open(path, model=tiny) as again:
        assert len(again) == 10
    assert again.closed
    if linux:
        gc.collect()
        assert str(path) not in open(maps).read()


def test_the_engines_own_events_reach_pythons_logging():
    import subprocess
    import sys
    code = ("import logging; logging.basicConfig(format='%(levelname)s %(name)s %(message)s'); "
            "import craterdex; craterdex.cpu()")
    env = dict(os.environ, CRATERDEX_KERNEL="bogus")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "WARNING craterdex_kernels.level CRATERDEX_KERNEL: unknown kernel level \"bogus\"" in r.stderr, r.stderr
