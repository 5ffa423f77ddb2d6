//! Sample data fetched from package registries: the pycda Mars tile (MIT).

use crate::{cache_dir, pip_download, Error, Result};
use craterdex_errors::{ensure, IoContext};
use std::io::Read;
use std::path::PathBuf;

pub const PYCDA_VERSION: &str = "0.1.16";
const PYCDA_SDIST: &str = "pycda-0.1.16.tar.gz";
const PYCDA_SHA256: &str = "11cc0532db8b7eddcd88db8ee95ef6f7473a9f0136aa75d7c77ba63771fb8c5d";
const MEMBERS: [&str; 2] = ["holdout_tile.pgm", "holdout_tile_labels.csv"];

/// The Mars tile (1700x1700 PGM) and its 409 craters (pixels), fetched once into the cache.
pub fn pycda_mars_tile() -> Result<(PathBuf, PathBuf)> {
    let dir = cache_dir()
        .join("data")
        .join(format!("pycda-{PYCDA_VERSION}"));
    let (tile, labels) = (dir.join(MEMBERS[0]), dir.join(MEMBERS[1]));
    if tile.is_file() && labels.is_file() {
        return Ok((tile, labels));
    }
    let sdist = pip_download(
        "pycda",
        PYCDA_VERSION,
        PYCDA_SDIST,
        PYCDA_SHA256,
        &cache_dir().join("downloads"),
    )?;
    let tmp = craterdex_durable::tempdir_beside(&dir)?;
    let f = std::fs::File::open(&sdist).io("open", &sdist)?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(f));
    let mut found = 0;
    let not_tar = |e: std::io::Error| {
        Error::Corrupt(format!("{} is not a readable tar.gz: {e}", sdist.display()))
    };
    for entry in archive.entries().map_err(not_tar)? {
        let mut entry = entry.map_err(not_tar)?;
        let path = entry.path().map_err(not_tar)?.to_path_buf();
        if let Some(name) = MEMBERS
            .iter()
            .find(|m| path.ends_with(format!("sample_imgs/{m}")))
        {
            let mut buf = Vec::new();
            entry.read_to_end(&mut buf).map_err(not_tar)?;
            let member = tmp.join(name);
            std::fs::write(&member, buf).io("write", &member)?;
            found += 1;
        }
    }
    ensure!(
        found == MEMBERS.len(),
        Error::Corrupt(format!(
            "{} lacks the sample tile or its labels",
            sdist.display()
        ))
    );
    craterdex_durable::replace_dir(&tmp, &dir)?;
    Ok((tile, labels))
}
