//! The one int8 inner kernel: exact integer products of rows of signed codes with a packed
//! block of 32 columns, laid out `[steps][32][4]` (four consecutive bytes of each column
//! together), four bytes at a time. MaxSim runs on it with the query's tokens as the columns
//! (`int8`), and the ViT's int8 linear layer with a weight block's columns, one quantisation
//! group at a time (`linear_i8`).

/// Columns of a packed block.
pub const COLUMNS: usize = 32;

/// `out[r][c] = sum_{s < steps, t < 4} rows[r][4 s + t] * w[s][c][t]` for every row of
/// `rows` (rows `stride` bytes apart, `4 * steps` of them read), portably; `out` is
/// `[rows, COLUMNS]`.
pub fn products_plain(w: &[i8], steps: usize, rows: &[i8], stride: usize, out: &mut [i32]) {
    for (o, row) in out.chunks_exact_mut(COLUMNS).zip(rows.chunks(stride)) {
        o.fill(0);
        for (quad, wq) in row[..4 * steps]
            .chunks_exact(4)
            .zip(w.chunks_exact(4 * COLUMNS))
        {
            for (c, o) in o.iter_mut().enumerate() {
                for t in 0..4 {
                    *o += quad[t] as i32 * wq[c * 4 + t] as i32;
                }
            }
        }
    }
}

/// The vector form: `R` rows at `a` (`stride` bytes apart) against the packed block at `w`;
/// `acc[r][v]` holds `NV` registers of columns.
///
/// # Safety
/// The CPU has `V`'s features; `w` holds `steps * COLUMNS * 4` bytes, `a` `R` rows of
/// `4 * steps` bytes `stride` apart, and `NV * V::LANES == COLUMNS`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn products<V: crate::simd::Vector, const R: usize, const NV: usize>(
    w: *const i8,
    a: *const i8,
    stride: usize,
    steps: usize,
) -> [[V::I; NV]; R] {
    // SAFETY: (whole body) per the function's contract.
    unsafe {
        let mut acc = [[V::zero_i(); NV]; R];
        for s in 0..steps {
            let mut x = [V::zero_i(); R];
            let mut abs = [V::zero_i(); R];
            for r in 0..R {
                x[r] = V::splat4_i8(a.add(r * stride + 4 * s));
                abs[r] = V::abs_i8(x[r]);
            }
            for v in 0..NV {
                let wv = V::load_i(w.add((s * COLUMNS + v * V::LANES) * 4));
                for r in 0..R {
                    acc[r][v] = V::dot4_acc(acc[r][v], x[r], abs[r], wv);
                }
            }
        }
        acc
    }
}
