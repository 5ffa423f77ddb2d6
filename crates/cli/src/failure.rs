//! How a failed command ends: the library's message, a hint in this command line's own terms
//! where one helps, and an exit code per kind of failure (documented in `craterdex --help`).

use craterdex_errors::{ErrorKind, HasKind, IoError};

/// Exit code of a command that failed for a reason outside the kinds below.
pub const FAILED: i32 = 1;

/// The documented exit code of each kind (2 is clap's, for bad usage).
pub fn exit_code(kind: Option<ErrorKind>) -> i32 {
    match kind {
        None => FAILED,
        Some(ErrorKind::InvalidInput) => 3,
        Some(ErrorKind::NotFound) => 4,
        Some(ErrorKind::Conflict) => 5,
        Some(ErrorKind::Corrupt) => 6,
        Some(ErrorKind::Unsupported) => 7,
        Some(ErrorKind::Io) => 8,
    }
}

/// The engine error inside a library error, where the kind of trouble is the engine's.
fn engine_error<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a craterdex_engine::Error> {
    if let Some(e) = e.downcast_ref::<craterdex_engine::Error>() {
        return Some(e);
    }
    match (
        e.downcast_ref::<craterdex_eval::Error>(),
        e.downcast_ref::<craterdex_workflows::Error>(),
    ) {
        (Some(craterdex_eval::Error::Engine(e)), _) => Some(e),
        (_, Some(craterdex_workflows::Error::Engine(e))) => Some(e),
        _ => None,
    }
}

/// The kind of the first library error in the chain of `e`.
pub fn kind_of(e: &anyhow::Error) -> Option<ErrorKind> {
    e.chain().find_map(|c| {
        if let Some(e) = engine_error(c) {
            return Some(e.kind());
        }
        c.downcast_ref::<craterdex_eval::Error>()
            .map(|e| e.kind())
            .or_else(|| {
                c.downcast_ref::<craterdex_workflows::Error>()
                    .map(|e| e.kind())
            })
            .or_else(|| c.downcast_ref::<craterdex_fetch::Error>().map(|e| e.kind()))
            .or_else(|| c.downcast_ref::<craterdex_model::Error>().map(|e| e.kind()))
            .or_else(|| c.downcast_ref::<craterdex_index::Error>().map(|e| e.kind()))
            .or_else(|| c.downcast_ref::<IoError>().map(|e| e.kind()))
    })
}

/// What to type instead, for the failures whose remedy is an option of this command line.
pub fn hint(e: &anyhow::Error) -> Option<String> {
    e.chain().find_map(|c| match engine_error(c)? {
        craterdex_engine::Error::Orientation { built, .. } => Some(format!(
            "search it with --orient {}, as it was built",
            built.name()
        )),
        craterdex_engine::Error::Brightness { built, .. } => Some(format!(
            "search it with --brightness {}, as it was built (indexes built before brightness \
             was standardised by default need --brightness as-is, or a rebuild)",
            built.name()
        )),
        craterdex_engine::Error::NoModel(_) => {
            Some("give --model (or leave it out for the default model)".into())
        }
        _ => None,
    })
}

/// Prints the failure and returns the exit code.
pub fn report(e: &anyhow::Error) -> i32 {
    eprintln!("error: {e:#}");
    if let Some(h) = hint(e) {
        eprintln!("hint: {h}");
    }
    exit_code(kind_of(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_documented_exit_code() {
        let help = crate::AFTER_HELP;
        let mut codes = std::collections::HashSet::from([0, FAILED, 2]);
        for (kind, words) in [
            (ErrorKind::InvalidInput, "invalid input"),
            (ErrorKind::NotFound, "not found"),
            (ErrorKind::Conflict, "conflict"),
            (ErrorKind::Corrupt, "corrupt data"),
            (ErrorKind::Unsupported, "unsupported"),
            (ErrorKind::Io, "I/O failure"),
        ] {
            let code = exit_code(Some(kind));
            assert!(codes.insert(code), "{kind} shares exit code {code}");
            assert!(help.contains(&format!("{code} {words}")), "{kind}: {help}");
        }
    }

    #[test]
    fn kinds_and_hints_are_found_inside_wrapped_errors() {
        let e = craterdex_engine::Error::Orientation {
            built: craterdex_engine::Orientation::Shading,
            loaded: craterdex_engine::Orientation::AsIs,
        };
        let wrapped = anyhow::Error::new(craterdex_workflows::Error::Engine(e)).context("search");
        assert_eq!(kind_of(&wrapped), Some(ErrorKind::InvalidInput));
        assert!(hint(&wrapped).unwrap().contains("--orient shading"));
        let missing = anyhow::Error::new(craterdex_index::Error::Conflict("taken".into()));
        assert_eq!(exit_code(kind_of(&missing)), 5);
        assert_eq!(exit_code(kind_of(&anyhow::anyhow!("other"))), FAILED);
    }
}
