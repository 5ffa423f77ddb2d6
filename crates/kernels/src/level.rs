//! Which instruction-set level the kernels run at: detected once per process, and capped
//! by `CRATERDEX_KERNEL` so that every path can be tested and benchmarked on one machine.

use std::sync::OnceLock;
use strum::IntoEnumIterator;

/// Kernel levels, each a superset of the one before it. Spelled as `CRATERDEX_KERNEL` takes
/// them: `portable`, `avx2`, `avx512`, `amx`.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    strum::Display,
    strum::EnumIter,
    strum::VariantNames,
    strum::IntoStaticStr,
)]
#[strum(serialize_all = "lowercase")]
pub enum Level {
    /// Plain Rust that the compiler vectorises for the build target (any CPU, ARM included).
    Portable,
    /// x86-64 with AVX2 and FMA (AMD Zen, Intel Haswell and later).
    Avx2,
    /// x86-64 with AVX-512 F, BW and VL (Intel Skylake-SP and later, AMD Zen 4); VNNI is
    /// used where present.
    Avx512,
    /// AVX-512 plus Intel AMX int8 and bf16 tiles (Xeon 4th generation on), with the tile
    /// state granted by the kernel.
    Amx,
}

/// The environment variable that caps the level.
pub const ENV: &str = "CRATERDEX_KERNEL";

impl Level {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl std::str::FromStr for Level {
    type Err = craterdex_errors::Invalid;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        craterdex_errors::parse_named("kernel level", s, Level::iter(), &[])
    }
}

/// Runs the arm of a kernel for the vector instructions of `level`, capped at what this CPU
/// has: `avx512` on AVX-512 and AMX CPUs (tile products are chosen before, by the caller),
/// `avx2` on AVX2 + FMA, `portable` on anything else and off x86-64. The one place where a
/// kernel level becomes instructions; the `unsafe` of the x86 arms rests on that cap.
macro_rules! dispatch {
    ($level:expr, avx512 => $avx512:expr, avx2 => $avx2:expr, portable => $portable:expr $(,)?) => {{
        #[cfg(target_arch = "x86_64")]
        let chosen = match $crate::level::Level::min($level, $crate::level::detected()) {
            // SAFETY: the level is capped at what this CPU has, so its instructions exist.
            $crate::level::Level::Avx512 | $crate::level::Level::Amx => unsafe { $avx512 },
            // SAFETY: as above.
            $crate::level::Level::Avx2 => unsafe { $avx2 },
            $crate::level::Level::Portable => $portable,
        };
        #[cfg(not(target_arch = "x86_64"))]
        let chosen = {
            let _ = $level;
            $portable
        };
        chosen
    }};
}
pub(crate) use dispatch;

/// The best level this CPU (and operating system) supports.
pub fn detected() -> Level {
    static DETECTED: OnceLock<Level> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Level {
    use std::arch::is_x86_feature_detected as has;
    if !(has!("avx2") && has!("fma")) {
        return Level::Portable;
    }
    if !(has!("avx512f") && has!("avx512bw") && has!("avx512vl")) {
        return Level::Avx2;
    }
    if crate::amx::cpu_has_amx() && crate::amx::request_tile_state() {
        return Level::Amx;
    }
    Level::Avx512
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Level {
    Level::Portable
}

/// The level kernels run at: [`detected`], capped by `CRATERDEX_KERNEL=portable|avx2|avx512|amx`
/// (and, for older scripts, `CRATERDEX_NO_AMX=1`, which caps at avx512). Asking for more than
/// the CPU has runs at what it has, with one warning (a `tracing` event).
pub fn active() -> Level {
    static ACTIVE: OnceLock<Level> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let detected = detected();
        let mut cap = Level::Amx;
        if std::env::var_os("CRATERDEX_NO_AMX").is_some_and(|v| v != "0") {
            cap = Level::Avx512;
        }
        if let Some(v) = std::env::var_os(ENV) {
            match v.to_string_lossy().parse::<Level>() {
                Ok(l) => {
                    if l > detected {
                        tracing::warn!(
                            "{ENV}={l} but this CPU supports at most {detected}; running at {detected}"
                        );
                    }
                    cap = cap.min(l);
                }
                Err(e) => tracing::warn!("{ENV}: {e}; ignored"),
            }
        }
        detected.min(cap)
    })
}

/// Every level this CPU can run, lowest first (what a test run per level should cover).
pub fn supported() -> Vec<Level> {
    Level::iter().filter(|&l| l <= detected()).collect()
}

/// Whether the int8 dot products of the AVX-512 level have VNNI (`vpdpbusd`).
pub fn has_avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether int8 products run on an int8 dot-product instruction at the active level (VNNI's
/// `vpdpbusd` or AMX tiles), where int8 extraction is 1.7-2.0x f32; on AVX2 it gains about
/// 1.07x and on the portable level it runs at a fifth of f32's speed (docs/performance.md).
pub fn int8_in_hardware() -> bool {
    let level = active();
    level == Level::Amx || (level >= Level::Avx512 && has_avx512_vnni())
}

/// The CPU's model name (`/proc/cpuinfo`, or the CPUID brand string), for benchmark reports.
pub fn cpu_model() -> String {
    if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
        if let Some(name) = info
            .lines()
            .find(|l| l.starts_with("model name") || l.starts_with("Model"))
            .and_then(|l| l.split_once(':'))
        {
            return name.1.trim().to_string();
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        brand_string()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

#[cfg(target_arch = "x86_64")]
fn brand_string() -> String {
    use std::arch::x86_64::__cpuid;
    if __cpuid(0x8000_0000).eax < 0x8000_0004 {
        return "x86_64".into();
    }
    let mut bytes = Vec::with_capacity(48);
    for leaf in 0x8000_0002u32..=0x8000_0004 {
        let r = __cpuid(leaf);
        for word in [r.eax, r.ebx, r.ecx, r.edx] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
    }
    String::from_utf8_lossy(&bytes)
        .trim_matches(char::from(0))
        .trim()
        .to_string()
}

/// Arithmetic a precision's matrix products run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arithmetic {
    F32,
    Int8,
    Bf16,
}

/// The peak operations per second one logical CPU reaches with `arith` at `level` (a
/// multiply-add counts two), and how it was derived: the clock ([`measured_mhz`] on x86-64,
/// else `cpu MHz` of /proc/cpuinfo) times the operations the level's widest units issue per
/// cycle (FMA ports x lanes x 2; bf16 dot products: pairs, twice f32's lanes; int8 without
/// VNNI: byte products, vpmaddubsw; AMD family 25,
/// Zen 3/4, runs 512-bit operations on 256-bit units). `None` where the clock is not known.
pub fn peak_ops_per_cpu(level: Level, arith: Arithmetic) -> Option<(f64, String)> {
    let (mhz, clock) = match measured_mhz() {
        Some(m) => (m, "measured clock"),
        None => (cpu_mhz()?, "/proc/cpuinfo clock"),
    };
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let amd = cpuinfo.contains("AuthenticAMD");
    let half_width_512 = amd
        && cpuinfo
            .lines()
            .any(|l| l.starts_with("cpu family") && l.ends_with(": 25"));
    let (per_cycle, units) = match (level, arith) {
        (Level::Amx, Arithmetic::Bf16) => (1024.0, "AMX tiles, bf16: 16x16x32 per 16 cycles"),
        (Level::Amx, Arithmetic::Int8) => (2048.0, "AMX tiles, int8: 16x16x64 per 16 cycles"),
        (Level::Avx512, Arithmetic::Bf16) if crate::bf16::has_avx512_bf16() => {
            if half_width_512 {
                (64.0, "AVX-512 BF16 on 256-bit units: 2 ports x 16 bf16 x 2")
            } else {
                (128.0, "AVX-512 BF16 (vdpbf16ps): 2 ports x 32 bf16 x 2")
            }
        }
        (Level::Avx512, Arithmetic::Int8) if has_avx512_vnni() => {
            if half_width_512 {
                (
                    128.0,
                    "AVX-512 VNNI on 256-bit units: 2 ports x 32 int8 x 2",
                )
            } else {
                (256.0, "AVX-512 VNNI: 2 ports x 64 int8 x 2")
            }
        }
        // without a dot-product instruction int8 multiplies bytes into pairs of 16-bit sums
        (Level::Avx512, Arithmetic::Int8) if half_width_512 => (
            128.0,
            "AVX-512BW byte products (vpmaddubsw) on 256-bit units: 2 ports x 32 int8 x 2",
        ),
        (Level::Avx512, Arithmetic::Int8) => (
            256.0,
            "AVX-512BW byte products (vpmaddubsw): 2 ports x 64 int8 x 2",
        ),
        (Level::Avx2, Arithmetic::Int8) => (
            128.0,
            "AVX2 byte products (vpmaddubsw): 2 ports x 32 int8 x 2",
        ),
        (Level::Avx512 | Level::Amx, _) if half_width_512 => {
            (32.0, "AVX-512 on 256-bit units: 2 FMA x 8 f32 x 2")
        }
        (Level::Avx512 | Level::Amx, _) => (64.0, "AVX-512: 2 FMA x 16 f32 x 2"),
        (Level::Avx2, _) => (32.0, "AVX2: 2 FMA x 8 f32 x 2"),
        // Zen issues SSE2's separate multiplies and adds on four pipes, two of each
        (Level::Portable, _) if amd => (16.0, "SSE2 on AMD Zen: 2 multiply + 2 add pipes x 4 f32"),
        (Level::Portable, _) => (8.0, "SSE2 / NEON: 2 x 4 f32"),
    };
    Some((
        mhz * 1e6 * per_cycle,
        format!("{mhz:.0} MHz ({clock}) x {per_cycle} per cycle ({units})"),
    ))
}

/// The clock one busy core runs at, in MHz, measured once per process: a chain of dependent
/// 64-bit integer multiplications (three cycles each on every x86-64 core since Nehalem and
/// on AMD Zen) timed, best of twenty runs of about a millisecond each (short enough that one
/// of them runs within a time slice on a machine busy with other work). A VM's /proc/cpuinfo gives the nominal clock, which boost
/// exceeds; this is what the core does while working. (A chain of `add reg, 1` read 24 GHz on
/// Sapphire Rapids, whose renamer folds immediate additions.)
pub fn measured_mhz() -> Option<f64> {
    static MHZ: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    *MHZ.get_or_init(time_multiply_chain)
}

#[cfg(target_arch = "x86_64")]
fn time_multiply_chain() -> Option<f64> {
    const ITERATIONS: u64 = 15_000;
    const CYCLES_PER_ITERATION: f64 = 100.0 * 3.0;
    let mut best = f64::INFINITY;
    for _ in 0..20 {
        let (mut x, mut n) = (3u64, ITERATIONS);
        let t = std::time::Instant::now();
        // SAFETY: register arithmetic only; no memory is read or written.
        unsafe {
            std::arch::asm!(
                "2:",
                ".rept 100",
                "imul {x}, {x}",
                ".endr",
                "dec {n}",
                "jnz 2b",
                x = inout(reg) x,
                n = inout(reg) n,
                options(nomem, nostack),
            );
        }
        best = best.min(t.elapsed().as_secs_f64());
        debug_assert_eq!(n, 0);
        std::hint::black_box(x);
    }
    let mhz = ITERATIONS as f64 * CYCLES_PER_ITERATION / best / 1e6;
    (mhz.is_finite() && mhz > 100.0).then_some(mhz)
}

#[cfg(not(target_arch = "x86_64"))]
fn time_multiply_chain() -> Option<f64> {
    None
}

/// The clock in MHz /proc/cpuinfo reports for the first CPU.
fn cpu_mhz() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("cpu MHz"))
        .and_then(|l| l.split_once(':'))
        .and_then(|(_, v)| v.trim().parse::<f64>().ok())
        .filter(|m| *m > 0.0)
}

/// One line for reports: the CPU, the level kernels run at, and what the CPU could do.
pub fn describe() -> String {
    let vnni = if active() >= Level::Avx512 && has_avx512_vnni() {
        " (VNNI)"
    } else {
        ""
    };
    format!(
        "{}; kernel level {}{vnni} (CPU supports up to {})",
        cpu_model(),
        active(),
        detected()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The measured clock is a clock: within a factor of a few of the nominal one the system
    /// reports (boost above it, a busy machine below it), not the 24 GHz an addition chain
    /// read on a core whose renamer folds immediate additions.
    #[test]
    fn the_measured_clock_is_near_the_reported_one() {
        let (Some(measured), Some(reported)) = (measured_mhz(), cpu_mhz()) else {
            return;
        };
        assert!(
            measured > reported / 4.0 && measured < reported * 2.5,
            "measured {measured:.0} MHz, /proc/cpuinfo {reported:.0} MHz"
        );
    }

    #[test]
    fn levels_parse_order_and_cap() {
        assert_eq!("AVX2".parse::<Level>().unwrap(), Level::Avx2);
        assert!("sse9".parse::<Level>().is_err());
        assert!(Level::Portable < Level::Avx2 && Level::Avx512 < Level::Amx);
        assert!(active() <= detected());
        assert_eq!(supported().first(), Some(&Level::Portable));
        assert_eq!(supported().last(), Some(&detected()));
    }

    /// int8 products on AVX2 issue four times f32's operations per cycle (32 byte pairs per
    /// instruction against 8 floats), so a kernel reading above f32's peak is not above 100%.
    #[test]
    fn int8_peaks_count_byte_products() {
        let (Some((f32_ops, _)), Some((int8_ops, how))) = (
            peak_ops_per_cpu(Level::Avx2, Arithmetic::F32),
            peak_ops_per_cpu(Level::Avx2, Arithmetic::Int8),
        ) else {
            return; // no clock known on this machine
        };
        // both from the clock measured once per process
        let ratio = int8_ops / f32_ops;
        assert!((ratio - 4.0).abs() < 1e-9, "{ratio}: {how}");
        assert!(how.contains("vpmaddubsw"), "{how}");
    }
}
