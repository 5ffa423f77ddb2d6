//! The Python that runs the reference implementations (faiss-cpu, numpy, onnxruntime; and
//! pycda on tf-keras): the one named by `$CRATERDEX_PYTHON` (`$CRATERDEX_PYCDA_PYTHON`), else
//! a virtual environment under `$CRATERDEX_HOME` with the pinned
//! `scripts/requirements-bench.txt` (`requirements-pycda.txt`) installed on first use, else
//! plain `python3`. The reference scripts are embedded in the binary.

use anyhow::{Context, Result};
use craterdex_fetch as fetch;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A pinned environment of reference implementations: its directory under the cache and
/// its requirements file.
pub struct Pinned {
    pub venv: &'static str,
    pub file: &'static str,
    pub text: &'static str,
    /// The environment variable naming a Python to use instead.
    pub env: &'static str,
}

/// faiss-cpu, numpy, onnxruntime.
pub const BENCH: Pinned = Pinned {
    venv: "python-bench",
    file: "requirements-bench.txt",
    text: include_str!("../../../../../scripts/requirements-bench.txt"),
    env: "CRATERDEX_PYTHON",
};

/// pycda's pipeline on tf-keras.
pub const PYCDA: Pinned = Pinned {
    venv: "python-pycda",
    file: "requirements-pycda.txt",
    text: include_str!("../../../../../scripts/requirements-pycda.txt"),
    env: "CRATERDEX_PYCDA_PYTHON",
};
pub const PYCDA_SCRIPT: &str = include_str!("../../../../../scripts/pycda_reference.py");
pub const SEARCH_SCRIPT: &str = include_str!("../../../../../scripts/bench_search_ref.py");
pub const EXTRACT_SCRIPT: &str = include_str!("../../../../../scripts/bench_extract_ort.py");

/// A Python to run references with, and how it was found (for the report).
pub struct ReferencePython {
    pub exe: PathBuf,
    pub origin: String,
}

fn imports(python: &Path, modules: &str) -> bool {
    Command::new(python)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Finds or prepares the Python with `modules` (comma-separated import list) of the
/// benchmarks' pinned references ([`BENCH`]).
pub fn reference_python(modules: &str) -> ReferencePython {
    pinned_python(&BENCH, modules)
}

/// Finds or prepares the Python of `pinned` with `modules`. Never fails: where nothing can be
/// installed it returns `python3` and says so in `origin`.
pub fn pinned_python(pinned: &Pinned, modules: &str) -> ReferencePython {
    if let Some(p) = std::env::var_os(pinned.env) {
        return ReferencePython {
            exe: PathBuf::from(p),
            origin: format!("${}", pinned.env),
        };
    }
    let venv = fetch::cache_dir().join(pinned.venv);
    let exe = venv.join("bin/python");
    if exe.exists() && imports(&exe, modules) {
        return ReferencePython {
            exe,
            origin: format!("{} (pinned scripts/{})", venv.display(), pinned.file),
        };
    }
    match install(&venv, pinned) {
        Ok(()) if imports(&exe, modules) => ReferencePython {
            exe,
            origin: format!(
                "{} (pinned scripts/{}, installed now)",
                venv.display(),
                pinned.file
            ),
        },
        Ok(()) => ReferencePython {
            exe: "python3".into(),
            origin: format!(
                "python3 (the environment in {} lacks {modules})",
                venv.display()
            ),
        },
        Err(e) => ReferencePython {
            exe: "python3".into(),
            origin: format!("python3 (the pinned references could not be installed: {e:#})"),
        },
    }
}

fn install(venv: &Path, pinned: &Pinned) -> Result<()> {
    eprintln!(
        "installing the pinned reference implementations into {} (once)",
        venv.display()
    );
    let run = |cmd: &mut Command, what: &str| -> Result<()> {
        let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
        anyhow::ensure!(
            out.status.success(),
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
        Ok(())
    };
    if !venv.join("bin/python").exists() {
        run(
            Command::new("python3").args(["-m", "venv"]).arg(venv),
            "python3 -m venv",
        )?;
    }
    let req = venv.join(pinned.file);
    std::fs::write(&req, pinned.text).with_context(|| format!("cannot write {}", req.display()))?;
    run(
        Command::new(venv.join("bin/python"))
            .args(["-m", "pip", "install", "--quiet", "-r"])
            .arg(&req),
        &format!("pip install -r {}", pinned.file),
    )
}

/// Writes an embedded script to a temporary file and returns its path.
pub fn script_file(name: &str, text: &str) -> Result<PathBuf> {
    let p = std::env::temp_dir().join(format!("craterdex-{}-{name}", std::process::id()));
    std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?;
    Ok(p)
}
