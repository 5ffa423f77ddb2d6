//! int8 kernels: the symmetric quantiser, exact integer dot products, and late interaction
//! straight from int8 codes.
//!
//! Every level computes the same integers (the products are exact: AMX tiles, the AVX-512
//! VNNI or AVX2 byte products with the sign trick, or plain loops), scales them with the same
//! f32 operations in the same order, and so returns bit-identical scores.

use crate::amx::{self, PackedI8};
use crate::level::{active, detected, dispatch, Level};

/// Query tokens per packed block (as for the f32 kernels).
pub const BLOCK: usize = crate::i8_block::COLUMNS;

/// Symmetric int8 for one vector: appends `round(v / scale)` in [-127, 127] to `codes` and
/// returns the scale (`max |v| / 127`, 1 for a zero vector).
pub fn quantise(v: &[f32], codes: &mut Vec<i8>) -> f32 {
    quantise_at(active(), v, codes)
}

/// [`quantise`] compiled for a given level (the results are identical on every level).
pub fn quantise_at(level: Level, v: &[f32], codes: &mut Vec<i8>) -> f32 {
    dispatch!(level,
        avx512 => x86::quantise_avx512(v, codes),
        avx2 => x86::quantise_avx2(v, codes),
        portable => quantise_plain(v, codes))
}

#[inline(always)]
fn quantise_plain(v: &[f32], codes: &mut Vec<i8>) -> f32 {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let scale = if max > 0.0 { max / 127.0 } else { 1.0 };
    codes.extend(
        v.iter()
            .map(|x| round_small(x / scale).clamp(-127.0, 127.0) as i8),
    );
    scale
}

/// Quantises `[n, dim]` rows: codes `[n, dim]` and one scale per row are appended.
pub fn quantise_rows(rows: &[f32], dim: usize, codes: &mut Vec<i8>, scales: &mut Vec<f32>) {
    if dim == 0 {
        return;
    }
    codes.reserve(rows.len());
    scales.extend(rows.chunks_exact(dim).map(|r| quantise(r, codes)));
}

/// Round to nearest (ties to even) for |x| < 2^22 by adding and removing 1.5 * 2^23: plain
/// arithmetic the compiler vectorises, where `round()` on baseline x86-64 is a libm call
/// per value.
#[inline(always)]
pub fn round_small(x: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    (x + SHIFT) - SHIFT
}

/// Exact `sum a_i b_i` of two int8 vectors (values in [-127, 127]).
pub fn dot(a: &[i8], b: &[i8]) -> i32 {
    dot_at(active(), a, b)
}

/// [`dot`] at a given level (capped at what the CPU has); the same integer on every level.
pub fn dot_at(level: Level, a: &[i8], b: &[i8]) -> i32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    dispatch!(level,
        avx512 => x86::dot_avx512(a, b),
        avx2 => x86::dot_avx2(a, b),
        portable => dot_lanes(a, b))
}

#[inline(always)]
fn dot_lanes(a: &[i8], b: &[i8]) -> i32 {
    // 32 independent i16 x i16 -> i32 sums: the shape compilers turn into multiply-add-pairs.
    const LANES: usize = 32;
    let mut acc = [0i32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: i32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(&x, &y)| x as i32 * y as i32)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += (x[i] as i16 * y[i] as i16) as i32;
        }
    }
    acc.iter().sum::<i32>() + tail
}

/// Query tokens quantised like stored tokens (one symmetric scale per token) and packed for
/// one level, to score many int8 documents.
pub struct I8Query {
    codes: Vec<i8>,
    scales: Vec<f32>,
    d: usize,
    level: Level,
    /// Vector levels (AMX too, for short runs): `[blocks][d / 4][BLOCK][4]`, tokens past
    /// the end zero.
    packed: Vec<i8>,
    /// AMX: the tokens as the columns of tile products.
    tiles: Option<PackedI8>,
}

/// Where a document's codes can be read by the vector kernels: four bytes at a time, which
/// needs rows of a multiple of 4 bytes.
fn vector_rows_fit(d: usize) -> bool {
    d > 0 && d.is_multiple_of(4)
}

impl I8Query {
    /// Quantises `tokens` (`[kq, d]`) and packs them for the active level.
    pub fn new(tokens: &[f32], d: usize) -> Self {
        Self::with_level(tokens, d, active())
    }

    /// [`I8Query::new`] for the kernels of `level` (capped at what the CPU has).
    pub fn with_level(tokens: &[f32], d: usize, level: Level) -> Self {
        let (mut codes, mut scales) = (Vec::new(), Vec::new());
        quantise_rows(tokens, d, &mut codes, &mut scales);
        Self::from_codes(codes, scales, d, level)
    }

    /// A query from codes already quantised (`[kq, d]`, scales `[kq]`).
    pub fn from_codes(codes: Vec<i8>, scales: Vec<f32>, d: usize, level: Level) -> Self {
        let mut level = level.min(detected());
        let kq = scales.len();
        assert_eq!(codes.len(), kq * d, "codes must be [kq, d]");
        if level > Level::Portable && !vector_rows_fit(d) {
            level = Level::Portable;
        }
        let tiles = (level == Level::Amx && PackedI8::fits(d) && kq > 0)
            .then(|| PackedI8::new(&codes, kq, d));
        if level == Level::Amx && tiles.is_none() {
            level = Level::Avx512;
        }
        let mut packed = Vec::new();
        if level > Level::Portable && kq > 0 {
            let quads = d / 4;
            packed = vec![0i8; kq.div_ceil(BLOCK) * quads * BLOCK * 4];
            for (i, row) in codes.chunks_exact(d).enumerate() {
                let (b, lane) = (i / BLOCK, i % BLOCK);
                for (kk, quad) in row.chunks_exact(4).enumerate() {
                    let at = ((b * quads + kk) * BLOCK + lane) * 4;
                    packed[at..at + 4].copy_from_slice(quad);
                }
            }
        }
        Self {
            codes,
            scales,
            d,
            level,
            packed,
            tiles,
        }
    }

    pub fn tokens(&self) -> usize {
        self.scales.len()
    }
    pub fn dim(&self) -> usize {
        self.d
    }
    pub fn codes(&self) -> &[i8] {
        &self.codes
    }
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }
    /// The level this query's kernels run at.
    pub fn level(&self) -> Level {
        self.level
    }

    /// Appends the MaxSim score of each document of `kd` tokens in `runs`: each run is the
    /// codes `[n * kd, d]` and scales `[n * kd]` of consecutive documents (runs let a
    /// shortlist's scattered documents go through one call).
    pub fn maxsim(&self, runs: &[(&[i8], &[f32])], kd: usize, out: &mut Vec<f32>) {
        let (d, kq) = (self.d, self.tokens());
        if kd == 0 || d == 0 {
            return;
        }
        let docs: usize = runs.iter().map(|r| r.1.len() / kd).sum();
        if kq == 0 {
            out.extend(std::iter::repeat_n(0.0, docs));
            return;
        }
        if self.level == Level::Amx {
            if let Some(tiles) = &self.tiles {
                return self.maxsim_tiles(tiles, runs, kd, out);
            }
        }
        let mut best = vec![f32::NEG_INFINITY; kq.div_ceil(BLOCK) * BLOCK];
        for &(codes, scales) in runs {
            let n = scales.len() / kd;
            assert!(
                codes.len() >= n * kd * d,
                "a run's codes are shorter than its scales"
            );
            for i in 0..n {
                let doc = &codes[i * kd * d..(i + 1) * kd * d];
                let doc_scales = &scales[i * kd..(i + 1) * kd];
                // packed is [blocks][d/4][BLOCK][4], doc [kd, d] with d a multiple of 4
                dispatch!(self.level,
                    avx512 => x86::best_avx512(&self.packed, d, doc, doc_scales, &mut best),
                    avx2 => x86::best_avx2(&self.packed, d, doc, doc_scales, &mut best),
                    portable => self.best_plain(doc, doc_scales, &mut best));
                out.push(self.fold(&best));
            }
        }
    }

    /// The portable per-token maxima of one document.
    fn best_plain(&self, doc: &[i8], doc_scales: &[f32], best: &mut [f32]) {
        let d = self.d;
        best.iter_mut().for_each(|b| *b = f32::NEG_INFINITY);
        for (g, &s) in doc.chunks_exact(d).zip(doc_scales) {
            for (b, q) in best.iter_mut().zip(self.codes.chunks_exact(d)) {
                *b = b.max(dot_lanes(q, g) as f32 * s);
            }
        }
    }

    /// `mean_i best_i * scale_i` over the real query tokens, in token order.
    fn fold(&self, best: &[f32]) -> f32 {
        let total: f32 = best.iter().zip(&self.scales).map(|(b, s)| b * s).sum();
        total / self.scales.len() as f32
    }

    fn maxsim_tiles(
        &self,
        tiles: &PackedI8,
        runs: &[(&[i8], &[f32])],
        kd: usize,
        out: &mut Vec<f32>,
    ) {
        let rows: usize = runs.iter().map(|r| r.1.len()).sum();
        let cols = tiles.columns();
        let mut products = vec![0i32; rows * cols];
        let parts: Vec<&[i8]> = runs.iter().map(|(c, s)| &c[..s.len() * self.d]).collect();
        amx::i8_products_of_parts(&parts, tiles, &mut products);
        let mut best = vec![f32::NEG_INFINITY; cols];
        let doc_scales = runs.iter().flat_map(|r| r.1.chunks_exact(kd));
        for (doc, doc_scales) in products.chunks_exact(kd * cols).zip(doc_scales) {
            best.iter_mut().for_each(|b| *b = f32::NEG_INFINITY);
            for (row, &s) in doc.chunks_exact(cols).zip(doc_scales) {
                for (b, &p) in best.iter_mut().zip(row) {
                    *b = b.max(p as f32 * s);
                }
            }
            out.push(self.fold(&best));
        }
    }

    /// Exact integer products of every row of `rows` (`[n, d]`) with every query token:
    /// `out` becomes `[n, kq]`.
    pub fn products(&self, rows: &[i8], out: &mut Vec<i32>) {
        let (d, kq) = (self.d, self.tokens());
        let n = rows.len().checked_div(d).unwrap_or(0);
        out.clear();
        out.resize(n * kq, 0);
        if n == 0 || kq == 0 {
            return;
        }
        let rows = &rows[..n * d];
        // Short runs go to the row loop: a tile pass has a fixed cost.
        const TILE_MIN_ROWS: usize = 64;
        if let Some(tiles) = self.tiles.as_ref().filter(|_| n >= TILE_MIN_ROWS) {
            let cols = tiles.columns();
            let mut all = vec![0i32; n * cols];
            amx::i8_products(rows, n, tiles, &mut all);
            for (o, p) in out.chunks_exact_mut(kq).zip(all.chunks_exact(cols)) {
                o.copy_from_slice(&p[..kq]);
            }
            return;
        }
        if kq > 1 && !self.packed.is_empty() {
            let mut lanes = vec![0i32; n * BLOCK];
            let block_len = d / 4 * BLOCK * 4;
            for (b, q) in self.packed.chunks_exact(block_len).enumerate() {
                // q is one packed block, rows [n, d] with d a multiple of 4, lanes [n, BLOCK]
                dispatch!(self.level,
                    avx512 => x86::products_avx512(q, d, rows, &mut lanes),
                    avx2 => x86::products_avx2(q, d, rows, &mut lanes),
                    portable => crate::i8_block::products_plain(q, d / 4, rows, d, &mut lanes));
                let width = (kq - b * BLOCK).min(BLOCK);
                for (o, l) in out.chunks_exact_mut(kq).zip(lanes.chunks_exact(BLOCK)) {
                    o[b * BLOCK..b * BLOCK + width].copy_from_slice(&l[..width]);
                }
            }
            return;
        }
        for (o, r) in out.chunks_exact_mut(kq).zip(rows.chunks_exact(d)) {
            for (o, q) in o.iter_mut().zip(self.codes.chunks_exact(d)) {
                *o = dot_at(self.level, q, r);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{dot_lanes, quantise_plain, BLOCK};
    use crate::simd::{Avx2, Avx512, Avx512Vnni, Vector};

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn quantise_avx2(v: &[f32], codes: &mut Vec<i8>) -> f32 {
        quantise_plain(v, codes)
    }
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn quantise_avx512(v: &[f32], codes: &mut Vec<i8>) -> f32 {
        quantise_plain(v, codes)
    }

    /// Exact dot of two int8 vectors, 32 or 64 bytes per step with the sign trick.
    #[inline(always)]
    unsafe fn dot_generic<V: Vector>(a: &[i8], b: &[i8]) -> i32 {
        let step = V::LANES * 4;
        let n = a.len().min(b.len());
        let body = n - n % step;
        // SAFETY: (whole body) features of V per the caller; reads stay below `body`.
        unsafe {
            let mut acc = V::zero_i();
            let mut i = 0;
            while i < body {
                let av = V::load_i(a.as_ptr().add(i));
                let bv = V::load_i(b.as_ptr().add(i));
                acc = V::dot4_acc(acc, av, V::abs_i8(av), bv);
                i += step;
            }
            let mut lanes = [0i32; 16];
            V::store_i(lanes.as_mut_ptr(), acc);
            lanes[..V::LANES].iter().sum::<i32>() + dot_lanes(&a[body..n], &b[body..n])
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_avx2(a: &[i8], b: &[i8]) -> i32 {
        // SAFETY: the features are enabled on this function.
        unsafe { dot_generic::<Avx2>(a, b) }
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn dot_avx512(a: &[i8], b: &[i8]) -> i32 {
        // SAFETY: the features are enabled on this function.
        unsafe { dot_generic::<Avx512>(a, b) }
    }

    /// Integer products of `R` document rows at `doc` (row stride `d` bytes) with one packed
    /// query block (`[d/4][BLOCK][4]`).
    #[inline(always)]
    unsafe fn block<V: Vector, const R: usize, const NV: usize>(
        q: *const i8,
        doc: *const i8,
        d: usize,
    ) -> [[V::I; NV]; R] {
        // SAFETY: features of V per the caller; q holds d/4 * BLOCK * 4 bytes, doc R rows of
        // d bytes (d a multiple of 4); NV * V::LANES == BLOCK.
        unsafe { crate::i8_block::products::<V, R, NV>(q, doc, d, d / 4) }
    }

    /// Per packed query lane, `max_j product(j) * doc_scale(j)` over one document's rows.
    #[inline(always)]
    unsafe fn best_generic<V: Vector, const R: usize, const NV: usize>(
        packed: &[i8],
        d: usize,
        doc: &[i8],
        doc_scales: &[f32],
        best: &mut [f32],
    ) {
        let kd = doc_scales.len();
        let block_len = d / 4 * BLOCK * 4;
        debug_assert!(doc.len() >= kd * d && best.len() / BLOCK * block_len == packed.len());
        // SAFETY: (whole body) features of V per the caller; pointers stay inside packed,
        // doc ([kd, d]) and best ([blocks * BLOCK]).
        unsafe {
            for (b, out) in best.chunks_exact_mut(BLOCK).enumerate() {
                let q = packed.as_ptr().add(b * block_len);
                let mut m = [V::splat_f(f32::NEG_INFINITY); NV];
                let mut fold = |acc: &[V::I; NV], s: f32| {
                    let s = V::splat_f(s);
                    for v in 0..NV {
                        m[v] = V::max_f(m[v], V::mul_f(V::to_f(acc[v]), s));
                    }
                };
                let mut r = 0;
                while r + R <= kd {
                    let acc = block::<V, R, NV>(q, doc.as_ptr().add(r * d), d);
                    for (i, a) in acc.iter().enumerate() {
                        fold(a, doc_scales[r + i]);
                    }
                    r += R;
                }
                while r < kd {
                    let [a] = block::<V, 1, NV>(q, doc.as_ptr().add(r * d), d);
                    fold(&a, doc_scales[r]);
                    r += 1;
                }
                for (v, m) in m.iter().enumerate() {
                    V::store_f(out.as_mut_ptr().add(v * V::LANES), *m);
                }
            }
        }
    }

    /// Integer products of every row of `rows` (`[n, d]`) with one packed block: `out`
    /// `[n, BLOCK]`.
    #[inline(always)]
    unsafe fn products_generic<V: Vector, const R: usize, const NV: usize>(
        q: &[i8],
        d: usize,
        rows: &[i8],
        out: &mut [i32],
    ) {
        let n = rows.len() / d;
        debug_assert!(out.len() >= n * BLOCK);
        // SAFETY: (whole body) features of V per the caller; pointers stay inside q, rows and
        // out.
        unsafe {
            let store = |out: &mut [i32], r: usize, a: &[V::I; NV]| {
                for (v, a) in a.iter().enumerate() {
                    V::store_i(out.as_mut_ptr().add(r * BLOCK + v * V::LANES), *a);
                }
            };
            let mut r = 0;
            while r + R <= n {
                let acc = block::<V, R, NV>(q.as_ptr(), rows.as_ptr().add(r * d), d);
                for (i, a) in acc.iter().enumerate() {
                    store(out, r + i, a);
                }
                r += R;
            }
            while r < n {
                let [a] = block::<V, 1, NV>(q.as_ptr(), rows.as_ptr().add(r * d), d);
                store(out, r, &a);
                r += 1;
            }
        }
    }

    // AVX2 keeps 2 rows x 4 registers of accumulators, the rows' broadcasts and their
    // absolute values in its 16 registers; AVX-512 6 rows x 2 in its 32.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn best_avx2(packed: &[i8], d: usize, doc: &[i8], s: &[f32], best: &mut [f32]) {
        // SAFETY: the features are enabled on this function; sizes per best_generic.
        unsafe { best_generic::<Avx2, 2, 4>(packed, d, doc, s, best) }
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn best_avx512(packed: &[i8], d: usize, doc: &[i8], s: &[f32], best: &mut [f32]) {
        if crate::level::has_avx512_vnni() {
            // SAFETY: VNNI was detected; the other features are enabled on this function.
            unsafe { best_vnni(packed, d, doc, s, best) }
        } else {
            // SAFETY: the features are enabled on this function; sizes per best_generic.
            unsafe { best_generic::<Avx512, 6, 2>(packed, d, doc, s, best) }
        }
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn best_vnni(packed: &[i8], d: usize, doc: &[i8], s: &[f32], best: &mut [f32]) {
        // SAFETY: the features are enabled on this function; sizes per best_generic.
        unsafe { best_generic::<Avx512Vnni, 6, 2>(packed, d, doc, s, best) }
    }
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn products_avx2(q: &[i8], d: usize, rows: &[i8], out: &mut [i32]) {
        // SAFETY: the features are enabled on this function; sizes per products_generic.
        unsafe { products_generic::<Avx2, 2, 4>(q, d, rows, out) }
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn products_avx512(q: &[i8], d: usize, rows: &[i8], out: &mut [i32]) {
        if crate::level::has_avx512_vnni() {
            // SAFETY: VNNI was detected; the other features are enabled on this function.
            unsafe { products_vnni(q, d, rows, out) }
        } else {
            // SAFETY: the features are enabled on this function; sizes per products_generic.
            unsafe { products_generic::<Avx512, 6, 2>(q, d, rows, out) }
        }
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn products_vnni(q: &[i8], d: usize, rows: &[i8], out: &mut [i32]) {
        // SAFETY: the features are enabled on this function; sizes per products_generic.
        unsafe { products_generic::<Avx512Vnni, 6, 2>(q, d, rows, out) }
    }
}
