//! `craterdex calibrate`: fit the link rule on labelled entries (crater ids known on both
//! sides) and store it with the index.

use crate::args::{EntriesOpts, ModelOpts};
use crate::cmd::link::{encoded_entries, LinkTuning};
use crate::output::{print_json, Bars};
use anyhow::Result;
use clap::Args;
use craterdex_workflows::{calibrate, link};
use std::path::PathBuf;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["entries"])))]
pub struct CalibrateCmd {
    /// The index whose rule is calibrated (and where it is stored).
    #[arg(long)]
    pub index: PathBuf,
    #[command(flatten)]
    pub entries: EntriesOpts,
    /// Precision the `match` decisions must reach on the labelled entries.
    #[arg(long, default_value_t = 0.99)]
    pub target_precision: f64,
    /// Print the calibration without storing it.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub tuning: LinkTuning,
    #[command(flatten)]
    pub model: ModelOpts,
}

pub fn run(c: CalibrateCmd) -> Result<()> {
    let base = c.tuning.rule(&c.index)?;
    let (engine, entries) = encoded_entries(&c.index, &c.entries, &c.model)?;
    let (rows, _) = link(
        &engine,
        entries,
        &base,
        &c.tuning.options(false),
        &Bars::new(),
    )?;
    let cal = calibrate(&rows, &base, c.target_precision)?;
    print_json(&cal)?;
    if !c.dry_run {
        cal.rule.save(&c.index)?;
        eprintln!(
            "stored the rule in {}",
            craterdex_workflows::LinkRule::path_in(&c.index).display()
        );
    }
    Ok(())
}
