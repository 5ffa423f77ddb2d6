//! f32 kernels: dot products, late interaction (MaxSim) of one query against many documents,
//! a query block's dot products with many rows, and element-wise maps.
//!
//! A query is packed once ([`F32Query`]): its tokens in blocks of two registers, each block
//! transposed to `[d, block]`, so that the vector kernels broadcast one document value against
//! a whole register of query tokens and fold maxima without horizontal reductions. Scores
//! differ between levels only by the order of the additions in each dot product (bounded in
//! the tests, far below the int8 codec's error).

use crate::level::{active, detected, dispatch, Level};

/// Query tokens per packed block: 4 AVX2 or 2 AVX-512 registers. (Blocks of 16, which stay
/// in L1 at d = 384, measured slower on AVX2: 31 against 35 GMAC/s per core.)
pub const BLOCK: usize = 32;

/// `sum a_i b_i`, vectorised for the active level.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_at(active(), a, b)
}

/// [`dot`] at a given level (capped at what the CPU has).
pub fn dot_at(level: Level, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    dispatch!(level,
        avx512 => x86::dot_avx512(a, b),
        avx2 => x86::dot_avx2(a, b),
        portable => dot_lanes(a, b))
}

/// Sixteen running sums, the shape compilers turn into vector code at any width.
#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Per query token (row of `q`, `[kq, d]`), the best dot product against the rows of `doc`
/// (`[kd, d]`), written to `best` (`[kq]`). The portable reference of the packed kernels.
pub fn max_dots(q: &[f32], doc: &[f32], d: usize, best: &mut [f32]) {
    best.iter_mut().for_each(|b| *b = f32::NEG_INFINITY);
    for g in doc.chunks_exact(d) {
        for (b, qi) in best.iter_mut().zip(q.chunks_exact(d)) {
            *b = b.max(dot_lanes(qi, g));
        }
    }
}

/// The MaxSim score `mean_i max_j <q_i, g_j>` of one document, portable.
pub fn maxsim(q: &[f32], doc: &[f32], d: usize) -> f32 {
    let kq = q.len() / d.max(1);
    if kq == 0 || doc.len() < d || d == 0 {
        return 0.0;
    }
    let mut best = vec![0f32; kq];
    max_dots(q, doc, d, &mut best);
    best.iter().sum::<f32>() / kq as f32
}

/// A query ready to score many documents or rows at the active level.
pub struct F32Query {
    tokens: Vec<f32>,
    d: usize,
    kq: usize,
    level: Level,
    /// `[blocks][d][block]`, lanes past `kq` zero (vector levels only).
    packed: Vec<f32>,
}

impl F32Query {
    /// Above this many queries, scoring a block of rows is a GEMM rather than a dot
    /// product per query and row.
    pub const BATCH_FROM: usize = 2 * BLOCK;

    /// `tokens` is `[kq, d]` row-major.
    pub fn new(tokens: &[f32], d: usize) -> Self {
        Self::with_level(tokens, d, active())
    }

    /// A query for the kernels of `level` (capped at what the CPU has): tests and
    /// benchmarks compare levels in one process.
    pub fn with_level(tokens: &[f32], d: usize, level: Level) -> Self {
        let kq = tokens.len().checked_div(d).unwrap_or(0);
        let level = level.min(detected());
        let block = BLOCK;
        let mut packed = Vec::new();
        if level > Level::Portable && kq > 0 {
            let blocks = kq.div_ceil(block);
            packed = vec![0f32; blocks * d * block];
            for (i, row) in tokens.chunks_exact(d).enumerate() {
                let (b, lane) = (i / block, i % block);
                for (k, &v) in row.iter().enumerate() {
                    packed[(b * d + k) * block + lane] = v;
                }
            }
        }
        Self {
            tokens: tokens[..kq * d].to_vec(),
            d,
            kq,
            level,
            packed,
        }
    }

    pub fn tokens(&self) -> usize {
        self.kq
    }
    pub fn dim(&self) -> usize {
        self.d
    }

    /// Appends the MaxSim score of each document of `kd` tokens in `docs` (`[n * kd, d]`).
    pub fn maxsim(&self, docs: &[f32], kd: usize, out: &mut Vec<f32>) {
        let d = self.d;
        if kd == 0 || d == 0 {
            return;
        }
        let n = docs.len() / (kd * d);
        if self.kq == 0 {
            out.extend(std::iter::repeat_n(0.0, n));
            return;
        }
        let docs = &docs[..n * kd * d];
        // per packed lane at a vector level; per token (the tokens unpacked) otherwise
        let mut best = vec![0f32; (self.packed.len() / d).max(self.kq)];
        for doc in docs.chunks_exact(kd * d) {
            // packed is [blocks][d][block] (at vector levels) and doc [kd, d]
            dispatch!(self.level,
                avx512 => x86::best_avx512(&self.packed, d, doc, kd, &mut best),
                avx2 => x86::best_avx2(&self.packed, d, doc, kd, &mut best),
                portable => max_dots(&self.tokens, doc, d, &mut best[..self.kq]));
            out.push(self.fold(&best));
        }
    }

    /// The mean over the real query tokens of their best scores (the first `kq` of `best`).
    fn fold(&self, best: &[f32]) -> f32 {
        best[..self.kq].iter().sum::<f32>() / self.kq as f32
    }

    /// Every query token's dot product with every row of `rows` (`[n, d]`): `out` becomes
    /// `[n, kq]`.
    pub fn dots(&self, rows: &[f32], out: &mut Vec<f32>) {
        let d = self.d;
        let n = rows.len().checked_div(d).unwrap_or(0);
        out.clear();
        out.resize(n * self.kq, 0.0);
        if n == 0 || self.kq == 0 {
            return;
        }
        let rows = &rows[..n * d];
        if self.level > Level::Portable && self.kq > 1 {
            let block = BLOCK;
            let mut lanes = vec![0f32; n * block];
            for (b, q) in self.packed.chunks_exact(d * block).enumerate() {
                // q is [d][block], rows [n, d], lanes [n, block]
                dispatch!(self.level,
                    avx512 => x86::dots_avx512(q, d, rows, &mut lanes),
                    avx2 => x86::dots_avx2(q, d, rows, &mut lanes),
                    portable => dots_block(q, d, rows, &mut lanes));
                let width = (self.kq - b * block).min(block);
                for (o, l) in out.chunks_exact_mut(self.kq).zip(lanes.chunks_exact(block)) {
                    o[b * block..b * block + width].copy_from_slice(&l[..width]);
                }
            }
            return;
        }
        for (o, r) in out.chunks_exact_mut(self.kq).zip(rows.chunks_exact(d)) {
            for (o, q) in o.iter_mut().zip(self.tokens.chunks_exact(d)) {
                *o = dot_at(self.level, q, r);
            }
        }
    }
}

/// Applies `f` to every element, compiled for the widest vectors of the active level (the
/// build targets baseline x86-64, whose 4-lane SSE would leave most of a newer CPU idle).
/// `f` must be branch-free arithmetic for the wide versions to vectorise.
pub fn map_in_place(v: &mut [f32], f: impl Fn(f32) -> f32) {
    map_in_place_fused(v, &f, &f)
}

/// [`map_in_place`] with two forms of `f`: `fused` for the vector levels, which all have FMA
/// (its fused multiply-adds are one instruction there), `plain` for the portable level.
pub fn map_in_place_fused(v: &mut [f32], fused: impl Fn(f32) -> f32, plain: impl Fn(f32) -> f32) {
    dispatch!(active(),
        avx512 => x86::map_avx512(v, fused),
        avx2 => x86::map_avx2(v, fused),
        portable => v.iter_mut().for_each(|x| *x = plain(*x)))
}

/// Every row's dot products with one packed block of query tokens (`q` `[d][BLOCK]`): `lanes`
/// `[n, BLOCK]`; the portable form of the vector kernels' block.
fn dots_block(q: &[f32], d: usize, rows: &[f32], lanes: &mut [f32]) {
    for (l, r) in lanes.chunks_exact_mut(BLOCK).zip(rows.chunks_exact(d)) {
        l.fill(0.0);
        for (&x, qk) in r.iter().zip(q.chunks_exact(BLOCK)) {
            for (l, &qv) in l.iter_mut().zip(qk) {
                *l += x * qv;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::dot_lanes;
    use crate::simd::{Avx2, Avx512, Vector};

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
        dot_lanes(a, b)
    }
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
        dot_lanes(a, b)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn map_avx2(v: &mut [f32], f: impl Fn(f32) -> f32) {
        v.iter_mut().for_each(|x| *x = f(*x));
    }
    #[target_feature(enable = "avx512f")]
    pub unsafe fn map_avx512(v: &mut [f32], f: impl Fn(f32) -> f32) {
        v.iter_mut().for_each(|x| *x = f(*x));
    }

    /// `acc[r][v] = sum_{i<k} q[i][v-th register of the block] * a[r * lda + i]` for `R` rows
    /// of `a` against one packed block `q` (`[k][NV * LANES]`, rows `q_stride` floats apart:
    /// `NV * LANES`, or wider where only the first registers of a block are wanted).
    #[inline(always)]
    pub(crate) unsafe fn rows_block<V: Vector, const R: usize, const NV: usize>(
        q: *const f32,
        q_stride: usize,
        a: *const f32,
        lda: usize,
        k: usize,
    ) -> [[V::F; NV]; R] {
        // SAFETY: (whole body) the caller guarantees the features of V, that q holds k rows
        // of at least NV * LANES floats, q_stride apart, and a R rows of k floats, lda apart.
        unsafe {
            // R broadcasts, then each query register is loaded once and used R times:
            // R * NV accumulators + R + 1 registers in all (16 on AVX2 at R = 3, NV = 4).
            let mut acc = [[V::zero_f(); NV]; R];
            for i in 0..k {
                let mut g = [V::zero_f(); R];
                for (r, g) in g.iter_mut().enumerate() {
                    *g = V::splat_f(*a.add(r * lda + i));
                }
                for v in 0..NV {
                    let qv = V::load_f(q.add(i * q_stride + v * V::LANES));
                    for r in 0..R {
                        acc[r][v] = V::fmadd(g[r], qv, acc[r][v]);
                    }
                }
            }
            acc
        }
    }

    /// Per packed query lane, the best dot product over the rows of one document (`[kd, d]`):
    /// `best` becomes `[blocks * NV * LANES]`.
    #[inline(always)]
    unsafe fn best_generic<V: Vector, const R: usize, const NV: usize>(
        packed: &[f32],
        d: usize,
        doc: &[f32],
        kd: usize,
        best: &mut [f32],
    ) {
        let block = NV * V::LANES;
        debug_assert!(doc.len() >= kd * d && best.len() * d == packed.len());
        // SAFETY: (whole body) features of V per the caller; every pointer stays inside
        // packed ([blocks][d][block]), doc ([kd, d]) or best ([blocks * block]).
        unsafe {
            for (b, out) in best.chunks_exact_mut(block).enumerate() {
                let q = packed.as_ptr().add(b * d * block);
                let mut m = [V::splat_f(f32::NEG_INFINITY); NV];
                let mut r = 0;
                while r + R <= kd {
                    let acc = rows_block::<V, R, NV>(q, block, doc.as_ptr().add(r * d), d, d);
                    for a in &acc {
                        for v in 0..NV {
                            m[v] = V::max_f(m[v], a[v]);
                        }
                    }
                    r += R;
                }
                while r < kd {
                    let [a] = rows_block::<V, 1, NV>(q, block, doc.as_ptr().add(r * d), d, d);
                    for v in 0..NV {
                        m[v] = V::max_f(m[v], a[v]);
                    }
                    r += 1;
                }
                for (v, m) in m.iter().enumerate() {
                    V::store_f(out.as_mut_ptr().add(v * V::LANES), *m);
                }
            }
        }
    }

    /// Dot products of every row of `rows` (`[n, d]`) with one packed block: `out`
    /// `[n, NV * LANES]`.
    #[inline(always)]
    unsafe fn dots_generic<V: Vector, const R: usize, const NV: usize>(
        q: &[f32],
        d: usize,
        rows: &[f32],
        out: &mut [f32],
    ) {
        let n = rows.len() / d;
        let block = NV * V::LANES;
        debug_assert!(q.len() == d * block && out.len() >= n * block);
        // SAFETY: (whole body) features of V per the caller; pointers stay inside q, rows
        // and out (sizes above).
        unsafe {
            let mut r = 0;
            let store = |out: &mut [f32], r: usize, a: &[V::F; NV]| {
                for (v, a) in a.iter().enumerate() {
                    V::store_f(out.as_mut_ptr().add(r * block + v * V::LANES), *a);
                }
            };
            while r + R <= n {
                let acc = rows_block::<V, R, NV>(q.as_ptr(), block, rows.as_ptr().add(r * d), d, d);
                for (i, a) in acc.iter().enumerate() {
                    store(out, r + i, a);
                }
                r += R;
            }
            while r < n {
                let [a] = rows_block::<V, 1, NV>(q.as_ptr(), block, rows.as_ptr().add(r * d), d, d);
                store(out, r, &a);
                r += 1;
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn best_avx2(packed: &[f32], d: usize, doc: &[f32], kd: usize, best: &mut [f32]) {
        // SAFETY: the features are enabled on this function; sizes per best_generic.
        unsafe { best_generic::<Avx2, 3, 4>(packed, d, doc, kd, best) }
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn best_avx512(packed: &[f32], d: usize, doc: &[f32], kd: usize, best: &mut [f32]) {
        // SAFETY: the features are enabled on this function; sizes per best_generic.
        unsafe { best_generic::<Avx512, 8, 2>(packed, d, doc, kd, best) }
    }
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dots_avx2(q: &[f32], d: usize, rows: &[f32], out: &mut [f32]) {
        // SAFETY: the features are enabled on this function; sizes per dots_generic.
        unsafe { dots_generic::<Avx2, 3, 4>(q, d, rows, out) }
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn dots_avx512(q: &[f32], d: usize, rows: &[f32], out: &mut [f32]) {
        // SAFETY: the features are enabled on this function; sizes per dots_generic.
        unsafe { dots_generic::<Avx512, 8, 2>(q, d, rows, out) }
    }
}
