//! `craterdex cpu`: the CPU and the kernel levels it supports.

use anyhow::Result;
use clap::Args;
use craterdex_engine::{ModelOptions, DEFAULT_PRECISION_WHY};
use craterdex_kernels::level;

#[derive(Args)]
pub struct CpuCmd {
    /// Print only the levels this CPU supports, lowest first (for scripts).
    #[arg(long)]
    levels: bool,
}

pub fn run(c: CpuCmd) -> Result<()> {
    let supported: Vec<&str> = level::supported().iter().map(|l| l.name()).collect();
    if c.levels {
        println!("{}", supported.join(" "));
    } else {
        println!("{}", level::describe());
        println!("levels this CPU supports: {}", supported.join(" "));
        let int8 = if craterdex_kernels::amx::available() {
            "AMX tiles at this level"
        } else if level::int8_in_hardware() {
            "int8 products run in hardware at this level"
        } else {
            "no int8 dot-product instruction at this level (`--precision int8` gives the same \
             features, slower or barely faster)"
        };
        println!(
            "default precision of the model: {}; {int8}: {}",
            ModelOptions::default().precision,
            DEFAULT_PRECISION_WHY
        );
        println!(
            "default precision of the crater detector: {}: {}",
            craterdex_detect::default_precision(),
            craterdex_detect::DEFAULT_PRECISION_WHY
        );
        let bf16: Vec<&str> = craterdex_kernels::bf16::levels()
            .iter()
            .map(|l| l.name())
            .collect();
        match (bf16.is_empty(), craterdex_kernels::bf16::available()) {
            (true, _) => println!(
                "--precision bf16: no bf16 hardware on this CPU (AVX-512 BF16 or AMX tiles)"
            ),
            (false, true) => println!(
                "--precision bf16 runs here (levels with bf16 hardware: {})",
                bf16.join(" ")
            ),
            (false, false) => println!(
                "--precision bf16: not at the capped level {} (levels with bf16 hardware: {})",
                level::active(),
                bf16.join(" ")
            ),
        }
    }
    Ok(())
}
