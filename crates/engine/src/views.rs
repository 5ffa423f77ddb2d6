//! The views of a query image a search looks at when its heading or its sun may not be the
//! catalogue's: the query as given first, then turned and mirrored views, then the same with
//! the light from the other side. Every view is searched and each indexed image keeps its
//! best score over them, the views other than the query as given counted lower.

use crate::options::{OPPOSITE_SUN_MARGIN, TURN_MARGIN};
use craterdex_model::preprocess;

/// Which views of a query image a search looks at ([`crate::SearchOptions::turns`] and
/// [`crate::SearchOptions::opposite_sun`]); the default is the query alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryViews {
    /// The query as given and mirrored, each turned by every `turns`-th of a circle (1: the
    /// query alone).
    pub turns: usize,
    /// Which of those are also seen with their brightness inverted.
    pub opposite_sun: OppositeSun,
}

/// Which views of a query a search also looks at under the opposite sun (brightness
/// inverted, [`opposite_sun`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OppositeSun {
    /// None.
    Off,
    /// The query as given alone, one view more: the views a search again looks at
    /// ([`crate::RECHECK_VIEWS`]).
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
    };

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
    /// brightness inverted, or `image` alone inverted ([`OppositeSun::Given`]). Turns reflect
    /// the image at its edges, so no blank corner appears.
    pub fn images(&self, image: &image::DynamicImage) -> Vec<image::DynamicImage> {
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
    /// for the query itself, [`TURN_MARGIN`] for a turned or mirrored view,
    /// [`OPPOSITE_SUN_MARGIN`] more for a view under the opposite sun.
    pub fn margin(&self, v: usize) -> f32 {
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
