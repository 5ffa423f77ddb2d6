//! The web page every front end of this API answers at `/`, and the headers it is answered
//! with: its content security policy names its own inline script and style by hash.

use base64::Engine as _;
use sha2::{Digest, Sha256};
use std::sync::OnceLock;

/// The page.
pub const PAGE: &str = include_str!("page.html");

/// The headers the page is served with (its content security policy and those every
/// response carries): what another front end of this API serves it with too.
pub fn page_headers() -> Vec<(&'static str, String)> {
    vec![
        ("content-security-policy", page_policy().to_string()),
        ("x-content-type-options", "nosniff".into()),
        ("x-frame-options", "DENY".into()),
        ("referrer-policy", "no-referrer".into()),
    ]
}

/// The page's content security policy: its own inline script and style, by their hashes,
/// images from the server and from the chosen file, requests to the server only.
pub fn page_policy() -> &'static str {
    static POLICY: OnceLock<String> = OnceLock::new();
    POLICY.get_or_init(|| {
        let hash = |open: &str, close: &str| {
            let inner = PAGE
                .split_once(open)
                .and_then(|(_, rest)| rest.split_once(close))
                .map_or("", |(inner, _)| inner);
            let digest = Sha256::digest(inner.as_bytes());
            format!(
                "'sha256-{}'",
                base64::engine::general_purpose::STANDARD.encode(digest)
            )
        };
        format!(
            "default-src 'none'; script-src {}; style-src {}; img-src 'self' data: blob:; \
             connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            hash("<script>", "</script>"),
            hash("<style>", "</style>")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_policy_names_its_script_and_style_by_hash() {
        let p = page_policy();
        assert_eq!(p.matches("'sha256-").count(), 2, "{p}");
        assert!(!p.contains("unsafe-inline"), "{p}");
    }
}
