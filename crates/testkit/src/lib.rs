//! craterdex-testkit: what the test suites share, and nothing a user's build links.
//!
//! Owns: reporting tests that cannot run here. Rust's test harness has no run-time skip, so
//! a test that would test nothing on this machine (AMX tiles absent, model unavailable)
//! returns early after [`skip`], which says why on stderr and appends one line to the file
//! named by `CRATERDEX_SKIP_LOG`; CI prints that file. Also: reading a generated page as a
//! browser's parser does ([`parsed_page`]), and a link rule file for tests whose tiny models'
//! appearance means nothing ([`REGISTERED_GEOMETRY_RULE`], as JSON text). Links none of
//! craterdex's crates.

use std::io::Write;

/// A link rule that decides by registered geometry alone (a crater within a radius of its
/// registered catalogue position, of similar size, is a match; appearance weighs nothing): for
/// tests whose tiny generated models give appearance scores that mean nothing.
pub const REGISTERED_GEOMETRY_RULE: &str = r#"{"match_confidence":0.5,"new_confidence":0.4,
    "max_offset_radii":3.0,"max_diameter_ratio":1.5,"body_radius_km":3396.19,
    "appearance_weights":[10.0,0.0],"geometry_weights":[-10.0,0.0,0.0,0.0],
    "registered":{"max_offset_radii":1.0,"max_diameter_ratio":1.5,"weights":[10.0,0.0,-20.0,-20.0]},
    "source":"test"}"#;

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

/// One element of a [`Page`]: its name, attributes, text (its own and its descendants') and
/// its ancestors (indices into the page's elements, nearest last).
#[derive(Clone, Debug)]
pub struct Element {
    pub name: String,
    pub attributes: std::collections::BTreeMap<String, String>,
    pub text: String,
    pub ancestors: Vec<usize>,
}

/// A generated HTML page read as a browser's tokenizer reads it, elements nested by their
/// tags.
pub struct Page {
    pub elements: Vec<Element>,
}

/// Elements that have no end tag.
const VOID: [&str; 8] = ["br", "hr", "img", "meta", "link", "input", "source", "wbr"];

/// `html` tokenized by the WHATWG tokenizer (raw text in `style`, `script` and `title`);
/// panics on any tokenizer error and on an end tag that does not close the open element, so
/// a page whose text broke out of its markup fails.
pub fn parsed_page(html: &str) -> Page {
    use html5gum::{DefaultEmitter, Token, Tokenizer};
    let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut emitter = DefaultEmitter::default();
    emitter.naively_switch_states(true);
    let tokenizer = Tokenizer::new_with_emitter(html, emitter);
    let mut elements: Vec<Element> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    for token in tokenizer {
        let Ok(token) = token;
        match token {
            Token::Error(e) => panic!("the page does not tokenize cleanly: {e:?}\n{html}"),
            Token::StartTag(tag) => {
                let name = s(&tag.name);
                elements.push(Element {
                    attributes: tag.attributes.iter().map(|(k, v)| (s(k), s(v))).collect(),
                    text: String::new(),
                    ancestors: open.clone(),
                    name: name.clone(),
                });
                if !tag.self_closing && !VOID.contains(&name.as_str()) {
                    open.push(elements.len() - 1);
                }
            }
            Token::EndTag(tag) => {
                let name = s(&tag.name);
                let top = open.pop().map(|i| elements[i].name.clone());
                assert_eq!(
                    top.as_deref(),
                    Some(name.as_str()),
                    "</{name}> closes {top:?}\n{html}"
                );
            }
            Token::String(text) => {
                let text = s(&text);
                for &i in &open {
                    elements[i].text.push_str(&text);
                }
            }
            Token::Comment(_) | Token::Doctype(_) => {}
        }
    }
    let unclosed: Vec<&str> = open.iter().map(|&i| elements[i].name.as_str()).collect();
    assert!(unclosed.is_empty(), "elements left open: {unclosed:?}");
    Page { elements }
}

/// Whether `e` is `compound`: `tag`, `.class` or `tag.class`.
fn is(e: &Element, compound: &str) -> bool {
    let (tag, class) = compound.split_once('.').unwrap_or((compound, ""));
    (tag.is_empty() || e.name == tag)
        && (class.is_empty()
            || e.attributes
                .get("class")
                .is_some_and(|c| c.split_whitespace().any(|c| c == class)))
}

impl Page {
    /// The elements matching `selector`: compounds (`tag`, `.class`, `tag.class`) separated
    /// by spaces, each after the one before it among the element's ancestors.
    pub fn select(&self, selector: &str) -> Vec<&Element> {
        let parts: Vec<&str> = selector.split_whitespace().collect();
        let Some((last, outer)) = parts.split_last() else {
            return Vec::new();
        };
        self.elements
            .iter()
            .filter(|e| is(e, last))
            .filter(|e| {
                let mut wanted = outer.iter().peekable();
                for &a in &e.ancestors {
                    if wanted.peek().is_some_and(|w| is(&self.elements[a], w)) {
                        wanted.next();
                    }
                }
                wanted.peek().is_none()
            })
            .collect()
    }

    /// The text of every element matching `selector`, in document order.
    pub fn texts(&self, selector: &str) -> Vec<String> {
        self.select(selector)
            .iter()
            .map(|e| e.text.clone())
            .collect()
    }

    /// The value of `attribute` on every element matching `selector` that has it.
    pub fn attributes(&self, selector: &str, attribute: &str) -> Vec<String> {
        self.select(selector)
            .iter()
            .filter_map(|e| e.attributes.get(attribute).cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_page_is_read_with_its_nesting_and_broken_markup_fails() {
        let page = parsed_page(
            "<!DOCTYPE html><html><head><title>a &amp; b</title></head><body>\
             <table class=\"run x\"><tr><th>k</th><td>v<br>w</td></tr></table>\
             <p><img alt=\"q&quot;>\"></p></body></html>",
        );
        assert_eq!(page.texts("head title"), vec!["a & b"]);
        assert_eq!(page.texts("table.run th"), vec!["k"]);
        assert_eq!(page.texts("table td"), vec!["vw"]);
        assert!(page.texts("table.other td").is_empty());
        assert_eq!(page.attributes("p img", "alt"), vec!["q\">"]);
        // text that closed an element it was not in, and an unterminated attribute
        for broken in ["<p><b>x</p></b>", "<div><img alt=\"x></div>", "<div>"] {
            let r = std::panic::catch_unwind(|| parsed_page(broken));
            assert!(r.is_err(), "{broken} was read as clean");
        }
    }
}
