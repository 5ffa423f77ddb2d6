//! Frames: which frame each source's positions were registered in (one image's pixels, or
//! km on the tangent plane of the body), and placing its craters in the catalogue's.

use super::matching::{bounds, seed_scale};
use super::{register, register_seeded, Crater, RegisterOptions, Transform};
use crate::geometry::Position;
use craterdex_index::{ImageMeta, Index};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

/// The frame a source's positions were registered in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum FrameKind {
    /// `x`, `y`, `diameter_px` of one image frame.
    Pixels,
    /// `lat`, `lon`, `diameter_km`, registered in km on the tangent plane at `origin`.
    Body,
}

/// What registering one source image (the entries sharing a `source`) found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SourceRegistration {
    /// The entries' `source`; None for entries without one (registered together).
    pub source: Option<String>,
    pub frame: FrameKind,
    /// Tangent-plane origin (lat, lon) of a body frame.
    pub origin: Option<(f64, f64)>,
    /// Entries of the source with positions, and catalogue craters around them.
    pub entries: usize,
    pub catalogue: usize,
    pub registered: bool,
    /// Source frame to catalogue frame; present when registered.
    pub transform: Option<Transform>,
    pub rotation_deg: Option<f64>,
    pub scale: Option<f64>,
    pub inliers: usize,
    /// Median inlier offset after the transform, in radii.
    pub residual_radii: Option<f64>,
    pub chance_inliers: Option<f64>,
    pub false_alarm: Option<f64>,
    /// Why the source was not registered (its entries keep their positions as given).
    pub reason: Option<String>,
    /// Each inlier's offset after the transform (dx, dy), in radii of its catalogue crater.
    #[serde(skip)]
    pub residuals: Vec<(f64, f64)>,
    /// Not registered: the best transform the crater pattern proposed, rejected as no more
    /// than chance could give, for other evidence to confirm (the appearance of the
    /// catalogue's craters where it places them).
    #[serde(skip)]
    pub proposed: Option<Transform>,
}

impl SourceRegistration {
    /// One line on what registration found: the transform and its evidence, or why the
    /// source was not registered.
    pub fn summary(&self) -> String {
        if self.registered {
            format!(
                "registered, rotation {:.2} deg, scale {:.4}, {} inliers of {} entries, median residual {:.3} radii",
                self.rotation_deg.unwrap_or(f64::NAN),
                self.scale.unwrap_or(f64::NAN),
                self.inliers,
                self.entries,
                self.residual_radii.unwrap_or(f64::NAN)
            )
        } else {
            format!(
                "not registered ({})",
                self.reason.as_deref().unwrap_or("no positions")
            )
        }
    }
}

/// Where each source's entries lie in the catalogue's frame. A source absent from the map
/// is in the catalogue's frame already (the catalogue's own entries).
#[derive(Clone, Debug, Default)]
pub struct Frames {
    enabled: bool,
    by_source: HashMap<Option<String>, Arc<SourceRegistration>>,
    body_radius_km: f64,
}

/// An entry as placed in the catalogue's frame.
pub struct Placed<'a> {
    pub meta: Cow<'a, ImageMeta>,
    /// Its position is in the catalogue's frame by registration (or was there already).
    pub registered: bool,
    pub registration: Option<&'a Arc<SourceRegistration>>,
}

/// `meta`'s crater in the planar frame, when it has a usable one ([`Crater::is_usable`]).
fn planar_of(meta: &ImageMeta, kind: FrameKind, origin: (f64, f64), r_km: f64) -> Option<Crater> {
    let c = match (kind, Position::of(meta)?) {
        (FrameKind::Pixels, Position::Frame { x, y, diameter_px }) => Some(Crater {
            x,
            y,
            d: diameter_px,
        }),
        (
            FrameKind::Body,
            Position::Body {
                lat,
                lon,
                diameter_km,
            },
        ) => {
            let k = r_km * std::f64::consts::PI / 180.0;
            let dlon = (lon - origin.1 + 540.0).rem_euclid(360.0) - 180.0;
            Some(Crater {
                x: dlon * origin.0.to_radians().cos() * k,
                y: (lat - origin.0) * k,
                d: diameter_km,
            })
        }
        _ => None,
    }?;
    c.is_usable().then_some(c)
}

fn unplanar(
    c: Crater,
    meta: &ImageMeta,
    kind: FrameKind,
    origin: (f64, f64),
    r_km: f64,
) -> ImageMeta {
    let mut m = meta.clone();
    match kind {
        FrameKind::Pixels => {
            (m.x, m.y, m.diameter_px) = (Some(c.x), Some(c.y), Some(c.d));
        }
        FrameKind::Body => {
            let k = r_km * std::f64::consts::PI / 180.0;
            let lat = origin.0 + c.y / k;
            let lon = origin.1 + c.x / (k * origin.0.to_radians().cos().max(1e-6));
            (m.lat, m.lon, m.diameter_km) = (
                Some(lat),
                Some((lon + 540.0).rem_euclid(360.0) - 180.0),
                Some(c.d),
            );
        }
    }
    m
}

/// The kind of frame most of `metas` have positions in, and the centroid of those on the
/// body (the tangent plane's origin).
fn frame_of(metas: &[&ImageMeta]) -> Option<(FrameKind, (f64, f64))> {
    let (mut body, mut pixels, mut lat, mut east, mut north) = (0usize, 0usize, 0.0, 0.0, 0.0);
    for m in metas {
        match Position::of(m) {
            Some(Position::Body { lat: la, lon, .. }) => {
                body += 1;
                lat += la;
                east += lon.to_radians().cos();
                north += lon.to_radians().sin();
            }
            Some(Position::Frame { .. }) => pixels += 1,
            None => {}
        }
    }
    if body == 0 && pixels == 0 {
        return None;
    }
    Some(if body >= pixels {
        (
            FrameKind::Body,
            (lat / body as f64, north.atan2(east).to_degrees()),
        )
    } else {
        (FrameKind::Pixels, (0.0, 0.0))
    })
}

/// Registers one source's entries to `catalogue` (metas of the catalogue's frame); `wide`:
/// pixel positions that do not register against the catalogue around them are tried
/// against all of it (not for [`Frames::of_index`], where a source with nothing around it
/// anchors its own area).
fn register_source(
    source: Option<String>,
    entries: &[&ImageMeta],
    catalogue: &[&ImageMeta],
    o: &RegisterOptions,
    r_km: f64,
    wide: bool,
    seeds: &[(String, String)],
) -> Option<SourceRegistration> {
    let (kind, origin) = frame_of(entries)?;
    let (src, src_ids): (Vec<Crater>, Vec<&str>) = entries
        .iter()
        .filter_map(|m| Some((planar_of(m, kind, origin, r_km)?, m.id.as_str())))
        .unzip();
    let (x0, y0, x1, y1) = bounds(&src);
    let grow = o.margin * (x1 - x0).max(y1 - y0);
    let (all, all_ids): (Vec<Crater>, Vec<&str>) = catalogue
        .iter()
        .filter_map(|m| Some((planar_of(m, kind, origin, r_km)?, m.id.as_str())))
        .unzip();
    let within = |c: &Crater, (u0, v0, u1, v1): (f64, f64, f64, f64), g: f64| {
        c.x >= u0 - g && c.x <= u1 + g && c.y >= v0 - g && c.y <= v1 + g
    };
    let mut cat: Vec<Crater> = all
        .iter()
        .copied()
        .filter(|c| within(c, (x0, y0, x1, y1), grow))
        .collect();
    let mut attempt = register(&src, &cat, o);
    if attempt.is_err() && !seeds.is_empty() {
        // the catalogue around the seeds' catalogue craters, as far as the source could reach
        let at_src: HashMap<&str, usize> =
            src_ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
        let at_all: HashMap<&str, usize> =
            all_ids.iter().enumerate().map(|(j, id)| (*id, j)).collect();
        let pairs: Vec<(usize, usize)> = seeds
            .iter()
            .filter_map(|(e, c)| Some((*at_src.get(e.as_str())?, *at_all.get(c.as_str())?)))
            .collect();
        if pairs.len() >= 2 {
            let seen: Vec<Crater> = pairs.iter().map(|p| all[p.1]).collect();
            let reach = (x1 - x0).hypot(y1 - y0) * seed_scale(&src, &all, &pairs);
            let (near, index_of): (Vec<Crater>, Vec<usize>) = all
                .iter()
                .enumerate()
                .filter(|(_, c)| within(c, bounds(&seen), reach))
                .map(|(j, c)| (*c, j))
                .unzip();
            let at_near: HashMap<usize, usize> =
                index_of.iter().enumerate().map(|(k, j)| (*j, k)).collect();
            let local: Vec<(usize, usize)> = pairs
                .iter()
                .filter_map(|&(i, j)| Some((i, *at_near.get(&j)?)))
                .collect();
            let seeded = register_seeded(&src, &near, &local, o);
            if seeded.is_ok() {
                (cat, attempt) = (near, seeded);
            }
        }
    }
    // a body position is near its true place; a pixel position may instead be in the
    // source image's own frame, unrelated to the catalogue's: then the whole catalogue
    if wide && attempt.is_err() && kind == FrameKind::Pixels && all.len() > cat.len() {
        let wide = register(&src, &all, o);
        if wide.is_ok() {
            (cat, attempt) = (all.clone(), wide);
        }
    }
    // registered: the catalogue around where the source truly lies, registered again there
    // when that is other craters (a source far from its given place overlapped its box only
    // in part)
    if let Ok(f) = &attempt {
        let corners = [(x0, y0), (x1, y0), (x0, y1), (x1, y1)]
            .map(|(x, y)| f.transform.map(Crater { x, y, d: 1.0 }));
        let mapped = bounds(&corners);
        let grow = o.margin * (mapped.2 - mapped.0).max(mapped.3 - mapped.1);
        let there: Vec<Crater> = all
            .iter()
            .copied()
            .filter(|c| within(c, mapped, grow))
            .collect();
        if there != cat {
            if let Ok(g) = register(&src, &there, o) {
                if g.inliers.len() >= f.inliers.len() {
                    (cat, attempt) = (there, Ok(g));
                }
            }
        }
    }
    let mut out = SourceRegistration {
        source,
        frame: kind,
        origin: (kind == FrameKind::Body).then_some(origin),
        entries: src.len(),
        catalogue: cat.len(),
        registered: false,
        transform: None,
        rotation_deg: None,
        scale: None,
        inliers: 0,
        residual_radii: None,
        chance_inliers: None,
        false_alarm: None,
        reason: None,
        residuals: Vec::new(),
        proposed: None,
    };
    let (fit, reason) = match attempt {
        Ok(f) => (Some(f), None),
        Err(e) => (e.best.map(|b| *b), Some(e.reason)),
    };
    if let Some(f) = &fit {
        out.inliers = f.inliers.len();
        out.residual_radii = Some(f.residual_radii);
        out.chance_inliers = Some(f.chance_inliers);
        out.false_alarm = Some(f.false_alarm);
        if reason.is_none() {
            out.registered = true;
            out.transform = Some(f.transform);
            out.rotation_deg = Some(f.transform.rotation_deg());
            out.scale = Some(f.transform.scale());
            out.residuals = f
                .inliers
                .iter()
                .map(|&(i, j)| {
                    let m = f.transform.map(src[i]);
                    let r = cat[j].d / 2.0;
                    ((m.x - cat[j].x) / r, (m.y - cat[j].y) / r)
                })
                .collect();
        } else {
            out.proposed = Some(f.transform);
        }
    }
    out.reason = reason;
    Some(out)
}

fn by_source<'a>(
    metas: impl IntoIterator<Item = &'a ImageMeta>,
) -> Vec<(Option<String>, Vec<&'a ImageMeta>)> {
    let mut groups: Vec<(Option<String>, Vec<&'a ImageMeta>)> = Vec::new();
    let mut at: HashMap<Option<String>, usize> = HashMap::new();
    for m in metas {
        let i = *at.entry(m.source.clone()).or_insert_with(|| {
            groups.push((m.source.clone(), Vec::new()));
            groups.len() - 1
        });
        groups[i].1.push(m);
    }
    groups
}

impl Frames {
    /// No registration: every entry keeps its position and today's rule applies.
    pub fn none() -> Frames {
        Frames::default()
    }

    /// Registers the sources of new `entries` (grouped by `source`; entries without one
    /// form one group) to the index's live entries of other sources.
    pub fn of_entries(
        index: &Index,
        entries: &[ImageMeta],
        o: &RegisterOptions,
        body_radius_km: f64,
    ) -> Frames {
        Self::of_entries_seeded(index, entries, &[], o, body_radius_km)
    }

    /// [`Frames::of_entries`] where `seeds`, (entry id, index entry id) pairs known to show
    /// one crater (confident appearance matches), seed the sources that crater patterns alone
    /// do not register ([`register_seeded`]).
    pub fn of_entries_seeded(
        index: &Index,
        entries: &[ImageMeta],
        seeds: &[(String, String)],
        o: &RegisterOptions,
        body_radius_km: f64,
    ) -> Frames {
        let groups = by_source(entries);
        let catalogue: Vec<&ImageMeta> = index.live_rows().map(|r| index.meta(r)).collect();
        let by_source = groups
            .into_iter()
            .filter_map(|(source, members)| {
                let others: Vec<&ImageMeta> = match &source {
                    Some(s) => catalogue
                        .iter()
                        .copied()
                        .filter(|m| m.source.as_ref() != Some(s))
                        .collect(),
                    None => catalogue.clone(),
                };
                let reg = register_source(
                    source.clone(),
                    &members,
                    &others,
                    o,
                    body_radius_km,
                    true,
                    seeds,
                )?;
                Some((source, Arc::new(reg)))
            })
            .collect();
        Frames {
            enabled: true,
            by_source,
            body_radius_km,
        }
    }

    /// Registers the sources of one index to each other, as for deduplication: the source
    /// with the most entries is the reference; each other source, largest first, is
    /// registered to the entries placed so far (the reference and the sources registered
    /// before it). A source with nothing placed around it is placed as given (an anchor:
    /// disjoint tiles each anchor their own area).
    pub fn of_index(index: &Index, o: &RegisterOptions, body_radius_km: f64) -> Frames {
        let metas: Vec<&ImageMeta> = index.live_rows().map(|r| index.meta(r)).collect();
        let mut groups = by_source(metas.iter().copied());
        groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        let mut frames = Frames {
            enabled: true,
            by_source: HashMap::new(),
            body_radius_km,
        };
        let Some((_, reference)) = groups.first() else {
            return frames;
        };
        let mut placed: Vec<ImageMeta> = reference.iter().map(|m| (*m).clone()).collect();
        for (source, members) in groups.iter().skip(1) {
            let anchor: Vec<&ImageMeta> = placed.iter().collect();
            let Some(mut reg) = register_source(
                source.clone(),
                members,
                &anchor,
                o,
                body_radius_km,
                false,
                &[],
            ) else {
                continue;
            };
            if reg.catalogue == 0 {
                // nothing placed around it: its own positions define the frame there
                reg.registered = true;
                reg.transform = Some(Transform::IDENTITY);
                reg.reason = Some("nothing placed around it: an anchor of the frame".into());
            }
            let reg = Arc::new(reg);
            frames.by_source.insert(source.clone(), reg.clone());
            if reg.registered {
                placed.extend(members.iter().map(|m| frames.place(m).meta.into_owned()));
            }
        }
        frames
    }

    /// The frames that `registrations` (of [`Frames::registrations`], e.g. sent to the
    /// tasks of a distributed run) describe: every task places entries alike.
    pub fn of_registrations(
        registrations: impl IntoIterator<Item = SourceRegistration>,
        body_radius_km: f64,
    ) -> Frames {
        Frames {
            enabled: true,
            by_source: registrations
                .into_iter()
                .map(|r| (r.source.clone(), Arc::new(r)))
                .collect(),
            body_radius_km,
        }
    }

    /// Adds the registrations of `other` (of other sources).
    pub fn extend(&mut self, other: Frames) {
        self.enabled |= other.enabled;
        self.body_radius_km = other.body_radius_km;
        self.by_source.extend(other.by_source);
    }

    /// `meta` in the catalogue's frame.
    pub fn place<'a>(&'a self, meta: &'a ImageMeta) -> Placed<'a> {
        let as_given = |registered, registration| Placed {
            meta: Cow::Borrowed(meta),
            registered,
            registration,
        };
        if !self.enabled {
            return as_given(false, None);
        }
        let Some(reg) = self.by_source.get(&meta.source) else {
            return as_given(true, None);
        };
        let Some(t) = reg.transform.filter(|_| reg.registered) else {
            return as_given(false, Some(reg));
        };
        let origin = reg.origin.unwrap_or((0.0, 0.0));
        match planar_of(meta, reg.frame, origin, self.body_radius_km) {
            Some(c) => Placed {
                meta: Cow::Owned(unplanar(
                    t.map(c),
                    meta,
                    reg.frame,
                    origin,
                    self.body_radius_km,
                )),
                registered: true,
                registration: Some(reg),
            },
            None => as_given(false, Some(reg)),
        }
    }

    /// The registration of `source`, if it was registered (or tried).
    pub fn registration_of(&self, source: &str) -> Option<Arc<SourceRegistration>> {
        self.by_source.get(&Some(source.to_string())).cloned()
    }

    /// Every source's registration, in source order.
    pub fn registrations(&self) -> Vec<Arc<SourceRegistration>> {
        let mut v: Vec<Arc<SourceRegistration>> = self.by_source.values().cloned().collect();
        v.sort_by(|a, b| a.source.cmp(&b.source));
        v
    }
}
