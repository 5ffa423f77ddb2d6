//! craterdex-testkit: what the test suites share, and nothing a user's build links.
//!
//! Owns: reporting tests that cannot run here. Rust's test harness has no run-time skip, so
//! a test that would test nothing on this machine (AMX tiles absent, model unavailable)
//! returns early after [`skip`], which says why on stderr and appends one line to the file
//! named by `CRATERDEX_SKIP_LOG`; CI prints that file. Knows nothing of craterdex itself.

use std::io::Write;

/// Reports `test` as skipped for `reason`.
pub fn skip(test: &str, reason: &str) {
    let line = format!("SKIPPED {test}: {reason}");
    eprintln!("{line}");
    let Some(log) = std::env::var_os("CRATERDEX_SKIP_LOG") else {
        return;
    };
    // One short append per line: concurrent test binaries interleave whole lines.
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = appended {
        eprintln!(
            "cannot append to {}: {e}",
            std::path::Path::new(&log).display()
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn skips_are_appended_to_the_log() {
        let dir = std::env::temp_dir().join(format!("craterdex-testkit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("skipped.log");
        std::env::set_var("CRATERDEX_SKIP_LOG", &log);
        super::skip("a", "no tiles");
        super::skip("b", "no model");
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text, "SKIPPED a: no tiles\nSKIPPED b: no model\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
