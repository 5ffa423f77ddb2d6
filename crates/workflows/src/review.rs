//! The review pages a person signs decisions off on (`review.html` of `link` and of
//! `dedup`): self-contained HTML, crops inline, written as maud templates so that ids and
//! paths holding `"<>&'` stay text.

use crate::dedup::DedupGroup;
use crate::error::Result;
use crate::images::{FoundBy, ImageDecision, ImageLinks, ObservedImage};
use crate::link::{Candidate, Decision, LinkRow};
use crate::register::SourceRegistration;
use craterdex_detect::GrayImage;
use craterdex_errors::IoContext;
use craterdex_index::ImageMeta;
use maud::{html, Markup, PreEscaped, DOCTYPE};
use std::path::Path;
use std::sync::Arc;

/// Inlier residuals beyond this many radii are drawn at the plot's edge.
const RESIDUAL_PLOT_RADII: f64 = 1.0;

/// An SVG scatter of one registration's inlier residuals (dx, dy in radii of the catalogue
/// crater), with the inlier tolerance (one radius) and the median residual as circles.
fn residual_plot(r: &SourceRegistration) -> Markup {
    let (size, half) = (160.0, 70.0);
    let k = half / RESIDUAL_PLOT_RADII;
    let c = size / 2.0;
    let clamp = |v: f64| v.clamp(-RESIDUAL_PLOT_RADII, RESIDUAL_PLOT_RADII) * k;
    html! {
        svg width=(size) height=(size) viewBox={ "0 0 " (size) " " (size) } {
            rect width=(size) height=(size) fill="#fafafa" stroke="#ccc" {}
            line x1=(c) y1="0" x2=(c) y2=(size) stroke="#ddd" {}
            line x1="0" y1=(c) x2=(size) y2=(c) stroke="#ddd" {}
            circle cx=(c) cy=(c) r=(half) fill="none" stroke="#999" stroke-dasharray="3 3" {}
            @if let Some(m) = r.residual_radii {
                circle cx=(c) cy=(c) r=(format!("{:.1}", (m * k).min(half))) fill="none" stroke="#070" {}
            }
            @for &(dx, dy) in &r.residuals {
                circle cx=(format!("{:.1}", c + clamp(dx))) cy=(format!("{:.1}", c + clamp(dy)))
                    r="1.6" fill="#00a" fill-opacity="0.5" {}
            }
        }
    }
}

/// The registration section of a review page: one line per source and, for each registered
/// one, its residual plot.
fn registration_section(regs: &[Arc<SourceRegistration>]) -> Markup {
    if regs.is_empty() {
        return html! {};
    }
    let registered = regs.iter().filter(|r| r.registered).count();
    html! {
        h2 { "Registration to the catalogue" }
        p {
            (registered) " of " (regs.len()) " sources registered by their crater pattern; the \
            others keep their positions as given. Plots: each inlier's offset after the \
            transform, in radii of its catalogue crater (dashed: the one-radius tolerance; \
            green: the median)."
        }
        div {
            @for r in regs {
                figure style="display:inline-block;width:220px;vertical-align:top;margin:0 12px 12px 0" {
                    figcaption { b { (r.source.as_deref().unwrap_or("(no source)")) } }
                    @if r.registered {
                        (residual_plot(r))
                    } @else {
                        div class="none" style="width:160px;height:160px;line-height:160px" { "not registered" }
                    }
                    br;
                    (r.summary())
                }
            }
        }
    }
}

/// An image's crop, or a grey square saying there is none.
fn picture(meta: Option<&ImageMeta>) -> Markup {
    match meta.and_then(|m| craterdex_engine::data_uri(Path::new(m.path.as_deref()?))) {
        Some(uri) => html! { img src=(uri) width="128" height="128"; },
        None => html! { div class="none" { "no image" } },
    }
}

/// A candidate's id, score and geometry, or "none".
fn candidate_label(c: Option<&Candidate>) -> Markup {
    match c {
        None => html! { "none" },
        Some(c) => html! {
            (c.id) br; "score " (format!("{:.3}", c.score))
            @if let Some(o) = c.offset_radii {
                br; (format!("offset {o:.2} radii, diameter ratio {:.2}", c.diameter_ratio.unwrap_or(f64::NAN)))
            }
        },
    }
}

const LINK_STYLE: &str = "body{font:14px sans-serif;margin:2em}table{border-collapse:collapse}\
td{border-top:1px solid #ccc;padding:6px;vertical-align:top}\
.none{width:128px;height:128px;background:#eee;color:#888;text-align:center;line-height:128px}\
.ambiguous{color:#b60}.match{color:#070}.new{color:#00a}";

/// The link review page: the decisions a person should look at, side by side (query, best
/// candidate, best candidate of another crater), ambiguous ones first, then the matches and
/// new craters nearest their thresholds; at most `limit` rows.
pub fn link_review_page(rows: &[LinkRow], limit: usize) -> String {
    let mut order: Vec<&LinkRow> = rows.iter().collect();
    // ambiguous first; within a kind, the least certain (confidence nearest 0.5) first
    let kind = |r: &LinkRow| match r.decision {
        Decision::Ambiguous => 0,
        Decision::Match => 1,
        Decision::New => 2,
    };
    order.sort_by(|a, b| {
        kind(a).cmp(&kind(b)).then(
            (a.confidence - 0.5)
                .abs()
                .total_cmp(&(b.confidence - 0.5).abs()),
        )
    });
    let counts = crate::calibrate::decision_counts(rows)
        .iter()
        .map(|(d, n)| format!("{n} {}", d.name()))
        .collect::<Vec<_>>()
        .join(", ");
    html! {
        (DOCTYPE)
        meta charset="utf-8";
        title { "craterdex link review" }
        style { (PreEscaped(LINK_STYLE)) }
        h1 { "Link decisions to review" }
        (registration_section(&crate::link::registrations(rows)))
        p {
            (rows.len()) " entries: " (counts) ". Shown: " (order.len().min(limit))
            " rows, ambiguous first, then the least certain."
        }
        table {
            tr { th { "entry" } th { "best candidate" } th { "other crater" } th { "evidence" } }
            @for r in order.into_iter().take(limit) {
                @let (best, second) = (r.best.as_ref(), r.second.as_ref());
                tr {
                    td { (picture(Some(&r.query))) br; (r.query.id) }
                    td { (picture(best.map(|c| &c.meta))) br; (candidate_label(best)) }
                    td { (picture(second.map(|c| &c.meta))) br; (candidate_label(second)) }
                    td class=(r.decision.name()) {
                        b { (r.decision.name()) } br; "confidence " (format!("{:.3}", r.confidence))
                    }
                }
            }
        }
    }
    .into_string()
}

/// `review.html` in `dir`: [`link_review_page`].
pub fn write_review(dir: &Path, rows: &[LinkRow], limit: usize) -> Result<()> {
    std::fs::create_dir_all(dir).io("create", dir)?;
    Ok(craterdex_durable::write_atomic(
        &dir.join("review.html"),
        link_review_page(rows, limit).as_bytes(),
    )?)
}

const DEDUP_STYLE: &str =
    "body{font:14px sans-serif;margin:2em}.group{border-top:1px solid #ccc;padding:8px 0}\
figure{display:inline-block;margin:0 8px 0 0;text-align:center}\
.keep img{outline:3px solid #070}.none{width:128px;height:128px;background:#eee;\
color:#888;text-align:center;line-height:128px}";

/// The dedup review page: the groups a person should sign off, weakest first (by the least
/// confident pair that joined the group), each member's crop side by side with the proposed
/// survivor marked; at most `limit` groups.
pub fn dedup_review_page(
    groups: &[DedupGroup],
    regs: &[Arc<SourceRegistration>],
    limit: usize,
) -> String {
    let weakest = |g: &DedupGroup| g.pairs.iter().map(|p| p.2).fold(f32::INFINITY, f32::min);
    let mut order: Vec<&DedupGroup> = groups.iter().collect();
    order.sort_by(|a, b| weakest(a).total_cmp(&weakest(b)));
    html! {
        (DOCTYPE)
        meta charset="utf-8";
        title { "craterdex dedup review" }
        style { (PreEscaped(DEDUP_STYLE)) }
        h1 { "Duplicate groups to review" }
        p {
            (groups.len()) " groups; shown: " (order.len().min(limit)) ", the least certain \
            first. The proposed surviving entry is outlined."
        }
        (registration_section(regs))
        @for g in order.into_iter().take(limit) {
            div class="group" {
                p {
                    "weakest pair confidence " (format!("{:.3}", weakest(g))) " ("
                    @for (i, (a, b, s)) in g.pairs.iter().enumerate() {
                        @if i > 0 { "; " }
                        (g.members[*a].id) " - " (g.members[*b].id) ": " (format!("{s:.3}"))
                    }
                    ")"
                }
                @for (i, m) in g.members.iter().enumerate() {
                    figure class=(if i == g.survivor { "keep" } else { "" }) {
                        (picture(Some(m)))
                        figcaption { (m.id) }
                    }
                }
            }
        }
    }
    .into_string()
}

/// `review.html` of a dedup in `dir`: [`dedup_review_page`].
pub fn write_dedup_review(
    dir: &Path,
    groups: &[DedupGroup],
    regs: &[Arc<SourceRegistration>],
    limit: usize,
) -> Result<()> {
    std::fs::create_dir_all(dir).io("create", dir)?;
    Ok(craterdex_durable::write_atomic(
        &dir.join("review.html"),
        dedup_review_page(groups, regs, limit).as_bytes(),
    )?)
}

const IMAGE_STYLE: &str = "body{font:14px sans-serif;margin:2em}figure{margin:0 0 2em 0}\
svg{max-width:100%;height:auto;background:#000}.legend span{margin-right:1.5em}";

/// Decisions' colours on the image review page (legible on grey images).
fn decision_colour(d: ImageDecision) -> &'static str {
    match d {
        ImageDecision::Match => "#2ecc40",
        ImageDecision::New => "#ff851b",
        ImageDecision::Ambiguous => "#ffdc00",
        ImageDecision::Unconfirmed => "#aaaaaa",
    }
}

/// Longest side of an image as drawn on the review page.
const REVIEW_IMAGE_SIDE: usize = 1200;

/// `image` shrunk to at most [`REVIEW_IMAGE_SIDE`] a side, as a PNG `data:` URI, and the
/// factor it was shrunk by.
fn image_uri(image: &GrayImage) -> Result<(String, f64)> {
    let (w, h) = (image.width as u32, image.height as u32);
    let full = image::GrayImage::from_raw(w, h, image.pixels.clone())
        .ok_or_else(|| crate::Error::Invalid("an image's pixels do not fill it".into()))?;
    let k = (REVIEW_IMAGE_SIDE as f64 / image.width.max(image.height) as f64).min(1.0);
    let shown = if k < 1.0 {
        let side = |n: u32| ((n as f64 * k).round() as u32).max(1);
        let filter = image::imageops::FilterType::Triangle;
        image::imageops::resize(&full, side(w), side(h), filter)
    } else {
        full
    };
    let mut png = std::io::Cursor::new(Vec::new());
    shown
        .write_to(&mut png, image::ImageFormat::Png)
        .map_err(|e| crate::Error::Invalid(format!("cannot draw an image for review: {e}")))?;
    Ok((craterdex_engine::data_uri_of("image/png", png.get_ref()), k))
}

/// The review page of `link --image`: each image with every crater looked at drawn as a
/// circle coloured by its decision (dashed where the registration placed a catalogue crater
/// the detector had missed), its registration, and what was found.
pub fn image_review_page(links: &ImageLinks, images: &[ObservedImage]) -> Result<String> {
    let mut pictures = Vec::with_capacity(images.len());
    for im in images {
        pictures.push(image_uri(im.image)?);
    }
    let regs = crate::images::image_registrations(links);
    let decisions = [
        ImageDecision::Match,
        ImageDecision::New,
        ImageDecision::Ambiguous,
        ImageDecision::Unconfirmed,
    ];
    Ok(html! {
        (DOCTYPE)
        meta charset="utf-8";
        title { "craterdex: craters of new images linked to the catalogue" }
        style { (PreEscaped(IMAGE_STYLE)) }
        h1 { "Craters of new images, linked to the catalogue" }
        p class="legend" {
            @for d in decisions {
                span style={ "color:" (decision_colour(d)) ";font-weight:bold" } { "\u{25CB} " (d.name()) }
            }
            span {
                "solid: found by the detector; dashed: a catalogue crater looked for where the \
                 registration places it"
            }
        }
        (registration_section(&regs))
        @for (im, (uri, k)) in images.iter().zip(&pictures) {
            @let summary = links.images.iter().find(|s| s.image == im.source);
            @let (w, h) = ((im.image.width as f64 * k).round(), (im.image.height as f64 * k).round());
            figure {
                figcaption {
                    b { (im.source) } " (" (im.image.width) " x " (im.image.height) " px)"
                    @if let Some(s) = summary {
                        ": " (s.detections) " craters detected, " (s.looked_for)
                        " catalogue craters looked for in place; " (s.matched) " matched, "
                        (s.new) " new"
                        @if let Some(n) = &s.note { br; i { (n) } }
                    }
                }
                svg width=(w) height=(h) viewBox={ "0 0 " (w) " " (h) } {
                    image href=(uri) width=(w) height=(h) {}
                    @for c in links.craters.iter().filter(|c| c.image == im.source) {
                        circle cx=(format!("{:.1}", c.x * k)) cy=(format!("{:.1}", c.y * k))
                            r=(format!("{:.1}", (c.diameter_px * k / 2.0).max(1.5)))
                            fill="none" stroke=(decision_colour(c.decision)) stroke-width="1.5"
                            stroke-dasharray=(if c.found_by == FoundBy::Catalogue { "4 3" } else { "none" }) {
                            title {
                                (c.link.query.id) ": " (c.decision.name())
                                @if let Some(b) = &c.link.best {
                                    ", best " (b.id) (format!(" (confidence {:.3})", c.link.confidence))
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    .into_string())
}

/// `review.html` of `link --image` in `dir`: [`image_review_page`].
pub fn write_image_review(dir: &Path, links: &ImageLinks, images: &[ObservedImage]) -> Result<()> {
    std::fs::create_dir_all(dir).io("create", dir)?;
    Ok(craterdex_durable::write_atomic(
        &dir.join("review.html"),
        image_review_page(links, images)?.as_bytes(),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::register::FrameKind;
    use craterdex_testkit::parsed_page;

    const HOSTILE: &str = "q\"><script>alert('x')</script>&";

    fn meta(id: &str) -> ImageMeta {
        ImageMeta {
            id: id.into(),
            source: Some(HOSTILE.into()),
            ..Default::default()
        }
    }

    fn candidate(id: &str) -> Candidate {
        Candidate {
            id: id.into(),
            crater_id: Some(id.into()),
            score: 0.5,
            offset_radii: Some(0.2),
            diameter_ratio: Some(1.1),
            registered: true,
            confidence: 0.6,
            meta: meta(id),
        }
    }

    fn registration() -> Arc<SourceRegistration> {
        Arc::new(SourceRegistration {
            source: Some(HOSTILE.into()),
            frame: FrameKind::Pixels,
            origin: None,
            entries: 10,
            catalogue: 12,
            registered: false,
            transform: None,
            rotation_deg: None,
            scale: None,
            inliers: 0,
            residual_radii: None,
            chance_inliers: None,
            false_alarm: None,
            reason: Some(format!("no pattern in {HOSTILE}")),
            residuals: vec![],
            proposed: None,
        })
    }

    #[test]
    fn ids_with_quotes_and_brackets_stay_text_in_the_link_review() {
        let row = LinkRow {
            query: meta(HOSTILE),
            decision: Decision::Ambiguous,
            confidence: 0.5,
            best: Some(candidate(&format!("best {HOSTILE}"))),
            second: Some(candidate(&format!("second {HOSTILE}"))),
            inserted: false,
            candidates: vec![],
            registration: Some(registration()),
        };
        let html = link_review_page(&[row], 10);
        assert!(!html.contains("<script>"), "{html}");
        let page = parsed_page(&html);
        assert!(page.texts("script").is_empty());
        let cells = page.texts("td");
        assert!(cells[0].ends_with(HOSTILE), "{cells:?}");
        assert!(
            cells[1].starts_with(&format!("no imagebest {HOSTILE}score 0.500")),
            "{cells:?}"
        );
        assert!(
            cells[2].starts_with(&format!("no imagesecond {HOSTILE}")),
            "{cells:?}"
        );
        assert_eq!(page.attributes("td", "class"), vec!["ambiguous"]);
        assert_eq!(page.texts("figcaption b"), vec![HOSTILE]);
        assert!(page.texts("figure")[0].contains(&format!("no pattern in {HOSTILE}")));
    }

    #[test]
    fn ids_with_quotes_and_brackets_stay_text_in_the_dedup_review() {
        let group = DedupGroup {
            members: vec![meta(HOSTILE), meta(&format!("{HOSTILE} 2"))],
            survivor: 1,
            pairs: vec![(0, 1, 0.75)],
        };
        let html = dedup_review_page(&[group], &[registration()], 10);
        let page = parsed_page(&html);
        assert!(page.texts("script").is_empty());
        assert_eq!(
            page.texts(".group figcaption"),
            vec![HOSTILE.to_string(), format!("{HOSTILE} 2")]
        );
        assert_eq!(
            page.texts(".group p"),
            vec![format!(
                "weakest pair confidence 0.750 ({HOSTILE} - {HOSTILE} 2: 0.750)"
            )]
        );
        assert_eq!(page.attributes(".group figure", "class"), vec!["", "keep"]);
    }
}
