//! craterdex-errors: what a user can do about a failure, shared by the error enums of every
//! library crate.
//!
//! Owns: [`ErrorKind`] (invalid input, not found, conflict, corrupt data, unsupported, I/O),
//! which each crate's `Error::kind` reports so that a front end maps kinds once (an HTTP
//! status, a Python exception class, an exit code), and [`IoError`], the one shape of a
//! failed file operation (what was done, to which path, and the system's reason). Knows
//! nothing of craterdex's data; messages built with these types name no front end's flags.

use std::path::{Path, PathBuf};

/// The kinds of failure users act on differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The input cannot be used as given: the message names the file or field and why.
    InvalidInput,
    /// What was asked for (an image id, a file, a model) is not there.
    NotFound,
    /// The request clashes with what exists (an id already taken).
    Conflict,
    /// Stored data does not check out (a truncated or altered index file): the message
    /// names the file; rebuild or restore it.
    Corrupt,
    /// Valid, but not supported here (this CPU, this build, this kind of index).
    Unsupported,
    /// A file or network operation failed.
    Io,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 6] = [
        ErrorKind::InvalidInput,
        ErrorKind::NotFound,
        ErrorKind::Conflict,
        ErrorKind::Corrupt,
        ErrorKind::Unsupported,
        ErrorKind::Io,
    ];

    /// The kind's name in machine-readable outputs (`invalid_input`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Io => "io",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Every craterdex error says what kind of failure it is.
pub trait HasKind {
    fn kind(&self) -> ErrorKind;
}

/// A file operation that failed: `[context: ]cannot <action> <path>: <reason>`.
#[derive(Debug, thiserror::Error)]
#[error("{}cannot {action} {}: {io}", context.as_ref().map(|c| format!("{c}: ")).unwrap_or_default(), path.display())]
pub struct IoError {
    pub action: &'static str,
    pub path: PathBuf,
    pub io: std::io::Error,
    /// What the operation was for, when the caller said.
    pub context: Option<String>,
}

impl IoError {
    pub fn new(action: &'static str, path: &Path, io: std::io::Error) -> Self {
        Self {
            action,
            path: path.to_path_buf(),
            io,
            context: None,
        }
    }
}

impl HasKind for IoError {
    /// What the user can do: a missing file is not found, anything else an I/O failure.
    fn kind(&self) -> ErrorKind {
        match self.io.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            _ => ErrorKind::Io,
        }
    }
}

/// Names the path and the action of a failed `std::io` call.
pub trait IoContext<T> {
    fn io(self, action: &'static str, path: &Path) -> Result<T, IoError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn io(self, action: &'static str, path: &Path) -> Result<T, IoError> {
        self.map_err(|e| IoError::new(action, path, e))
    }
}

/// Errors whose message can take a prefix saying where they happened, keeping their kind.
pub trait Prefix: Sized {
    fn prefixed(self, prefix: &str) -> Self;
}

impl Prefix for IoError {
    fn prefixed(self, prefix: &str) -> Self {
        let context = Some(match self.context {
            Some(c) => crate::prefix(prefix, &c),
            None => prefix.to_string(),
        });
        Self { context, ..self }
    }
}

/// `context` for results of errors that take a prefix (the typed form of anyhow's).
pub trait ResultExt<T, E> {
    fn context(self, c: impl std::fmt::Display) -> Result<T, E>;
    fn with_context<D: std::fmt::Display>(self, f: impl FnOnce() -> D) -> Result<T, E>;
}

impl<T, E: Prefix> ResultExt<T, E> for Result<T, E> {
    fn context(self, c: impl std::fmt::Display) -> Result<T, E> {
        self.map_err(|e| e.prefixed(&c.to_string()))
    }
    fn with_context<D: std::fmt::Display>(self, f: impl FnOnce() -> D) -> Result<T, E> {
        self.map_err(|e| e.prefixed(&f().to_string()))
    }
}

/// An invalid-input message from a foreign error or a missing value; every crate's error
/// converts it into its invalid-input variant, so `?` takes it there.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// `or_invalid`: a foreign error (its text appended) or a missing value as an [`Invalid`]
/// message that names what was being read.
pub trait OrInvalid<T> {
    fn or_invalid(self, what: impl std::fmt::Display) -> Result<T, Invalid>;
    fn or_invalid_with<D: std::fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T, Invalid>;
}

impl<T, E: std::fmt::Display> OrInvalid<T> for Result<T, E> {
    fn or_invalid(self, what: impl std::fmt::Display) -> Result<T, Invalid> {
        self.map_err(|e| Invalid(format!("{what}: {e}")))
    }
    fn or_invalid_with<D: std::fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T, Invalid> {
        self.map_err(|e| Invalid(format!("{}: {e}", what())))
    }
}

impl<T> OrInvalid<T> for Option<T> {
    fn or_invalid(self, what: impl std::fmt::Display) -> Result<T, Invalid> {
        self.ok_or_else(|| Invalid(what.to_string()))
    }
    fn or_invalid_with<D: std::fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T, Invalid> {
        self.ok_or_else(|| Invalid(what().to_string()))
    }
}

/// Parses an option value: one of `variants` as they display (their one spelling), or one of
/// the older `aliases`; otherwise an [`Invalid`] naming the option and every value it takes.
pub fn parse_named<T: Copy + std::fmt::Display>(
    what: &str,
    s: &str,
    variants: impl IntoIterator<Item = T>,
    aliases: &[(&str, T)],
) -> Result<T, Invalid> {
    let s = s.trim();
    let variants: Vec<T> = variants.into_iter().collect();
    variants
        .iter()
        .copied()
        .find(|v| v.to_string().eq_ignore_ascii_case(s))
        .or_else(|| {
            aliases
                .iter()
                .find(|(a, _)| a.eq_ignore_ascii_case(s))
                .map(|(_, v)| *v)
        })
        .ok_or_else(|| {
            let names: Vec<String> = variants.iter().map(|v| v.to_string()).collect();
            Invalid(format!("unknown {what} {s:?}: use {}", one_of(&names)))
        })
}

/// `a, b or c`.
pub fn one_of(names: &[String]) -> String {
    match names {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// Returns early with `err` (converted into the function's error) unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $err:expr $(,)?) => {
        if !$cond {
            return Err($err.into());
        }
    };
}

/// A crate error enum's [`HasKind`], [`Prefix`] and `From<`[`Invalid`]`>`, from one table
/// of its variants: messages (`Variant(String)`) with their kind, wrapped errors that know
/// their own kind and take the prefix themselves, and whole variants (any pattern) whose
/// message is complete as it is. The enum needs an `Invalid(String)` variant.
///
/// ```text
/// craterdex_errors::error_kinds!(Error {
///     messages: { Invalid => InvalidInput, Corrupt => Corrupt },
///     wrapped: { Tokens, Io },
///     whole: { Error::InMemory => Unsupported },
/// });
/// ```
#[macro_export]
macro_rules! error_kinds {
    ($ty:ident {
        messages: { $($message:ident => $message_kind:ident),* $(,)? }
        $(, wrapped: { $($wrapped:ident),* $(,)? })?
        $(, whole: { $($whole:pat => $whole_kind:ident),* $(,)? })?
        $(,)?
    }) => {
        impl $crate::HasKind for $ty {
            fn kind(&self) -> $crate::ErrorKind {
                match self {
                    $($ty::$message(_) => $crate::ErrorKind::$message_kind,)*
                    $($($ty::$wrapped(e) => $crate::HasKind::kind(e),)*)?
                    $($($whole => $crate::ErrorKind::$whole_kind,)*)?
                }
            }
        }

        impl $crate::Prefix for $ty {
            fn prefixed(self, p: &str) -> Self {
                match self {
                    $($ty::$message(m) => $ty::$message($crate::prefix(p, &m)),)*
                    $($($ty::$wrapped(e) => $ty::$wrapped($crate::Prefix::prefixed(e, p)),)*)?
                    $($(e @ $whole => e,)*)?
                }
            }
        }

        impl From<$crate::Invalid> for $ty {
            fn from(e: $crate::Invalid) -> Self {
                $ty::Invalid(e.0)
            }
        }
    };
}

/// `prefix: message`, the shape every prefixed message takes.
pub fn prefix(prefix: &str, message: &str) -> String {
    format!("{prefix}: {message}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_name_action_path_and_reason_and_missing_files_are_not_found() {
        let p = Path::new("/nonexistent/craterdex/x.json");
        let e = std::fs::read(p).io("read", p).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("cannot read /nonexistent/craterdex/x.json: "),
            "{text}"
        );
        assert_eq!(e.kind(), ErrorKind::NotFound);
        let denied = IoError::new(
            "write",
            p,
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        assert_eq!(denied.kind(), ErrorKind::Io);
    }

    #[test]
    fn option_values_parse_by_name_or_alias_and_errors_list_every_value() {
        #[derive(Clone, Copy, Debug, PartialEq)]
        enum Fruit {
            Apple,
            Pear,
        }
        impl std::fmt::Display for Fruit {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self {
                    Fruit::Apple => "apple",
                    Fruit::Pear => "pear",
                })
            }
        }
        let all = [Fruit::Apple, Fruit::Pear];
        let aliases = [("malus", Fruit::Apple)];
        assert_eq!(
            parse_named("fruit", "PEAR ", all, &aliases).unwrap(),
            Fruit::Pear
        );
        assert_eq!(
            parse_named("fruit", "malus", all, &aliases).unwrap(),
            Fruit::Apple
        );
        let e = parse_named("fruit", "plum", all, &aliases).unwrap_err();
        assert_eq!(e.to_string(), "unknown fruit \"plum\": use apple or pear");
        assert_eq!(one_of(&["a".into(), "b".into(), "c".into()]), "a, b or c");
    }

    #[derive(Debug, thiserror::Error)]
    enum Sample {
        #[error("{0}")]
        Invalid(String),
        #[error("{0}")]
        Corrupt(String),
        #[error("gone")]
        Gone,
        #[error(transparent)]
        Io(#[from] IoError),
    }

    crate::error_kinds!(Sample {
        messages: { Invalid => InvalidInput, Corrupt => Corrupt },
        wrapped: { Io },
        whole: { Sample::Gone => NotFound },
    });

    #[test]
    fn error_kinds_gives_each_variant_its_kind_and_prefixes_only_messages_and_wrapped() {
        let from_invalid: Sample = Invalid("bad width".into()).into();
        assert_eq!(from_invalid.kind(), ErrorKind::InvalidInput);
        let e = from_invalid.prefixed("a.json");
        assert_eq!(e.to_string(), "a.json: bad width");
        let e = Sample::Corrupt("checksum".into()).prefixed("x");
        assert_eq!(
            (e.kind(), e.to_string().as_str()),
            (ErrorKind::Corrupt, "x: checksum")
        );
        let e = Sample::Gone.prefixed("x");
        assert_eq!(
            (e.kind(), e.to_string().as_str()),
            (ErrorKind::NotFound, "gone")
        );
        let p = Path::new("/nonexistent/craterdex/y");
        let io: Sample = std::fs::read(p).io("read", p).unwrap_err().into();
        let e = io.prefixed("loading");
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(e.to_string().contains("loading"), "{e}");
    }

    #[test]
    fn kind_names_are_distinct() {
        let names: std::collections::HashSet<&str> =
            ErrorKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), ErrorKind::ALL.len());
    }
}
