import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, HERE)
# Dask worker processes import the helpers too
os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")

import helpers  # noqa: E402
import craterdex  # noqa: E402

REAL_HOME = os.environ.get("CRATERDEX_HOME")


@pytest.fixture(scope="session")
def home(tmp_path_factory):
    """A fresh CRATERDEX_HOME for the session (models imported, feature cache)."""
    h = str(tmp_path_factory.mktemp("home"))
    os.environ["CRATERDEX_HOME"] = h
    yield h
    if REAL_HOME is None:
        os.environ.pop("CRATERDEX_HOME", None)
    else:
        os.environ["CRATERDEX_HOME"] = REAL_HOME


@pytest.fixture(scope="session")
def tiny_dir(home, tmp_path_factory):
    ckpt = helpers.tiny_checkpoint(str(tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"))
    return craterdex.Model.import_file(ckpt, "tiny")


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    return craterdex.Model.load(tiny_dir, size=16, cache=False)


@pytest.fixture(scope="session")
def cli():
    """The craterdex binary (CRATERDEX_BIN, else this checkout's release build)."""
    exe = os.environ.get("CRATERDEX_BIN", os.path.join(REPO, "target", "release", "craterdex"))
    if not os.path.exists(exe):
        pytest.fail(f"{exe} not found: run `cargo build --release` first or set CRATERDEX_BIN")

    def run(*args, ok=True):
        r = subprocess.run([exe, *map(str, args)], capture_output=True, text=True)
        if ok and r.returncode != 0:
            raise AssertionError(f"craterdex {' '.join(map(str, args))} failed:\n{r.stderr}")
        return r

    return run


@pytest.fixture(scope="session")
def crops(tmp_path_factory):
    d = tmp_path_factory.mktemp("crops") / "catalogue"
    return helpers.catalogue(str(d))
