//! The few vector operations the kernels need, for 256-bit (AVX2 + FMA) and 512-bit
//! (AVX-512) registers. Kernels are written once, generic over [`Vector`], and compiled per
//! level inside a `#[target_feature]` function: every method is `#[inline(always)]`, so the
//! intrinsics inline into that function and run with its features.
//!
//! Contract of every method: the CPU has the features of the implementing type (AVX2 + FMA
//! for [`Avx2`]; AVX-512 F, BW, VL for [`Avx512`], plus VNNI for [`Avx512Vnni`]), and a pointer
//! argument is valid for one register's worth of reads or writes (4 bytes for `splat4_i8`).
//! Each `unsafe` block below relies on exactly that.

use std::arch::x86_64::*;

pub trait Vector: Copy {
    /// f32 lanes per register (and i32 lanes of the integer operations).
    const LANES: usize;
    type F: Copy;
    type I: Copy;

    unsafe fn zero_f() -> Self::F;
    unsafe fn splat_f(v: f32) -> Self::F;
    unsafe fn load_f(p: *const f32) -> Self::F;
    unsafe fn store_f(p: *mut f32, v: Self::F);
    /// `a * b + c`
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    unsafe fn max_f(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn mul_f(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn add_f(a: Self::F, b: Self::F) -> Self::F;

    unsafe fn zero_i() -> Self::I;
    /// Four consecutive bytes at `p` repeated in every 32-bit lane.
    unsafe fn splat4_i8(p: *const i8) -> Self::I;
    unsafe fn load_i(p: *const i8) -> Self::I;
    unsafe fn store_i(p: *mut i32, v: Self::I);

    unsafe fn abs_i8(v: Self::I) -> Self::I;
    /// Exact signed int8 dot products of four: lane `i` of `acc` gains
    /// `sum_{t<4} a[4i+t] * b[4i+t]`, given `abs_a = |a|` (all of `a`, `b` in [-127, 127]).
    unsafe fn dot4_acc(acc: Self::I, a: Self::I, abs_a: Self::I, b: Self::I) -> Self::I;

    unsafe fn to_f(v: Self::I) -> Self::F;
}

#[derive(Clone, Copy)]
pub struct Avx2;

impl Vector for Avx2 {
    const LANES: usize = 8;
    type F = __m256;
    type I = __m256i;

    #[inline(always)]
    unsafe fn zero_f() -> __m256 {
        // SAFETY: the trait contract (CPU features).
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> __m256 {
        // SAFETY: the trait contract (CPU features).
        unsafe { _mm256_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn load_f(p: *const f32) -> __m256 {
        // SAFETY: the trait contract (CPU features, 8 readable floats at p).
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, v: __m256) {
        // SAFETY: the trait contract (CPU features, 8 writable floats at p).
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: the trait contract (CPU features).
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn max_f(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the trait contract (CPU features).
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul_f(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the trait contract (CPU features).
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn add_f(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the trait contract (CPU features).
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn zero_i() -> __m256i {
        // SAFETY: the trait contract (CPU features).
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    unsafe fn splat4_i8(p: *const i8) -> __m256i {
        // SAFETY: the trait contract (CPU features, 4 readable bytes at p).
        unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
    }
    #[inline(always)]
    unsafe fn load_i(p: *const i8) -> __m256i {
        // SAFETY: the trait contract (CPU features, 32 readable bytes at p).
        unsafe { _mm256_loadu_si256(p.cast()) }
    }
    #[inline(always)]
    unsafe fn store_i(p: *mut i32, v: __m256i) {
        // SAFETY: the trait contract (CPU features, 8 writable i32 at p).
        unsafe { _mm256_storeu_si256(p.cast(), v) }
    }
    #[inline(always)]
    unsafe fn abs_i8(v: __m256i) -> __m256i {
        // SAFETY: the trait contract (CPU features).
        unsafe { _mm256_abs_epi8(v) }
    }
    #[inline(always)]
    unsafe fn dot4_acc(acc: __m256i, a: __m256i, abs_a: __m256i, b: __m256i) -> __m256i {
        // |a| times (b with a's signs): the unsigned x signed byte products are then exact,
        // and a pair of them (at most 2 * 127 * 127) cannot saturate the 16-bit sum.
        // SAFETY: the trait contract (CPU features).
        unsafe {
            let pairs = _mm256_maddubs_epi16(abs_a, _mm256_sign_epi8(b, a));
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
    #[inline(always)]
    unsafe fn to_f(v: __m256i) -> __m256 {
        // SAFETY: the trait contract (CPU features).
        unsafe { _mm256_cvtepi32_ps(v) }
    }
}

/// 512-bit vectors without VNNI (Skylake-SP, and Cascade Lake parts without it).
#[derive(Clone, Copy)]
pub struct Avx512;

/// 512-bit vectors with VNNI: the int8 dot of four is one `vpdpbusd`.
#[derive(Clone, Copy)]
pub struct Avx512Vnni;

macro_rules! avx512_common {
    () => {
        const LANES: usize = 16;
        type F = __m512;
        type I = __m512i;

        #[inline(always)]
        unsafe fn zero_f() -> __m512 {
            // SAFETY: the trait contract (CPU features).
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn splat_f(v: f32) -> __m512 {
            // SAFETY: the trait contract (CPU features).
            unsafe { _mm512_set1_ps(v) }
        }
        #[inline(always)]
        unsafe fn load_f(p: *const f32) -> __m512 {
            // SAFETY: the trait contract (CPU features, 16 readable floats at p).
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store_f(p: *mut f32, v: __m512) {
            // SAFETY: the trait contract (CPU features, 16 writable floats at p).
            unsafe { _mm512_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
            // SAFETY: the trait contract (CPU features).
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn max_f(a: __m512, b: __m512) -> __m512 {
            // SAFETY: the trait contract (CPU features).
            unsafe { _mm512_max_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn mul_f(a: __m512, b: __m512) -> __m512 {
            // SAFETY: the trait contract (CPU features).
            unsafe { _mm512_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn add_f(a: __m512, b: __m512) -> __m512 {
            // SAFETY: the trait contract (CPU features).
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn zero_i() -> __m512i {
            // SAFETY: the trait contract (CPU features).
            unsafe { _mm512_setzero_si512() }
        }
        #[inline(always)]
        unsafe fn splat4_i8(p: *const i8) -> __m512i {
            // SAFETY: the trait contract (CPU features, 4 readable bytes at p).
            unsafe { _mm512_set1_epi32(p.cast::<i32>().read_unaligned()) }
        }
        #[inline(always)]
        unsafe fn load_i(p: *const i8) -> __m512i {
            // SAFETY: the trait contract (CPU features, 64 readable bytes at p).
            unsafe { _mm512_loadu_si512(p.cast()) }
        }
        #[inline(always)]
        unsafe fn store_i(p: *mut i32, v: __m512i) {
            // SAFETY: the trait contract (CPU features, 16 writable i32 at p).
            unsafe { _mm512_storeu_si512(p.cast(), v) }
        }
        #[inline(always)]
        unsafe fn abs_i8(v: __m512i) -> __m512i {
            // SAFETY: the trait contract (CPU features).
            unsafe { _mm512_abs_epi8(v) }
        }
        #[inline(always)]
        unsafe fn to_f(v: __m512i) -> __m512 {
            // SAFETY: the trait contract (CPU features).
            unsafe { _mm512_cvtepi32_ps(v) }
        }
    };
}

/// `b` with the signs of `a` (AVX-512 has no byte-wise `sign`): negated where `a < 0`. Where
/// `a == 0` it stays `b`, unlike `vpsignb`, but is then multiplied by `|a| = 0`.
#[inline(always)]
unsafe fn with_signs_of_512(b: __m512i, a: __m512i) -> __m512i {
    // SAFETY: the trait contract (AVX-512 BW).
    unsafe {
        let negative = _mm512_movepi8_mask(a);
        _mm512_mask_sub_epi8(b, negative, _mm512_setzero_si512(), b)
    }
}

impl Vector for Avx512 {
    avx512_common!();

    #[inline(always)]
    unsafe fn dot4_acc(acc: __m512i, a: __m512i, abs_a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: the trait contract (CPU features); exactness as in the AVX2 version.
        unsafe {
            let pairs = _mm512_maddubs_epi16(abs_a, with_signs_of_512(b, a));
            _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))
        }
    }
}

impl Vector for Avx512Vnni {
    avx512_common!();

    #[inline(always)]
    unsafe fn dot4_acc(acc: __m512i, a: __m512i, abs_a: __m512i, b: __m512i) -> __m512i {
        // u8 x i8 sums of four straight into the i32 lanes, with no 16-bit stage.
        // SAFETY: the trait contract (CPU features, VNNI included).
        unsafe { _mm512_dpbusd_epi32(acc, abs_a, with_signs_of_512(b, a)) }
    }
}
