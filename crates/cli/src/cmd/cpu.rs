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
        let int8 = if level::active() == level::Level::Amx
            || (level::active() >= level::Level::Avx512 && level::has_avx512_vnni())
        {
            "int8 products run in hardware here (`--precision int8`, faster: docs/performance.md)"
        } else {
            "int8 gains little here (no int8 dot-product instruction at this level)"
        };
        println!(
            "default precision of the model: {}; {int8}, but {}",
            ModelOptions::default().precision,
            DEFAULT_PRECISION_WHY
        );
    }
    Ok(())
}
