//! `craterdex cpu`: the CPU and the kernel levels it supports.

use anyhow::Result;
use clap::Args;
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
    }
    Ok(())
}
