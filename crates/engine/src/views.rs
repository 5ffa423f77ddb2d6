//! The views of a query image a search looks at when its heading or its sun may not be the
//! catalogue's: the query as given first, then turned and mirrored views, then the same with
//! the light from the other side; or the query turned toward the catalogue's suns. Every view
//! is searched and each indexed image keeps its best score over them, the views other than
//! the query as given counted lower.

use crate::options::{
    OPPOSITE_SUN_MARGIN, SUN_APART_DEGREES, SUN_SHARE, SUN_WINDOW_DEGREES, TURN_MARGIN,
};
use craterdex_model::{preprocess, relight};

/// Which views of a query image a search looks at ([`crate::SearchOptions::turns`] and
/// [`crate::SearchOptions::opposite_sun`]); the default is the query alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueryViews {
    /// The query as given and mirrored, each turned by every `turns`-th of a circle (1: the
    /// query alone).
    pub turns: usize,
    /// Which of those are also seen with their brightness inverted.
    pub opposite_sun: OppositeSun,
    /// Unless empty, the views are these instead: for each sun, the query and its mirror
    /// image each turned so that its sun's heading ([`sun_heading_of`]) points toward that sun
    /// ([`QueryViews::toward`]), or with [`QueryViews::relit`] the query relit so.
    pub toward: Suns,
    /// Toward the suns by relighting the query as given, not by turning it
    /// ([`QueryViews::relit_toward`]).
    #[serde(default)]
    pub relit: bool,
}

/// Most sun headings a catalogue is seen under ([`Suns`]).
pub const MAX_SUNS: usize = 2;

/// The headings (whole degrees, image axes: x right, y down) that the suns of a
/// catalogue's craters share ([`sun_headings`]): where its images' suns shine from. A
/// map-projected tile has one; a catalogue of several observations a few.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "Vec<i16>", from = "Vec<i16>")]
pub struct Suns {
    degrees: [i16; MAX_SUNS],
    len: u8,
}

impl Suns {
    /// The headings of `radians` (the first [`MAX_SUNS`]), rounded to whole degrees.
    pub fn from_radians(radians: &[f32]) -> Self {
        let mut s = Self::default();
        for &r in radians.iter().take(MAX_SUNS) {
            s.degrees[s.len as usize] = (r.to_degrees().round() as i32).rem_euclid(360) as i16;
            s.len += 1;
        }
        s
    }

    /// Each heading in radians.
    pub fn radians(&self) -> Vec<f32> {
        self.degrees[..self.len as usize]
            .iter()
            .map(|&d| (d as f32).to_radians())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// The first `n` (the catalogue's suns come most shared first: [`sun_headings`]).
    pub fn first(&self, n: usize) -> Self {
        let mut first = Self::default();
        let len = self.len().min(n);
        first.degrees[..len].copy_from_slice(&self.degrees[..len]);
        first.len = len as u8;
        first
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Suns as their headings in degrees (the first [`MAX_SUNS`]).
impl From<Vec<i16>> for Suns {
    fn from(degrees: Vec<i16>) -> Self {
        let radians: Vec<f32> = degrees.iter().map(|&d| (d as f32).to_radians()).collect();
        Self::from_radians(&radians)
    }
}

impl From<Suns> for Vec<i16> {
    fn from(suns: Suns) -> Self {
        suns.degrees[..suns.len()].to_vec()
    }
}

impl std::fmt::Display for Suns {
    /// The headings in degrees, as `20, 165 degrees`; `none` where empty.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        let list: Vec<String> = self.degrees[..self.len()]
            .iter()
            .map(i16::to_string)
            .collect();
        write!(f, "{} degrees", list.join(", "))
    }
}

/// The sun headings that the headings `angles` (radians, [`sun_heading_of`]) of a
/// catalogue's images share: the heading with the most of them within +-[`SUN_WINDOW_DEGREES`]
/// (on a whole-degree grid), if it holds at least [`SUN_SHARE`] of them, then the next at
/// least [`SUN_APART_DEGREES`] from it, up to [`MAX_SUNS`]; each the circular mean of the
/// headings within its window. Craters whose walls the sun lights unevenly scatter their
/// headings; a catalogue of one sun still gathers most within the window.
pub fn sun_headings(angles: &[f32]) -> Suns {
    let degrees: Vec<f32> = angles
        .iter()
        .filter(|a| a.is_finite())
        .map(|a| a.to_degrees().rem_euclid(360.0))
        .collect();
    let apart = |a: f32, b: f32| ((a - b + 180.0).rem_euclid(360.0) - 180.0).abs();
    let near = |centre: f32| -> Vec<f32> {
        degrees
            .iter()
            .copied()
            .filter(|&d| apart(d, centre) <= SUN_WINDOW_DEGREES)
            .collect()
    };
    let mut found: Vec<f32> = Vec::new();
    while found.len() < MAX_SUNS {
        let best = (0..360)
            .map(|c| c as f32)
            .filter(|&c| found.iter().all(|&f| apart(c, f) >= SUN_APART_DEGREES))
            .map(|c| (c, near(c).len()))
            .max_by_key(|&(c, n)| (n, std::cmp::Reverse(c as i32)));
        match best {
            Some((c, n)) if n > 0 && n as f32 >= SUN_SHARE * degrees.len() as f32 => {
                let (sin, cos) = near(c)
                    .iter()
                    .map(|d| d.to_radians().sin_cos())
                    .fold((0.0, 0.0), |(s, c), (ds, dc)| (s + ds, c + dc));
                found.push(sin.atan2(cos).to_degrees());
            }
            _ => break,
        }
    }
    let radians: Vec<f32> = found.iter().map(|d| d.to_radians()).collect();
    Suns::from_radians(&radians)
}

/// Longest side of a query relit toward the catalogue's suns ([`QueryViews::relit_toward`]):
/// larger crops are shrunk to it first, which bounds the Fourier transforms' cost (twice the
/// side, squared) and keeps more than the model's input (224 px) sees.
pub const RELIT_SIDE: u32 = 448;

/// Side of the square a crop is brought to before its sun's heading is read: the model's
/// input, where the dipole of [`preprocess::shading_angle`] was tuned and the axis of
/// [`relight::shading_axis`] measured.
const SHADING_SIDE: u32 = 224;

/// The heading (radians, image axes) of `image`'s sun as its shading shows it
/// ([`relight::sun_heading`]: the shading's axis, the end its dipole points to), read at
/// [`SHADING_SIDE`] px.
pub fn sun_heading_of(image: &image::DynamicImage) -> f32 {
    let square = image.resize_exact(
        SHADING_SIDE,
        SHADING_SIDE,
        image::imageops::FilterType::Triangle,
    );
    relight::sun_heading(&square.to_rgb32f())
}

/// Which views of a query a search also looks at under the opposite sun (brightness
/// inverted, [`opposite_sun`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OppositeSun {
    /// None.
    Off,
    /// The query as given alone, one view more: the views a search again looks at
    /// ([`crate::RecheckPlan::last`]).
    Given,
    /// Every view (`--opposite-sun`), twice the views.
    Every,
}

impl OppositeSun {
    /// [`OppositeSun::Every`] when asked for, else [`OppositeSun::Off`]: what a caller's
    /// `opposite_sun` option means.
    pub fn every_if(asked: bool) -> Self {
        if asked {
            Self::Every
        } else {
            Self::Off
        }
    }
}

impl Default for QueryViews {
    fn default() -> Self {
        Self::PLAIN
    }
}

impl QueryViews {
    /// The query as given, alone: a plain search.
    pub const PLAIN: QueryViews = QueryViews {
        turns: 1,
        opposite_sun: OppositeSun::Off,
        toward: Suns {
            degrees: [0; MAX_SUNS],
            len: 0,
        },
        relit: false,
    };

    /// For each of `suns`, the query and its mirror image turned toward it: a turned or
    /// mirrored query brought back to the catalogue's heading by its shading, whatever its
    /// turn, in two views per sun.
    pub fn toward(suns: Suns) -> Self {
        Self {
            toward: suns,
            ..Self::PLAIN
        }
    }

    /// For each of `suns`, the query as given relit so that its sun shines from that sun's
    /// axis ([`relight::relight`]), its own sun's axis read from its shading
    /// ([`relight::shading_axis`]) and taken both ways: a query under another sun azimuth
    /// shown, to first order, under the catalogue's, in two views per sun.
    pub fn relit_toward(suns: Suns) -> Self {
        Self {
            toward: suns,
            relit: true,
            ..Self::PLAIN
        }
    }

    /// Views turned by every `turns`-th of a circle (and mirrored).
    pub fn turned(turns: usize) -> Self {
        Self {
            turns,
            ..Self::PLAIN
        }
    }

    /// How many views: the query alone, `2 * turns` with turns, twice that under the
    /// opposite sun, one more with the query as given under it alone.
    pub fn count(&self) -> usize {
        if !self.toward.is_empty() {
            return 2 * self.toward.len();
        }
        match self.opposite_sun {
            OppositeSun::Every => 2 * self.turned_count(),
            OppositeSun::Given => self.turned_count() + 1,
            OppositeSun::Off => self.turned_count(),
        }
    }

    /// The query as given alone: nothing but a plain search.
    pub fn is_plain(&self) -> bool {
        self.count() == 1
    }

    fn turned_count(&self) -> usize {
        if self.turns <= 1 {
            1
        } else {
            2 * self.turns
        }
    }

    /// The [`QueryViews::count`] images of `image` a search looks at: `image`, then (with
    /// turns) its mirror image (left to right) and each further turn by a `turns`-th of a
    /// circle and its mirror image, then (under the opposite sun) each of those with its
    /// brightness inverted, or `image` alone inverted ([`OppositeSun::Given`]). Toward suns:
    /// for each sun, `image` and its mirror image turned so that their suns' headings
    /// ([`sun_heading_of`]) point toward it. Turns reflect the image at its edges, so no
    /// blank corner appears. Relit toward suns: for each sun, `image` relit from its shading
    /// axis to the sun's, then from the axis taken the other way (its inverse), at most
    /// [`RELIT_SIDE`] px across.
    pub fn images(&self, image: &image::DynamicImage) -> Vec<image::DynamicImage> {
        if self.relit && !self.toward.is_empty() {
            let given = match image.width().max(image.height()) > RELIT_SIDE {
                true => image.resize(
                    RELIT_SIDE,
                    RELIT_SIDE,
                    image::imageops::FilterType::Triangle,
                ),
                false => image.clone(),
            }
            .to_rgb32f();
            let axis = relight::shading_axis(&given);
            return relight::relight_both_ways(&given, axis, &self.toward.radians())
                .into_iter()
                .map(image::DynamicImage::ImageRgb32F)
                .collect();
        }
        if !self.toward.is_empty() {
            let bases = [image.clone(), image.fliph()];
            let headings = bases.each_ref().map(sun_heading_of);
            return self
                .toward
                .radians()
                .into_iter()
                .flat_map(|sun| {
                    bases.iter().zip(headings).map(move |(b, heading)| {
                        image::DynamicImage::ImageRgb32F(preprocess::turn(
                            &b.to_rgb32f(),
                            sun - heading,
                        ))
                    })
                })
                .collect();
        }
        let mut out = Vec::with_capacity(self.count());
        for t in 0..self.turns.max(1) {
            let im = if t == 0 {
                image.clone()
            } else {
                let angle = std::f32::consts::TAU * t as f32 / self.turns as f32;
                image::DynamicImage::ImageRgb32F(preprocess::turn(&image.to_rgb32f(), angle))
            };
            if self.turns > 1 {
                let mirrored = im.fliph();
                out.push(im);
                out.push(mirrored);
            } else {
                out.push(im);
            }
        }
        match self.opposite_sun {
            OppositeSun::Every => {
                let relit: Vec<image::DynamicImage> = out.iter().map(opposite_sun).collect();
                out.extend(relit);
            }
            OppositeSun::Given => out.push(opposite_sun(image)),
            OppositeSun::Off => {}
        }
        out
    }

    /// How much lower view `v` of [`QueryViews::images`] counts than the query as given: 0
    /// for the query itself, [`TURN_MARGIN`] for a turned or mirrored view (every view toward
    /// a sun), [`OPPOSITE_SUN_MARGIN`] more for a view under the opposite sun.
    pub fn margin(&self, v: usize) -> f32 {
        if !self.toward.is_empty() {
            return TURN_MARGIN;
        }
        let turned = self.turned_count();
        let turn = if v.is_multiple_of(turned) {
            0.0
        } else {
            TURN_MARGIN
        };
        let sun = if v >= turned {
            OPPOSITE_SUN_MARGIN
        } else {
            0.0
        };
        turn + sun
    }

    /// Every view's margin, in the order of [`QueryViews::images`].
    pub fn margins(&self) -> Vec<f32> {
        (0..self.count()).map(|v| self.margin(v)).collect()
    }
}

/// `image` with its brightness inverted: to first order, how a crater looks with the sun on
/// the other side. Under Lambertian light a surface's brightness departs from flat ground's
/// in proportion to its slope along the sun's direction, so turning the sun's azimuth by 180
/// degrees negates that departure: lit walls go dark and shadowed ones bright.
pub fn opposite_sun(image: &image::DynamicImage) -> image::DynamicImage {
    let mut out = image.clone();
    out.invert();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img() -> image::DynamicImage {
        image::DynamicImage::ImageLuma8(image::GrayImage::from_fn(6, 4, |x, y| {
            image::Luma([(x * 40 + y) as u8])
        }))
    }

    /// One turn is a plain search: the query alone, one forward pass (a search by image
    /// with the default views must not also run the mirror image).
    #[test]
    fn one_turn_is_the_image_alone_more_add_each_turn_and_its_mirror() {
        for turns in [0, 1] {
            let v = QueryViews::turned(turns);
            assert_eq!(v.images(&img()), std::slice::from_ref(&img()));
            assert_eq!((v.count(), v.is_plain()), (1, true));
        }
        let v = QueryViews::turned(4).images(&img());
        assert_eq!(v.len(), QueryViews::turned(4).count());
        assert_eq!(v.len(), 8);
        assert_eq!((&v[0], &v[1]), (&img(), &img().fliph()));
        assert_ne!(v[2], img());
    }

    #[test]
    fn the_opposite_sun_adds_each_view_inverted_after_the_views() {
        let plain = QueryViews {
            opposite_sun: OppositeSun::Every,
            ..QueryViews::PLAIN
        };
        let v = plain.images(&img());
        assert_eq!((v.len(), plain.count(), plain.is_plain()), (2, 2, false));
        assert_eq!(v[0], img());
        let inverted = v[1].to_luma8();
        for (a, b) in img().to_luma8().pixels().zip(inverted.pixels()) {
            assert_eq!(a[0] as u16 + b[0] as u16, 255);
        }
        let turned = QueryViews {
            turns: 3,
            opposite_sun: OppositeSun::Every,
            ..QueryViews::PLAIN
        };
        let v = turned.images(&img());
        assert_eq!(v.len(), 12);
        let upright = QueryViews::turned(3).images(&img());
        for (i, u) in upright.iter().enumerate() {
            assert_eq!(&v[i], u);
            assert_eq!(v[i + 6], opposite_sun(u));
        }
    }

    #[test]
    fn only_the_query_as_given_counts_in_full() {
        let v = QueryViews {
            turns: 2,
            opposite_sun: OppositeSun::Every,
            ..QueryViews::PLAIN
        };
        let m = v.margins();
        assert_eq!(m.len(), 8);
        assert_eq!(m[0], 0.0);
        assert!(m[1..4].iter().all(|&x| x == TURN_MARGIN));
        assert_eq!(m[4], OPPOSITE_SUN_MARGIN);
        assert!(m[5..]
            .iter()
            .all(|&x| x == TURN_MARGIN + OPPOSITE_SUN_MARGIN));
        assert_eq!(QueryViews::PLAIN.margins(), vec![0.0]);
    }

    /// A bowl (depth growing with the square of the radius inside 0.4 of the half-width) lit
    /// from `light` radians under Lambertian shading, with a dark pit off its axis so that
    /// its mirror image differs.
    fn lit_bowl(side: u32, light: f32) -> image::DynamicImage {
        let c = (side as f32 - 1.0) / 2.0;
        image::DynamicImage::ImageLuma8(image::GrayImage::from_fn(side, side, |x, y| {
            let (dx, dy) = ((x as f32 - c) / c, (y as f32 - c) / c);
            let (gx, gy) = match dx * dx + dy * dy < 0.16 {
                true => (2.0 * dx, 2.0 * dy),
                false => (0.0, 0.0),
            };
            let pit = (dx - 0.5).powi(2) + (dy + 0.3).powi(2) < 0.01;
            let v = 0.5 - 0.4 * (gx * light.cos() + gy * light.sin()) - if pit { 0.3 } else { 0.0 };
            image::Luma([(v.clamp(0.0, 1.0) * 255.0) as u8])
        }))
    }

    fn apart(a: f32, b: f32) -> f32 {
        let tau = std::f32::consts::TAU;
        ((a - b + tau / 2.0).rem_euclid(tau) - tau / 2.0).abs()
    }

    /// However the query was turned or mirrored, each view toward a sun has its shading
    /// dipole pointing at that sun; two views per sun, none counted as the query as given.
    #[test]
    fn views_toward_a_sun_bring_the_dipole_to_it_whatever_the_turn() {
        let sun = 0.4f32;
        let upright = lit_bowl(96, sun + std::f32::consts::PI);
        assert!(apart(sun_heading_of(&upright), sun) < 0.1);
        let suns = Suns::from_radians(&[sun, -2.0]);
        let views = QueryViews::toward(suns);
        assert_eq!((views.count(), views.is_plain()), (4, false));
        assert_eq!(views.margins(), vec![TURN_MARGIN; 4]);
        for turn_by in [0.0f32, 1.3, -2.6] {
            for mirrored in [false, true] {
                let turned = image::DynamicImage::ImageRgb32F(preprocess::turn(
                    &upright.to_rgb32f(),
                    turn_by,
                ));
                let query = if mirrored { turned.fliph() } else { turned };
                let images = views.images(&query);
                assert_eq!(images.len(), 4);
                for (v, im) in images.iter().enumerate() {
                    let toward = suns.radians()[v / 2];
                    let a = sun_heading_of(im);
                    assert!(
                        apart(a, toward) < 0.1,
                        "turn {turn_by}, mirrored {mirrored}, view {v}: {a} for {toward}"
                    );
                }
                // the two views of one sun are mirror images, not the same view twice
                assert_ne!(images[0], images[1]);
            }
        }
    }

    /// A bowl lit across the catalogue's sun, relit toward it: one of the two views of the
    /// sun shows the bowl as the catalogue's sun lights it, the other its inverse; a large
    /// crop is relit at [`RELIT_SIDE`].
    #[test]
    fn views_relit_toward_a_sun_show_the_query_under_it_one_way_or_the_other() {
        let correlation = |a: &image::DynamicImage, b: &image::DynamicImage| {
            let (a, b) = (a.to_luma32f(), b.to_luma32f());
            let n = a.len() as f32;
            let (ma, mb) = (a.iter().sum::<f32>() / n, b.iter().sum::<f32>() / n);
            let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
            for (x, y) in a.iter().zip(b.iter()) {
                ab += (x - ma) * (y - mb);
                aa += (x - ma) * (x - ma);
                bb += (y - mb) * (y - mb);
            }
            ab / (aa * bb).sqrt()
        };
        let sun = 0.4f32;
        let quarter = sun + std::f32::consts::FRAC_PI_2;
        let (given, truth) = (lit_bowl(96, quarter), lit_bowl(96, sun));
        let views = QueryViews::relit_toward(Suns::from_radians(&[sun]));
        assert_eq!((views.count(), views.is_plain()), (2, false));
        assert_eq!(views.margins(), vec![TURN_MARGIN; 2]);
        let images = views.images(&given);
        assert_eq!(images.len(), 2);
        let r: Vec<f32> = images.iter().map(|im| correlation(im, &truth)).collect();
        // (the bowl's sharp rim and its pit are more than slopes: not 1)
        let as_given = correlation(&given, &truth);
        let (best, worst) = (r[0].max(r[1]), r[0].min(r[1]));
        assert!(as_given.abs() < 0.2, "{as_given}");
        assert!(best > 0.5 && worst < -0.5, "{r:?}");
        let large = views.images(&lit_bowl(RELIT_SIDE + 100, quarter));
        assert_eq!(large[0].width(), RELIT_SIDE);
        // the views are serialised with what they are
        let back: QueryViews =
            serde_json::from_str(&serde_json::to_string(&views).unwrap()).unwrap();
        assert_eq!(back, views);
    }

    #[test]
    fn sun_headings_are_where_most_dipoles_point() {
        let deg = |d: &[f32]| d.iter().map(|d| d.to_radians()).collect::<Vec<f32>>();
        // one sun: dipoles within 15 degrees of 350, a few strays
        let one: Vec<f32> = (0..42)
            .map(|i| 350.0 + (i % 7) as f32 * 5.0 - 15.0)
            .chain([100.0, 200.0, 250.0])
            .collect();
        let suns = sun_headings(&deg(&one));
        assert_eq!((suns.len(), suns.to_string()), (1, "350 degrees".into()));
        assert!(apart(suns.radians()[0], 350f32.to_radians()) < 3f32.to_radians());
        // two observations' suns, 160 degrees apart, and the strays
        let two: Vec<f32> = one
            .iter()
            .chain(
                &(0..30)
                    .map(|i| 150.0 + (i % 5) as f32 * 3.0)
                    .collect::<Vec<_>>(),
            )
            .copied()
            .collect();
        let suns = sun_headings(&deg(&two));
        assert_eq!(suns.len(), 2);
        assert!(apart(suns.radians()[0], 350f32.to_radians()) < 3f32.to_radians());
        assert!(apart(suns.radians()[1], 156f32.to_radians()) < 3f32.to_radians());
        // dipoles spread all round: no sun to turn toward; none at all: none either
        let spread: Vec<f32> = (0..72).map(|i| i as f32 * 5.0).collect();
        assert!(sun_headings(&deg(&spread)).is_empty());
        assert!(sun_headings(&[]).is_empty());
        assert_eq!(sun_headings(&[]).to_string(), "none");
        assert!(sun_headings(&[f32::NAN]).is_empty());
        // a heading just below a full turn is 0, not 360
        assert_eq!(Suns::from_radians(&[-1e-6]).to_string(), "0 degrees");
    }

    /// A search again adds one view to the turns, the query as given inverted, counted as
    /// the opposite sun counts it.
    #[test]
    fn the_opposite_sun_given_adds_the_query_inverted_alone() {
        let v = QueryViews {
            opposite_sun: OppositeSun::Given,
            ..QueryViews::turned(3)
        };
        let images = v.images(&img());
        assert_eq!((images.len(), v.count()), (7, 7));
        assert_eq!(&images[..6], &QueryViews::turned(3).images(&img())[..]);
        assert_eq!(images[6], opposite_sun(&img()));
        assert_eq!(v.margin(6), OPPOSITE_SUN_MARGIN);
        assert_eq!(v.margin(1), TURN_MARGIN);
        let plain = QueryViews {
            opposite_sun: OppositeSun::Given,
            ..QueryViews::PLAIN
        };
        assert_eq!(plain.images(&img()), vec![img(), opposite_sun(&img())]);
        assert_eq!(plain.margins(), vec![0.0, OPPOSITE_SUN_MARGIN]);
    }
}
