//! The Python that runs the reference implementations (faiss-cpu, numpy, onnxruntime): the
//! one named by `$CRATERDEX_PYTHON`, else a virtual environment under `$CRATERDEX_HOME` with
//! the pinned `scripts/requirements-bench.txt` installed on first use, else plain `python3`.
//! The reference scripts are embedded in the binary.

use anyhow::{Context, Result};
use craterdex_fetch as fetch;
use std::path::{Path, PathBuf};
use std::process::Command;

const REQUIREMENTS: &str = include_str!("../../../../../scripts/requirements-bench.txt");
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

/// Finds or prepares the Python with `modules` (comma-separated import list). Never fails:
/// where nothing can be installed it returns `python3` and says so in `origin`.
pub fn reference_python(modules: &str) -> ReferencePython {
    if let Some(p) = std::env::var_os("CRATERDEX_PYTHON") {
        return ReferencePython {
            exe: PathBuf::from(p),
            origin: "$CRATERDEX_PYTHON".into(),
        };
    }
    let venv = fetch::cache_dir().join("python-bench");
    let exe = venv.join("bin/python");
    if exe.exists() && imports(&exe, modules) {
        return ReferencePython {
            exe,
            origin: format!("{} (pinned scripts/requirements-bench.txt)", venv.display()),
        };
    }
    match install(&venv) {
        Ok(()) if imports(&exe, modules) => ReferencePython {
            exe,
            origin: format!(
                "{} (pinned scripts/requirements-bench.txt, installed now)",
                venv.display()
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

fn install(venv: &Path) -> Result<()> {
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
    let req = venv.join("requirements-bench.txt");
    std::fs::write(&req, REQUIREMENTS)
        .with_context(|| format!("cannot write {}", req.display()))?;
    run(
        Command::new(venv.join("bin/python"))
            .args(["-m", "pip", "install", "--quiet", "-r"])
            .arg(&req),
        "pip install -r requirements-bench.txt",
    )
}

/// Writes an embedded script to a temporary file and returns its path.
pub fn script_file(name: &str, text: &str) -> Result<PathBuf> {
    let p = std::env::temp_dir().join(format!("craterdex-{}-{name}", std::process::id()));
    std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?;
    Ok(p)
}
