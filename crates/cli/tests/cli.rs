//! The craterdex binary end to end on a tiny generated model and a generated tile: model
//! import, benchmark building, index build/add/remove/info, search, eval, extract, errors.

use image::{GrayImage, Luma};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const D: usize = 32;
const P: usize = 4;
const G: usize = 4;

struct Env {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Env {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        Self { _tmp: tmp, root }
    }
    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_craterdex"))
            .args(args)
            .env("CRATERDEX_HOME", self.root.join("home"))
            .env("CRATERDEX_PYTHON", "/nonexistent/python") // nothing here may reach a registry
            .current_dir(&self.root)
            .output()
            .unwrap()
    }
    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "craterdex {args:?} failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }
    fn path(&self, p: &str) -> String {
        self.root.join(p).display().to_string()
    }
    /// `bench-build` of the generated tile into `out`; returns what it printed.
    fn bench_build(
        &self,
        (tile, cat): (&Path, &Path),
        out: &str,
        queries: &str,
        min_diameter: &str,
        extra: &[&str],
    ) -> String {
        let mut args = vec![
            "bench-build",
            "--tile",
            tile.to_str().unwrap(),
            "--craters",
            cat.to_str().unwrap(),
            "--out",
            out,
            "--query-craters",
            queries,
            "--min-diameter",
            min_diameter,
        ];
        args.extend(extra);
        self.ok(&args)
    }
    /// The test tile's benchmark in `bench/` (`queries` query craters, craters >= 10 px):
    /// its manifest path.
    fn tile_benchmark(&self, queries: &str) -> String {
        let (tile, cat) = write_tile(&self.root);
        self.bench_build((&tile, &cat), "bench", queries, "10", &[]);
        self.path("bench/splits/test.json")
    }

    /// `index build` of the benchmark at `manifest` into `out` with the tiny model at
    /// `model` (16 px), plus `extra` options; returns what it printed.
    fn index_build(&self, model: &str, manifest: &str, out: &str, extra: &[&str]) -> String {
        let mut args = vec![
            "index",
            "build",
            "--manifest",
            manifest,
            "--out",
            out,
            "--model",
            model,
            "--size",
            "16",
        ];
        args.extend(extra);
        self.ok(&args)
    }
    /// The best image (id and score) for `query` in `index`, searched exhaustively and
    /// ungrouped with the tiny model at `model` (16 px), plus `extra` options.
    fn top_hit(&self, index: &str, model: &str, query: &str, extra: &[&str]) -> (String, f64) {
        let mut args = vec![
            "search",
            "--index",
            index,
            query,
            "--json",
            "--top",
            "1",
            "--mode",
            "exhaustive",
            "--ungrouped",
            "--model",
            model,
            "--size",
            "16",
            "--no-recheck",
        ];
        args.extend(extra);
        let v: serde_json::Value = serde_json::from_str(&self.ok(&args)).unwrap();
        let hit = &v[0]["results"][0];
        (
            hit["id"].as_str().unwrap().to_string(),
            hit["score"].as_f64().unwrap(),
        )
    }
    /// The gallery crops `tile_benchmark` wrote, sorted.
    fn gallery_images(&self) -> Vec<PathBuf> {
        let mut gallery: Vec<PathBuf> = std::fs::read_dir(self.root.join("bench/images/gallery"))
            .unwrap()
            .map(|d| d.unwrap().path())
            .collect();
        gallery.sort();
        gallery
    }
    /// A tiny generated checkpoint imported as model `tiny`; returns its directory.
    fn tiny_model(&self) -> String {
        let ckpt = write_tiny_model(&self.root.join("ckpt"));
        self.ok(&[
            "model",
            "fetch",
            "--from",
            ckpt.to_str().unwrap(),
            "--name",
            "tiny",
        ]);
        self.path("home/models/tiny")
    }
}

fn write_tiny_model(dir: &Path) -> PathBuf {
    craterdex_model::testing::write_tiny_checkpoint(dir, D, P, G)
}

/// `eval --protocol paper` runs every block on crops as stored in f32 and says so in its
/// JSON, per-query CSV and report, whose findings are then the paper's as published; a run
/// under the shipped defaults records that protocol and says its findings are not the
/// paper's. A protocol and the settings it fixes cannot be given together.
#[test]
fn eval_records_its_protocol_and_checks_the_papers_findings_only_under_the_papers() {
    let e = Env::new();
    let model = e.tiny_model();
    let manifest = e.tile_benchmark("4");
    let eval = |name: &str, protocol: &[&str]| {
        let mut args = vec![
            "eval",
            "--manifest",
            &manifest,
            "--quick",
            "--model",
            &model,
        ];
        let (json, csv, html) = (
            format!("{name}.json"),
            format!("{name}.csv"),
            format!("{name}.html"),
        );
        args.extend(["--json", &json, "--per-query", &csv, "--report", &html]);
        args.extend(protocol);
        e.ok(&args);
        let read = |f: &str| std::fs::read_to_string(e.root.join(f)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&read(&json)).unwrap();
        (v, read(&csv), read(&html))
    };
    let (v, csv, html) = eval("paper", &["--protocol", "paper"]);
    let p = &v["protocol"];
    assert_eq!(p["name"], "paper", "{p}");
    assert_eq!(p["blocks"], p["depth"], "{p}");
    assert_eq!(
        (&p["brightness"], &p["precision"]),
        (&"as-is".into(), &"f32".into())
    );
    assert!(
        csv.starts_with("# paper protocol: ") && csv.contains("blocks, brightness as-is, f32"),
        "{csv}"
    );
    assert!(
        html.contains("Findings of the paper, checked under the paper's protocol"),
        "{html}"
    );
    assert!(!html.contains("Not the paper"), "{html}");
    // the shipped defaults: standardised brightness, this CPU's default precision
    let (v, csv, html) = eval("shipped", &[]);
    let p = &v["protocol"];
    assert_eq!(p["name"], "shipped", "{p}");
    assert_eq!(p["brightness"], "standardised");
    assert_eq!(
        p["precision"],
        craterdex_engine::default_precision().to_string()
    );
    assert!(csv.starts_with("# shipped protocol: "), "{csv}");
    assert!(html.contains("<b>Not the paper's protocol</b>"), "{html}");
    assert!(html.contains("craterdex eval --protocol paper"), "{html}");
    // a protocol fixes the blocks, brightness and precision: naming both is refused
    let o = e.run(&[
        "eval",
        "--manifest",
        &manifest,
        "--model",
        &model,
        "--protocol",
        "paper",
        "--blocks",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cannot be used with"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Twelve copies of one crop give nothing to learn a whitening from: the build says so and
/// whitens nothing, where it used to write an encoder of NaN and fail to open it, and the
/// index answers with every copy as good as the others.
#[test]
fn an_index_of_identical_crops_is_built_without_whitening_and_says_so() {
    let e = Env::new();
    let model = e.tiny_model();
    let dir = e.root.join("same");
    std::fs::create_dir_all(&dir).unwrap();
    let crop = lit_crater(32, &[(0.4, 0.2)]);
    for i in 0..12 {
        crop.save(dir.join(format!("c{i}.png"))).unwrap();
    }
    let o = e.run(&[
        "index", "build", "--dir", "same", "--out", "idx", "--model", &model, "--size", "16",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("cannot be learned from 12 samples that do not vary")
            && stderr.contains("the index whitens nothing"),
        "{stderr}"
    );
    let encoder = std::fs::read_to_string(e.root.join("idx/encoder.json")).unwrap();
    let encoder: serde_json::Value = serde_json::from_str(&encoder).unwrap();
    assert_eq!(encoder["recipe"]["whiten"], false, "{encoder}");
    let query = dir.join("c0.png");
    let v: serde_json::Value = serde_json::from_str(&e.ok(&[
        "search",
        "--index",
        "idx",
        query.to_str().unwrap(),
        "--json",
        "--no-recheck",
        "--model",
        &model,
        "--size",
        "16",
    ]))
    .unwrap();
    let scores: Vec<f64> = v[0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["score"].as_f64().unwrap())
        .collect();
    assert_eq!(scores.len(), 10, "{v}");
    assert!(
        scores
            .iter()
            .all(|s| s.is_finite() && (s - scores[0]).abs() < 1e-4),
        "{scores:?}"
    );
}

/// Output into a pipe whose reader has gone (`craterdex cpu | head -0`) ends the command
/// quietly, as other Unix tools end, where `println!` used to panic with a backtrace.
#[cfg(unix)]
#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    for _ in 0..5 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_craterdex"))
            .arg("cpu")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            out.status.success() || out.status.signal() == Some(13),
            "{:?}",
            out.status
        );
    }
}

/// What a shell user expects of a command line: completions and man pages from the same
/// definitions as --help, every environment variable listed in --help, `--home` for
/// $CRATERDEX_HOME, and `model list --json`.
#[test]
fn completions_man_pages_environment_and_json_listing() {
    let e = Env::new();
    let bash = e.ok(&["completions", "bash"]);
    assert!(
        bash.contains("_craterdex") && bash.contains("--insert-new"),
        "{bash}"
    );
    assert!(e
        .ok(&["completions", "fish"])
        .contains("complete -c craterdex"));
    let said = e.ok(&["man", "--out", "man"]);
    assert!(said.contains("wrote man pages"), "{said}");
    let page = std::fs::read_to_string(e.root.join("man/craterdex-serve.1")).unwrap();
    assert!(
        page.contains(".TH") && page.contains("allowed\\-host"),
        "{page}"
    );
    assert!(e.root.join("man/craterdex.1").exists());
    // help text is wrapped: compare with its whitespace collapsed
    let help_of = |args: &[&str]| e.ok(args).split_whitespace().collect::<Vec<_>>().join(" ");
    let help = help_of(&["--help"]);
    for var in ["CRATERDEX_HOME", "CRATERDEX_KERNEL", "CRATERDEX_PYTHON"] {
        assert!(help.contains(&format!("[env: {var}")), "{var}: {help}");
    }
    let serve = help_of(&["serve", "--help"]);
    assert!(serve.contains("[env: CRATERDEX_API_KEY]"), "{serve}");
    let fetch = help_of(&["model", "fetch", "--help"]);
    assert!(
        fetch.contains("[env: HF_TOKEN]") && fetch.contains("[env: HF_ENDPOINT"),
        "{fetch}"
    );
    // --home is $CRATERDEX_HOME: the tiny model imported there is listed from there only
    let ckpt = write_tiny_model(&e.root.join("ckpt"));
    let elsewhere = e.root.join("elsewhere");
    let home = elsewhere.to_str().unwrap();
    e.ok(&[
        "--home",
        home,
        "model",
        "fetch",
        "--from",
        ckpt.to_str().unwrap(),
        "--name",
        "tiny",
    ]);
    let listed: serde_json::Value =
        serde_json::from_str(&e.ok(&["--home", home, "model", "list", "--json"])).unwrap();
    assert_eq!(listed[0]["name"], "tiny", "{listed}");
    assert_eq!(listed[0]["depth"], 1);
    assert!(listed[0]["dir"].as_str().unwrap().starts_with(home));
    let default_home: serde_json::Value =
        serde_json::from_str(&e.ok(&["model", "list", "--json"])).unwrap();
    assert_eq!(default_home, serde_json::json!([]));
}

/// A textured tile with dark "craters" and their pixel catalogue (pycda format).
fn write_tile(dir: &Path) -> (PathBuf, PathBuf) {
    let craters: Vec<(f64, f64, f64)> = (0..12)
        .map(|i| {
            (
                40.0 + (i % 4) as f64 * 55.0,
                40.0 + (i / 4) as f64 * 60.0,
                12.0 + (i % 5) as f64 * 2.0,
            )
        })
        .collect();
    let img = GrayImage::from_fn(260, 200, |x, y| {
        let mut v = 140.0 + 30.0 * ((x as f64 * 0.31).sin() * (y as f64 * 0.17).cos());
        for (i, &(cx, cy, d)) in craters.iter().enumerate() {
            let r = ((x as f64 - cx).powi(2) + (y as f64 - cy).powi(2)).sqrt();
            if r < d / 2.0 {
                v -= 60.0 + 8.0 * (i as f64) * (r / d);
            }
        }
        Luma([v.clamp(0.0, 255.0) as u8])
    });
    let tile = dir.join("tile.png");
    img.save(&tile).unwrap();
    let cat = dir.join("tile.csv");
    let mut csv = String::from("long,lat,diameter\n");
    for (x, y, d) in craters {
        csv.push_str(&format!("{x},{y},{d}\n"));
    }
    std::fs::write(&cat, csv).unwrap();
    (tile, cat)
}

#[test]
fn full_workflow_on_a_tiny_model() {
    let e = Env::new();
    let ckpt = write_tiny_model(&e.root.join("ckpt"));
    let out = e.ok(&[
        "model",
        "fetch",
        "--from",
        ckpt.to_str().unwrap(),
        "--name",
        "tiny",
    ]);
    assert!(out.contains("tiny"), "{out}");
    assert!(e.ok(&["model", "list"]).contains("tiny"));
    let model = e.path("home/models/tiny");
    let shown = e.ok(&["model", "info", "--model", &model, "--verify"]);
    let (config, verified) = shown.split_once("weights verified").unwrap();
    assert!(verified.contains("sha256"));
    let info: serde_json::Value = serde_json::from_str(config).unwrap();
    assert_eq!(info["hidden_size"], D);

    let (tile, cat) = write_tile(&e.root);
    let built = e.bench_build((&tile, &cat), "bench", "4", "10", &[]);
    assert!(built.contains("query images"), "{built}");
    let manifest = e.path("bench/splits/test.json");
    let common = ["--model", model.as_str(), "--size", "16"];

    e.index_build(&model, &manifest, "idx", &["--codec", "f16", "--k", "4"]);
    let info: serde_json::Value =
        serde_json::from_str(&e.ok(&["index", "info", "--index", "idx"])).unwrap();
    let n = info["images"].as_u64().unwrap();
    assert!(n >= 20, "{info}");
    assert_eq!(info["codec"], "f16");

    // search with a query view: the answer carries scores of both stages and metadata
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    let q = &m["query_images"][0];
    let qpath = e.path(&format!("bench/{}", q["path"].as_str().unwrap()));
    let mut args = vec!["search", "--index", "idx", "--json", "--top", "3", &qpath];
    args.extend(common);
    let res: serde_json::Value = serde_json::from_str(&e.ok(&args)).unwrap();
    let hits = res[0]["results"].as_array().unwrap();
    assert_eq!(hits.len(), 3);
    assert!(
        hits[0]["stage1"].is_number()
            && hits[0]["stage2"].is_number()
            && hits[0]["crater_id"].is_string()
    );
    assert!(hits[0]["meta"]["path"].as_str().unwrap().ends_with(".png"));

    // remove the top hit, add a directory of new images
    let top = hits[0]["id"].as_str().unwrap().to_string();
    assert!(e
        .ok(&["index", "remove", "--index", "idx", &top])
        .contains("removed 1"));
    std::fs::create_dir_all(e.root.join("new")).unwrap();
    std::fs::copy(&qpath, e.root.join("new/extra.png")).unwrap();
    let mut args = vec!["index", "add", "--index", "idx", "--dir", "new"];
    args.extend(common);
    e.ok(&args);
    let info: serde_json::Value =
        serde_json::from_str(&e.ok(&["index", "info", "--index", "idx"])).unwrap();
    assert_eq!(info["images"].as_u64().unwrap(), n);
    assert_eq!(info["segments"], 2);
    // merging into one segment purges the removed image and keeps every live one
    assert!(e
        .ok(&["index", "merge", "--index", "idx", "--into-one"])
        .contains("merged: 2 -> 1 segments ("));
    let info: serde_json::Value =
        serde_json::from_str(&e.ok(&["index", "info", "--index", "idx"])).unwrap();
    assert_eq!(
        (info["images"].as_u64().unwrap(), info["segments"].as_u64()),
        (n, Some(1))
    );
    assert_eq!(
        e.ok(&["index", "merge", "--index", "idx", "--into-one"]),
        ""
    );

    // eval writes the regimes as JSON
    let mut args = vec![
        "eval",
        "--manifest",
        &manifest,
        "--quick",
        "--json",
        "r.json",
        "--report",
        "r.html",
    ];
    args.extend(common);
    e.ok(&args);
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(e.root.join("r.json")).unwrap()).unwrap();
    for name in [
        "cls",
        "inst_fps_k32",
        "two_stage_s100_k32_white",
        "inst_fps_k32_int8",
    ] {
        let map = r["regimes"][name]["mAP"].as_f64().unwrap_or(-1.0);
        assert!((0.0..=1.0).contains(&map), "{name}: {map}");
    }
    assert!(std::fs::read_to_string(e.root.join("r.html"))
        .unwrap()
        .contains("<svg"));

    // the same benchmark with a turned query split, and eval on both query sets
    e.bench_build((&tile, &cat), "turned", "4", "10", &["--rotated-split"]);
    assert_eq!(
        std::fs::read(e.root.join("turned/splits/test.json")).unwrap(),
        std::fs::read(e.root.join("bench/splits/test.json")).unwrap()
    );
    let upright = e.path("turned/splits/test.json");
    let turned = e.path("turned/splits/test_rotated.json");
    let mut args = vec![
        "eval",
        "--manifest",
        &upright,
        "--rotated",
        &turned,
        "--quick",
        "--json",
        "t.json",
        "--report",
        "t.html",
        "--per-query",
        "t.csv",
    ];
    args.extend(common);
    let printed = e.ok(&args);
    assert!(
        printed.contains("as built and turned (paired)"),
        "{printed}"
    );
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(e.root.join("t.json")).unwrap()).unwrap();
    let map = t["rotated"]["regimes"]["inst_fps_k32_white"]["mAP"]
        .as_f64()
        .unwrap();
    assert!((0.0..=1.0).contains(&map), "{map}");
    // a turned view exists only where its upright view does, so every one is paired and the
    // paired turned mAP is the turned run's own
    let turned_views = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(e.root.join("turned/splits/test_rotated.json")).unwrap(),
    )
    .unwrap()["query_images"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(t["turned_paired"]["paired_views"], turned_views);
    let paired = t["turned_paired"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["regime"] == "inst_fps_k32_white")
        .unwrap();
    assert!((paired["map_turned"].as_f64().unwrap() - map).abs() < 1e-9);
    // the per-query rows of both query sets, each under its split's name
    let csv = std::fs::read_to_string(e.root.join("t.csv")).unwrap();
    let rows_of = |split: &str| {
        csv.lines()
            .filter(|l| l.starts_with(&format!("{split},inst_fps_k32_white,")))
            .count()
    };
    // headed by the protocol the run followed: none by name at 16 px with --size
    let (protocol, table) = csv.split_once('\n').unwrap();
    assert!(protocol.starts_with("# custom protocol: "), "{protocol}");
    assert!(table.starts_with("split,regime,query_id,"), "{csv}");
    assert!(rows_of("test") > 0);
    assert_eq!(rows_of("test_rotated"), turned_views);
    let html = std::fs::read_to_string(e.root.join("t.html")).unwrap();
    assert!(html.contains("<h2>Turned queries</h2>"));
    assert!(html.contains("inst_fps_k32_pairwhite_grouped"));
    e.bench_build((&tile, &cat), "other", "4", "14", &[]);
    let other = e.path("other/splits/test.json");
    let mut args = vec![
        "eval",
        "--manifest",
        &upright,
        "--rotated",
        &other,
        "--quick",
    ];
    args.extend(common);
    let o = e.run(&args);
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is not the gallery of"));
}

#[test]
fn extract_skips_bad_images_and_writes_numpy_readable_features() {
    let e = Env::new();
    let model = e.tiny_model();
    let (tile, _) = write_tile(&e.root);
    std::fs::create_dir_all(e.root.join("imgs")).unwrap();
    std::fs::copy(&tile, e.root.join("imgs/a.png")).unwrap();
    std::fs::write(e.root.join("imgs/broken.png"), b"not a png").unwrap();
    // a JPEG cut short: the image crate would decode its top and fill the rest
    let mut jpeg = std::io::Cursor::new(Vec::new());
    image::open(&tile)
        .unwrap()
        .write_to(&mut jpeg, image::ImageFormat::Jpeg)
        .unwrap();
    let jpeg = jpeg.into_inner();
    std::fs::write(e.root.join("imgs/cut.jpg"), &jpeg[..jpeg.len() / 2]).unwrap();
    let o = e.run(&[
        "extract",
        "--dir",
        "imgs",
        "--out",
        "f.safetensors",
        "--model",
        &model,
        "--size",
        "16",
        "--f16",
    ]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("broken.png") && err.contains("skipped"),
        "{err}"
    );
    assert!(
        err.contains("cut.jpg") && err.contains("truncated or corrupt JPEG"),
        "{err}"
    );
    let ids: Vec<String> = serde_json::from_str(
        &std::fs::read_to_string(e.root.join("f.safetensors.ids.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(ids, vec!["a"]);
    let bytes = std::fs::read(e.root.join("f.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("patch_tokens").unwrap().shape(), &[1, G * G, D]);
    assert_eq!(
        st.tensor("patch_tokens").unwrap().dtype(),
        safetensors::Dtype::F16
    );
    assert_eq!(st.tensor("cls").unwrap().shape(), &[1, D]);
    assert_eq!(st.tensor("attention").unwrap().shape(), &[1, G * G]);
    // a second run comes from the cache
    let o = e.run(&[
        "extract",
        "--dir",
        "imgs",
        "--out",
        "g.safetensors",
        "--model",
        &model,
        "--size",
        "16",
        "--f16",
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("1 of 3 images from the feature cache"));
    // same tensors, bit for bit (the header's metadata order is not fixed by safetensors)
    let again = std::fs::read(e.root.join("g.safetensors")).unwrap();
    let st2 = safetensors::SafeTensors::deserialize(&again).unwrap();
    for name in ["cls", "patch_tokens", "attention"] {
        assert_eq!(
            st.tensor(name).unwrap().data(),
            st2.tensor(name).unwrap().data(),
            "{name}"
        );
    }
    // opting in uses what can be decoded of the cut JPEG
    let o = e.run(&[
        "extract",
        "--dir",
        "imgs",
        "--out",
        "h.safetensors",
        "--model",
        &model,
        "--size",
        "16",
        "--allow-partial-images",
    ]);
    assert!(o.status.success());
    let ids: Vec<String> = serde_json::from_str(
        &std::fs::read_to_string(e.root.join("h.safetensors.ids.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(ids, vec!["a", "cut"]);
}

#[test]
fn bad_input_gives_clear_errors_and_exit_codes() {
    let e = Env::new();
    let o = e.run(&["index", "info", "--index", "nowhere"]);
    assert_eq!(o.status.code(), Some(4), "a missing index is not found");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("nowhere/index.json"), "{err}");
    let o = e.run(&["search", "--index", "idx", "--mode", "sideways", "x.png"]);
    assert_eq!(o.status.code(), Some(2), "an unknown value is bad usage");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("sideways") && err.contains("two-stage"),
        "the values are listed: {err}"
    );
    let o = e.run(&["index", "build", "--codec", "zip", "--out", "x"]);
    assert_eq!(o.status.code(), Some(2), "usage errors exit 2");
    std::fs::write(e.root.join("m.json"), r#"{"images": []}"#).unwrap();
    let o = e.run(&["eval", "--manifest", "m.json"]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "a malformed manifest is invalid input"
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("found keys [\"images\"]"));
    let o = e.run(&["model", "fetch", "--from", "missing.safetensors"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.safetensors"));
}

#[cfg(not(feature = "gdal"))]
#[test]
fn mosaics_without_gdal_say_how_to_get_it() {
    let e = Env::new();
    std::fs::write(e.root.join("c.csv"), "lat,lon,diameter_km\n1,2,3\n").unwrap();
    let o = e.run(&[
        "bench-build",
        "--mosaic",
        "m.tif",
        "--catalogue",
        "c.csv",
        "--out",
        "b",
    ]);
    assert_eq!(
        o.status.code(),
        Some(7),
        "mosaics are unsupported without gdal"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("m.tif") && err.contains("--features gdal"),
        "{err}"
    );
}

/// `eval` measures what ships: its default-recipe regime ranks every query exactly as
/// `index build` (the default recipe) and `search --json` rank it on the same benchmark.
/// `search` answers its queries batch by batch as they come (memory bounded by a batch, not
/// by the number of queries): more queries than a batch answer as they do searched apart, in
/// the order asked, as one JSON array or one table per query.
#[test]
fn search_streams_its_queries_in_batches_with_the_answers_of_separate_searches() {
    let e = Env::new();
    let model = e.tiny_model();
    let manifest = e.tile_benchmark("4");
    e.index_build(&model, &manifest, "idx", &[]);
    let queries: Vec<String> = e
        .gallery_images()
        .iter()
        .take(craterdex_engine::QUERY_BATCH + 5)
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        queries.len() > craterdex_engine::QUERY_BATCH,
        "{}",
        queries.len()
    );
    // the default search: rechecked, each batch its own stages
    let search = |some: &[String], json: bool| {
        let mut args = vec!["search", "--index", "idx", "--top", "3"];
        args.extend(some.iter().map(String::as_str));
        args.extend(["--model", model.as_str(), "--size", "16"]);
        if json {
            args.push("--json");
        }
        e.ok(&args)
    };
    let parsed = |s: String| -> Vec<serde_json::Value> { serde_json::from_str(&s).unwrap() };
    let streamed = parsed(search(&queries, true));
    let (first, rest) = queries.split_at(7);
    let apart = [parsed(search(first, true)), parsed(search(rest, true))].concat();
    assert_eq!(streamed.len(), queries.len());
    assert_eq!(streamed, apart);
    for (answer, query) in streamed.iter().zip(&queries) {
        assert_eq!(answer["query"].as_str(), Some(query.as_str()));
        assert_eq!(answer["results"].as_array().unwrap().len(), 3);
    }
    let table = search(&queries, false);
    assert_eq!(
        table.matches("\nquery ").count() + 1,
        queries.len(),
        "{table}"
    );
    assert!(
        table.starts_with(&format!("query {}\n", queries[0])),
        "{table}"
    );
    // the feature cache's service (the queries are the index's own images) is one note a
    // step for the whole search, not one a batch
    let mut args = vec!["search", "--index", "idx", "--top", "3"];
    args.extend(queries.iter().map(String::as_str));
    args.extend(["--model", model.as_str(), "--size", "16"]);
    let stderr = String::from_utf8(e.run(&args).stderr).unwrap();
    let notes: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("images from the feature cache"))
        .collect();
    let steps: std::collections::HashSet<&str> =
        notes.iter().map(|l| l.split(':').next().unwrap()).collect();
    assert_eq!(steps.len(), notes.len(), "{stderr}");
    let all = format!(
        "{n} of {n} images from the feature cache",
        n = queries.len()
    );
    assert!(notes.iter().any(|l| l.contains(&all)), "{stderr}");
}

#[test]
fn eval_default_regime_ranks_like_index_build_and_search() {
    let e = Env::new();
    let model = e.tiny_model();
    let manifest = e.tile_benchmark("5");
    let common = ["--model", model.as_str(), "--size", "16"];
    // an eval of the benchmark writing its per-query CSV to `csv`; what it printed
    let eval_to = |csv: &str, views: &[&str]| {
        let mut args = vec![
            "eval",
            "--manifest",
            &manifest,
            "--quick",
            "--per-query",
            csv,
        ];
        args.extend(views);
        args.extend(common);
        e.ok(&args)
    };
    eval_to("pq.csv", &["--query-turns", "4", "--verify", "3"]);
    // an eval takes one set of query views: the opposite sun in a second run
    eval_to("pq_sun.csv", &["--opposite-sun", "--verify", "3"]);
    // and the default search of a query image, rechecked, in a third
    let table = eval_to("pq_recheck.csv", &["--recheck"]);
    assert!(
        table.contains("of the queries searched again, ")
            && table.contains("in turns and under the opposite sun"),
        "{table}"
    );
    e.index_build(&model, &manifest, "idx", &[]);
    let csv = std::fs::read_to_string(e.root.join("pq.csv")).unwrap()
        + &std::fs::read_to_string(e.root.join("pq_sun.csv")).unwrap()
        + &std::fs::read_to_string(e.root.join("pq_recheck.csv")).unwrap();
    // search lists views crater by crater unless told --ungrouped, searches turned and
    // mirrored with --turns and relit with --opposite-sun: each form must rank as the eval
    // regime of the same name
    for (regime, flags) in [
        ("two_stage_s100_k32_int8_pairwhite_grouped_recheck", &[][..]),
        (
            "two_stage_s100_k32_int8_pairwhite_grouped",
            &["--no-recheck"][..],
        ),
        (
            "two_stage_s100_k32_int8_pairwhite",
            &["--ungrouped", "--no-recheck"][..],
        ),
        (
            "two_stage_s100_k32_int8_pairwhite_grouped_turns4",
            &["--turns", "4"][..],
        ),
        (
            "two_stage_s100_k32_int8_pairwhite_grouped_oppsun",
            &["--opposite-sun"][..],
        ),
        (
            "two_stage_s100_k32_int8_pairwhite_grouped_oppsun_verify3",
            &["--opposite-sun", "--verify", "3"][..],
        ),
        (
            "two_stage_s100_k32_int8_pairwhite_grouped_verify3",
            &["--verify", "3"][..],
        ),
        (
            "two_stage_s100_k32_int8_pairwhite_verify3",
            &["--verify", "3", "--ungrouped"][..],
        ),
    ] {
        let mut args = vec![
            "search",
            "--index",
            "idx",
            "--manifest",
            &manifest,
            "--json",
            "--top",
            "10",
        ];
        args.extend(flags);
        args.extend(common);
        let searched: serde_json::Value = serde_json::from_str(&e.ok(&args)).unwrap();
        let from_eval: std::collections::BTreeMap<String, Vec<String>> = csv
            .lines()
            .skip(1)
            .filter(|l| l.starts_with(&format!("test,{regime},")))
            .map(|l| {
                let cols: Vec<&str> = l.split(',').collect();
                (
                    cols[2].to_string(),
                    cols[6].split(' ').map(String::from).collect(),
                )
            })
            .collect();
        let queries = searched.as_array().unwrap();
        assert!(queries.len() >= 8, "{} queries", queries.len());
        assert_eq!(from_eval.len(), queries.len(), "{regime}");
        for q in queries {
            let id = q["query"].as_str().unwrap();
            let ranked: Vec<String> = q["results"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h["id"].as_str().unwrap().to_string())
                .collect();
            assert_eq!(ranked, from_eval[id], "{regime}: query {id}");
        }
    }
}

#[test]
fn an_index_of_shading_oriented_crops_needs_and_serves_oriented_queries() {
    index_of_oriented_crops_needs_and_serves_oriented_queries("shading", &["as-is"]);
}

#[test]
fn an_index_of_shading_spread_crops_needs_and_serves_oriented_queries() {
    index_of_oriented_crops_needs_and_serves_oriented_queries(
        "shading-spread",
        &["as-is", "shading"],
    );
}

/// An index built at an input size of its own, with token reduction, patch tokens from an
/// earlier block and an extra input size records all four in its model's name; a query from
/// the full pass at one size, or from the same pass at another size, is refused with the
/// options named, one made alike is served.
#[test]
fn an_index_of_reduced_passes_needs_queries_reduced_alike() {
    let e = Env::new();
    let ckpt =
        craterdex_model::testing::write_tiny_checkpoint_of_depth(&e.root.join("ckpt4"), D, P, G, 4);
    e.ok(&[
        "model",
        "fetch",
        "--from",
        ckpt.to_str().unwrap(),
        "--name",
        "tiny4",
    ]);
    let model = e.path("home/models/tiny4");
    let manifest = e.tile_benchmark("4");
    let options = [
        "--keep-tokens",
        "0.5",
        "--blocks",
        "2",
        "--extra-sizes",
        "24",
    ];
    e.index_build(
        &model,
        &manifest,
        "idx",
        &[&["--k", "4"], &options[..]].concat(),
    );
    let info: serde_json::Value =
        serde_json::from_str(&e.ok(&["index", "info", "--index", "idx"])).unwrap();
    assert!(
        info["model"]
            .as_str()
            .unwrap()
            .ends_with("^16~keep0.5@b2&24+standardised"),
        "{info}"
    );
    let query = e.path("bench/images/gallery");
    let query = std::fs::read_dir(&query)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let query = query.to_str().unwrap();
    let search = [
        "search", "--index", "idx", query, "--json", "--model", &model, "--size", "16",
    ];
    let o = e.run(&search);
    assert_eq!(o.status.code(), Some(3));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--keep-tokens 0.5 --blocks 2 --extra-sizes 24"),
        "{err}"
    );
    let mut reduced = search.to_vec();
    reduced.extend(options);
    let v: serde_json::Value = serde_json::from_str(&e.ok(&reduced)).unwrap();
    assert!(!v[0]["results"].as_array().unwrap().is_empty(), "{v}");
    // the input size is part of the pass too: the same options at another size are refused
    let other_size: Vec<&str> = reduced
        .iter()
        .map(|&a| if a == "16" { "32" } else { a })
        .collect();
    let o = e.run(&other_size);
    assert_eq!(o.status.code(), Some(3));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("built with --size 16 --keep-tokens 0.5")
            && err.contains("runs with --size 32"),
        "{err}"
    );
    let o = e.run(&[&search[..], &["--keep-tokens", "0"]].concat());
    assert_eq!(o.status.code(), Some(3), "a fraction of 0 is refused");
}

/// An index built from crops turned by their shading records it: its queries are turned the
/// same way, a query with any other orientation (`wrong`) is refused with the index's option
/// named, and a query turned by a quarter finds what the upright one finds.
fn index_of_oriented_crops_needs_and_serves_oriented_queries(orient: &str, wrong: &[&str]) {
    let e = Env::new();
    let model = e.tiny_model();
    let manifest = e.tile_benchmark("4");
    let common = ["--model", model.as_str(), "--size", "16"];
    e.index_build(&model, &manifest, "idx", &["--k", "4", "--orient", orient]);
    let info: serde_json::Value =
        serde_json::from_str(&e.ok(&["index", "info", "--index", "idx"])).unwrap();
    assert!(
        info["model"]
            .as_str()
            .unwrap()
            .ends_with(&format!("+{orient}")),
        "{info}"
    );

    let gallery: Vec<String> = std::fs::read_dir(e.root.join("bench/images/gallery"))
        .unwrap()
        .map(|d| d.unwrap().path().display().to_string())
        .collect();
    let query = &gallery[0];
    for wrong in wrong {
        let mut args = vec!["search", "--index", "idx", query.as_str(), "--json"];
        args.extend(["--orient", wrong]);
        args.extend(common);
        let o = e.run(&args);
        assert_eq!(o.status.code(), Some(3), "--orient {wrong}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(&format!("oriented {orient};")), "{err}");
        assert!(
            err.contains(&format!("hint: search it with --orient {orient},")),
            "{err}"
        );
    }

    let img = image::open(query).unwrap();
    img.rotate90().save(e.root.join("turned.png")).unwrap();
    let turned = e.path("turned.png");
    let top = |q: &str| -> String {
        let mut args = vec![
            "search",
            "--index",
            "idx",
            q,
            "--json",
            "--top",
            "1",
            "--orient",
            orient,
            "--mode",
            "exhaustive",
        ];
        args.extend(common);
        let v: serde_json::Value = serde_json::from_str(&e.ok(&args)).unwrap();
        v[0]["results"][0]["id"].as_str().unwrap().to_string()
    };
    assert_eq!(top(query), top(&turned));
}

/// Crops' brightness is standardised by default: an index records it (`+standardised` in its
/// model's name) and refuses queries prepared otherwise, naming the option; a crop under
/// another exposure is found as itself with its own score.
#[test]
fn an_index_records_standardised_brightness_and_its_queries_need_the_same() {
    let e = Env::new();
    let model = e.tiny_model();
    let manifest = e.tile_benchmark("4");
    let common = ["--model", model.as_str(), "--size", "16"];
    e.index_build(&model, &manifest, "idx", &["--k", "4", "--codec", "f32"]);
    let info: serde_json::Value =
        serde_json::from_str(&e.ok(&["index", "info", "--index", "idx"])).unwrap();
    assert!(
        info["model"].as_str().unwrap().ends_with("+standardised"),
        "{info}"
    );
    let gallery = e.gallery_images();
    let query = gallery[0].display().to_string();
    let mut args = vec!["search", "--index", "idx", query.as_str(), "--json"];
    args.extend(["--brightness", "as-is"]);
    args.extend(common);
    let o = e.run(&args);
    assert_eq!(o.status.code(), Some(3));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("brightness standardised;"), "{err}");
    assert!(
        err.contains("hint: search it with --brightness standardised,"),
        "{err}"
    );
    let first = |q: &str| e.top_hit("idx", &model, q, &[]);
    let (id, own) = first(&query);
    // half the contrast, brighter: the same crop after standardising (up to 8-bit rounding)
    let exposed = e.root.join("exposed.png");
    let grey = image::open(&gallery[0]).unwrap().to_luma8();
    image::GrayImage::from_fn(grey.width(), grey.height(), |x, y| {
        image::Luma([(100.0 + 0.5 * grey.get_pixel(x, y)[0] as f32).round() as u8])
    })
    .save(&exposed)
    .unwrap();
    let (found, score) = first(exposed.to_str().unwrap());
    assert_eq!(found, id);
    assert!((score - own).abs() < 0.02, "{score} vs {own}");
    // an index of crops as stored takes queries as stored
    e.index_build(
        &model,
        &manifest,
        "plain",
        &["--k", "4", "--brightness", "as-is"],
    );
    let info: serde_json::Value =
        serde_json::from_str(&e.ok(&["index", "info", "--index", "plain"])).unwrap();
    assert!(!info["model"].as_str().unwrap().contains('+'), "{info}");
    let mut args = vec!["search", "--index", "plain", query.as_str(), "--json"];
    args.extend(["--brightness", "as-is"]);
    args.extend(common);
    e.ok(&args);
}

/// `search --turns 4`: a gallery crop turned by a quarter and mirrored is found as itself,
/// through the variant that undoes the turn, scored `TURN_MARGIN` below its own score.
#[test]
fn a_turned_search_finds_a_crop_seen_turned_and_mirrored() {
    let e = Env::new();
    let model = e.tiny_model();
    let manifest = e.tile_benchmark("4");
    e.index_build(&model, &manifest, "idx", &["--k", "4", "--codec", "f32"]);
    let gallery = e.gallery_images();
    let first = |q: &str, turns: &str| e.top_hit("idx", &model, q, &["--turns", turns]);
    for (i, path) in gallery.iter().take(3).enumerate() {
        let own = path.display().to_string();
        let (id, self_score) = first(&own, "1");
        assert_eq!(Some(id.as_str()), path.file_stem().and_then(|s| s.to_str()));
        let turned = e.root.join(format!("turned{i}.png"));
        image::open(path)
            .unwrap()
            .rotate90()
            .fliph()
            .save(&turned)
            .unwrap();
        let (found, score) = first(turned.to_str().unwrap(), "4");
        assert_eq!(found, id, "{}", turned.display());
        let margin = craterdex_engine::TURN_MARGIN as f64;
        assert!(
            (score - (self_score - margin)).abs() < 2e-3,
            "{score} vs {self_score}"
        );
    }
    // a turned query reads its image as extraction does: a cut JPEG is refused, naming the
    // file and the way out, and used in part when allowed
    let mut jpeg = std::io::Cursor::new(Vec::new());
    image::open(&gallery[0])
        .unwrap()
        .write_to(&mut jpeg, image::ImageFormat::Jpeg)
        .unwrap();
    let jpeg = jpeg.into_inner();
    let cut = e.root.join("cut.jpg");
    std::fs::write(&cut, &jpeg[..jpeg.len() - 8]).unwrap();
    let turned_search = |extra: &[&str]| {
        let mut args = vec![
            "search",
            "--index",
            "idx",
            cut.to_str().unwrap(),
            "--json",
            "--turns",
            "4",
            "--model",
            &model,
            "--size",
            "16",
        ];
        args.extend(extra);
        e.run(&args)
    };
    let o = turned_search(&[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("cut.jpg") && err.contains("allowing partial images"),
        "{err}"
    );
    let o = turned_search(&["--allow-partial-images"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = e.run(&[
        "search",
        "--index",
        "idx",
        &gallery[0].display().to_string(),
        "--turns",
        "0",
        "--model",
        &model,
        "--size",
        "16",
    ]);
    assert_eq!(o.status.code(), Some(3), "0 turns are refused");
}

/// `search --opposite-sun`: a gallery crop with its brightness inverted (lit from the other
/// side, to first order) is found as itself, through the inverted view, scored
/// `OPPOSITE_SUN_MARGIN` below its own score; the index and its bytes are unchanged.
#[test]
fn a_search_under_the_opposite_sun_finds_a_crop_lit_from_the_other_side() {
    let e = Env::new();
    let model = e.tiny_model();
    let manifest = e.tile_benchmark("4");
    e.index_build(&model, &manifest, "idx", &["--k", "4", "--codec", "f32"]);
    let gallery = e.gallery_images();
    let first = |q: &str, extra: &[&str]| e.top_hit("idx", &model, q, extra);
    let mut found_only_relit = 0;
    for (i, path) in gallery.iter().take(3).enumerate() {
        let own = path.display().to_string();
        let (id, self_score) = first(&own, &[]);
        assert_eq!(Some(id.as_str()), path.file_stem().and_then(|s| s.to_str()));
        // the query itself scores as in a plain search
        assert_eq!(first(&own, &["--opposite-sun"]), (id.clone(), self_score));
        let relit = e.root.join(format!("relit{i}.png"));
        let mut im = image::open(path).unwrap();
        im.invert();
        im.save(&relit).unwrap();
        let relit = relit.to_str().unwrap();
        let (found, score) = first(relit, &["--opposite-sun"]);
        assert_eq!(found, id, "{relit}");
        let margin = craterdex_engine::OPPOSITE_SUN_MARGIN as f64;
        assert!(
            (score - (self_score - margin)).abs() < 2e-3,
            "{score} vs {self_score}"
        );
        found_only_relit += usize::from(first(relit, &[]).0 != id);
    }
    assert!(
        found_only_relit > 0,
        "the plain search found every inverted crop"
    );
}

#[test]
fn a_verified_search_counts_inliers_and_reads_candidates_where_the_index_found_them() {
    let e = Env::new();
    let model = e.tiny_model();
    let manifest = e.tile_benchmark("4");
    e.index_build(&model, &manifest, "idx", &[]);
    let gallery = e.gallery_images();
    let query = gallery[0].display().to_string();
    let search_for = |query: &str, extra: &[&str]| {
        let mut args = vec![
            "search", "--index", "idx", query, "--json", "--top", "5", "--model", &model, "--size",
            "16",
        ];
        args.extend(extra);
        e.run(&args)
    };
    let search = |extra: &[&str]| search_for(&query, extra);
    let hits = |o: &Output| -> Vec<serde_json::Value> {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v[0]["results"].as_array().unwrap().clone()
    };
    let plain = hits(&search(&["--no-recheck"]));
    assert!(plain.iter().all(|h| h.get("inliers").is_none()));
    // by default the best images are verified (the query registers with itself: no second
    // search)
    let o = search(&[]);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("searched again"));
    let rechecked = hits(&o);
    assert_eq!(
        Some(rechecked[0]["id"].as_str().unwrap()),
        gallery[0].file_stem().and_then(|s| s.to_str())
    );
    assert_eq!(rechecked[0]["inliers"].as_u64(), Some((G * G) as u64));
    let verified = hits(&search(&["--verify", "3"]));
    // the image itself: every patch corresponds in place
    assert_eq!(
        Some(verified[0]["id"].as_str().unwrap()),
        gallery[0].file_stem().and_then(|s| s.to_str())
    );
    assert_eq!(verified[0]["inliers"].as_u64(), Some((G * G) as u64));
    let counted = verified.iter().filter(|h| h["inliers"].is_u64()).count();
    assert!((1..=3).contains(&counted), "{counted} verified");
    for h in &verified {
        if let Some(n) = h["inliers"].as_u64() {
            let li = h["stage2"].as_f64().unwrap();
            let chance = (craterdex_engine::VERIFY_CHANCE_SHARE * (G * G) as f32) as f64;
            let want = li + craterdex_engine::VERIFY_WEIGHT as f64 * (n as f64 - chance).max(0.0);
            assert!((h["score"].as_f64().unwrap() - want).abs() < 1e-4, "{h}");
        }
    }
    // turned and mirrored, searched at 4 turns: verified against the view that undoes it
    let turned = e.root.join("turned.png");
    image::open(&gallery[0])
        .unwrap()
        .rotate90()
        .fliph()
        .save(&turned)
        .unwrap();
    let turned = turned.display().to_string();
    let o = e.run(&[
        "search", "--index", "idx", &turned, "--json", "--top", "5", "--model", &model, "--size",
        "16", "--turns", "4", "--verify", "3",
    ]);
    let both = hits(&o);
    assert_eq!(both[0]["id"], verified[0]["id"]);
    assert_eq!(both[0]["inliers"].as_u64(), Some((G * G) as u64));
    // candidates whose images are gone keep their scores, and the search says so
    for p in &gallery[1..] {
        std::fs::remove_file(p).unwrap();
    }
    let o = search(&["--verify", "3"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("could not be used"));
    let after = hits(&o);
    assert_eq!(after[0]["inliers"].as_u64(), Some((G * G) as u64));
    assert_eq!(after.iter().filter(|h| h["inliers"].is_u64()).count(), 1);
}

#[test]
fn link_inserts_what_is_new_once_and_dedup_groups_exact_copies() {
    let e = Env::new();
    let model = e.tiny_model();
    let manifest = e.tile_benchmark("4");
    let common = ["--model", model.as_str(), "--size", "16"];
    e.index_build(&model, &manifest, "idx", &["--codec", "f16", "--k", "4"]);
    let live = || -> u64 {
        let info: serde_json::Value =
            serde_json::from_str(&e.ok(&["index", "info", "--index", "idx"])).unwrap();
        info["images"].as_u64().unwrap()
    };
    let n = live();
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    let g0 = &m["gallery_images"][0];
    let gallery_path = e.root.join("bench").join(g0["path"].as_str().unwrap());
    // new observations: an exact copy of a catalogue entry and a blank crop, with a CSV of
    // their metadata beside the directory
    std::fs::create_dir_all(e.root.join("new")).unwrap();
    std::fs::copy(&gallery_path, e.root.join("new/copy.png")).unwrap();
    GrayImage::from_pixel(40, 40, Luma([7]))
        .save(e.root.join("new/blank.png"))
        .unwrap();
    std::fs::write(
        e.root.join("new.csv"),
        "id,crater_id\ncopy,seen\nblank,unseen\n",
    )
    .unwrap();
    // only a near-perfect score is a match here (the tiny model's scores mean nothing)
    std::fs::write(
        e.root.join("rule.json"),
        r#"{"match_confidence":0.5,"new_confidence":0.4,"max_offset_radii":3.0,
            "max_diameter_ratio":1.5,"body_radius_km":3389.5,
            "appearance_weights":[-999.0,1000.0],"geometry_weights":[-999.0,1000.0,0.0,0.0],
            "source":"test"}"#,
    )
    .unwrap();
    let link = |out: &str, extra: &[&str]| {
        let mut args = vec![
            "link",
            "--index",
            "idx",
            "--entries",
            "new",
            "--out",
            out,
            "--insert-new",
            "--rule",
            "rule.json",
        ];
        args.extend(extra);
        args.extend(common);
        e.ok(&args)
    };
    let said = link("links1", &[]);
    assert!(said.contains("2 entries"), "{said}");
    let rows: Vec<Vec<String>> = std::fs::read_to_string(e.root.join("links1/links.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    let copy = rows.iter().find(|r| r[0] == "copy").unwrap();
    assert_eq!(copy[1], "seen");
    assert_eq!(copy[2], "match", "{copy:?}");
    assert_eq!(copy[4], g0["image_id"].as_str().unwrap());
    assert_eq!(copy[11], "false");
    let review = std::fs::read_to_string(e.root.join("links1/review.html")).unwrap();
    assert!(review.contains("data:image/png;base64,") && review.contains("copy"));
    let inserted = rows.iter().filter(|r| r[11] == "true").count() as u64;
    assert_eq!(live(), n + inserted);
    // a second run over the same entries adds nothing; its --json summary says so
    let summary: serde_json::Value = serde_json::from_str(&link("links2", &["--json"])).unwrap();
    assert_eq!(summary["entries"], 2, "{summary}");
    assert_eq!(
        summary["index"]["images_before"],
        summary["index"]["images"]
    );
    assert_eq!(summary["rule"], "test");
    let decided: u64 = ["match", "new", "ambiguous"]
        .iter()
        .map(|d| summary["decisions"][d].as_u64().unwrap())
        .sum();
    assert_eq!(decided, 2, "{summary}");
    assert_eq!(live(), n + inserted);
    let gj: serde_json::Value =
        serde_json::from_slice(&std::fs::read(e.root.join("links2/links.geojson")).unwrap())
            .unwrap();
    assert_eq!(gj["features"].as_array().unwrap().len(), 2);

    // an exact copy added to the index is grouped with its original by dedup
    let mut args = vec!["index", "add", "--index", "idx", "--dir", "new"];
    args.extend(common);
    let o = e.run(&args);
    // `blank` may already be in the index (inserted above): then add refuses the repeated id
    if !o.status.success() {
        std::fs::remove_file(e.root.join("new/blank.png")).unwrap();
        e.ok(&args);
    }
    let said = e.ok(&[
        "dedup",
        "--index",
        "idx",
        "--out",
        "dd",
        "--rule",
        "rule.json",
    ]);
    let groups = std::fs::read_to_string(e.root.join("dd/groups.csv")).unwrap();
    let group_of = |id: &str| {
        groups
            .lines()
            .find(|l| l.split(',').nth(1) == Some(id))
            .map(|l| l.split(',').next().unwrap().to_string())
    };
    assert!(group_of("copy").is_some(), "{said}\n{groups}");
    assert_eq!(group_of("copy"), group_of(g0["image_id"].as_str().unwrap()));
    let review = std::fs::read_to_string(e.root.join("dd/review.html")).unwrap();
    assert!(
        review.contains("class=\"keep\"") && review.contains("copy"),
        "{review}"
    );
    let merged = std::fs::read_to_string(e.root.join("dd/merged.csv")).unwrap();
    let absorbed: usize = groups
        .lines()
        .skip(1)
        .filter(|l| l.contains(",false,"))
        .count();
    assert_eq!(merged.lines().count() as u64 - 1, live() - absorbed as u64);
    let summary: serde_json::Value = serde_json::from_str(&e.ok(&[
        "dedup",
        "--index",
        "idx",
        "--out",
        "dd2",
        "--rule",
        "rule.json",
        "--json",
    ]))
    .unwrap();
    assert_eq!(summary["entries"].as_u64(), Some(live()), "{summary}");
    assert_eq!(
        summary["merged_entries"].as_u64(),
        Some(live() - absorbed as u64),
        "{summary}"
    );

    // calibration either fits or says why it cannot (never a panic)
    let mut args = vec![
        "calibrate",
        "--index",
        "idx",
        "--entries",
        &manifest,
        "--dry-run",
    ];
    args.extend(common);
    let o = e.run(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() || err.contains("calibration needs"),
        "{err}"
    );
}

#[test]
fn eval_link_scores_the_rule_against_both_baselines() {
    let e = Env::new();
    let model = e.tiny_model();
    // 144 craters on a textured tile, far enough apart that geometry alone can tell them
    let craters: Vec<(f64, f64, f64)> = (0..144)
        .map(|i| {
            (
                35.0 + (i % 12) as f64 * 30.0,
                35.0 + (i / 12) as f64 * 30.0,
                12.0 + (i % 5) as f64 * 2.0,
            )
        })
        .collect();
    let img = GrayImage::from_fn(400, 400, |x, y| {
        let mut v = 140.0 + 30.0 * ((x as f64 * 0.31).sin() * (y as f64 * 0.17).cos());
        for (i, &(cx, cy, d)) in craters.iter().enumerate() {
            let r = ((x as f64 - cx).powi(2) + (y as f64 - cy).powi(2)).sqrt();
            if r < d / 2.0 {
                v -= 40.0 + 3.0 * (i % 7) as f64 * (r / d);
            }
        }
        Luma([v.clamp(0.0, 255.0) as u8])
    });
    img.save(e.root.join("big.png")).unwrap();
    let mut csv = String::from("long,lat,diameter\n");
    for (x, y, d) in &craters {
        csv.push_str(&format!("{x},{y},{d}\n"));
    }
    std::fs::write(e.root.join("big.csv"), csv).unwrap();
    let out = e.ok(&[
        "eval-link",
        "--tile",
        "big.png",
        "--craters",
        "big.csv",
        "--out",
        "lb",
        "--model",
        &model,
        "--size",
        "16",
        "--min-diameter",
        "10",
        // the first observation's frame, a small turn: the geometry baselines' setting
        "--georef-errors",
        "0.5,4",
        "--max-rotation",
        "15",
        "--catalogue-frame",
        "--transform-error",
        "0,0",
    ]);
    assert!(out.contains("geometry only"), "{out}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(e.root.join("lb/results.json")).unwrap())
            .unwrap();
    let levels = r["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    let f = |l: &serde_json::Value, m: &str, k: &str| l[m][k].as_f64().unwrap();
    // a small georeferencing error: the nearest centre is the crater
    assert!(
        f(&levels[0], "geometry_only", "recall") > 0.8,
        "{}",
        levels[0]
    );
    // 4 median radii: the centre within 1 radius is rarely the right crater
    assert!(
        f(&levels[1], "geometry_only", "recall") < 0.3,
        "{}",
        levels[1]
    );
    for l in levels {
        for m in [
            "default_rule",
            "registered_calibrated",
            "registration_only",
            "unregistered_calibrated",
            "appearance_only",
            "geometry_only_wide",
        ] {
            assert!((0.0..=1.0).contains(&f(l, m, "f1")), "{m}: {l}");
        }
    }
    let auroc = r["open_set"]["new_auroc"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&auroc));
    assert!(e.root.join("lb/observations/second-e4.csv").is_file());
}

#[test]
fn discover_ranks_the_windows_of_a_tile_and_eval_discover_scores_them() {
    let e = Env::new();
    let model = e.tiny_model();
    let (tile, cat) = write_tile(&e.root);
    let said = e.ok(&[
        "bench-build",
        "--tile",
        tile.to_str().unwrap(),
        "--windows",
        "40",
        "--out",
        "win",
    ]);
    // 260 x 200 px, 40-px windows every 20 px: 12 x 9
    assert!(said.starts_with("108 windows"), "{said}");
    let common = ["--model", model.as_str(), "--size", "16"];
    let mut args = vec![
        "index",
        "build",
        "--dir",
        "win/windows",
        "--out",
        "win-index",
        "--k",
        "4",
    ];
    args.extend(common);
    e.ok(&args);
    // an exemplar that is one of the windows ranks that window first
    let exemplar = e.path("win/windows/tile-40-20.png");
    let mut args = vec![
        "discover",
        "--index",
        "win-index",
        "--query",
        &exemplar,
        "--out",
        "found",
    ];
    args.extend(common);
    e.ok(&args);
    let ranked = std::fs::read_to_string(e.root.join("found/ranked.csv")).unwrap();
    assert_eq!(ranked.lines().count(), 1 + 108);
    let first: Vec<&str> = ranked.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(first[1], "tile-40-20", "{ranked}");
    // positions carried from windows.csv: the window's centre
    assert_eq!((first[4], first[5]), ("59.5", "39.5"));
    let mut args = vec![
        "eval-discover",
        "--tile",
        tile.to_str().unwrap(),
        "--craters",
        cat.to_str().unwrap(),
        "--out",
        "disc",
        "--classes",
        "10-20",
        "--exemplars",
        "2",
    ];
    args.extend(common);
    let out = e.ok(&args);
    assert!(
        out.contains("single vector") && out.contains("AUPRC"),
        "{out}"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(e.root.join("disc/results.json")).unwrap())
            .unwrap();
    let auprc = r[0]["craterdex"]["auprc"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&auprc));
    // 10 craters of 10-20 px (diameters 12-18), 2 of them the exemplars
    assert_eq!(r[0]["craterdex"]["targets"], 8);
}

/// `bench search-images` times each kind of query at every level and pass, and counts the
/// forward passes a query costs where they run: one for a plain search, `2 * turns` in turns.
#[test]
fn bench_search_images_counts_each_querys_forward_passes_per_level_and_kind() {
    let e = Env::new();
    let model = e.tiny_model();
    let (tile, cat) = write_tile(&e.root);
    e.bench_build((&tile, &cat), "turned", "4", "10", &["--rotated-split"]);
    e.index_build(&model, &e.path("turned/splits/test.json"), "idx", &[]);
    let bench = |extra: &[&str]| {
        let upright = format!("upright={}", e.path("turned/splits/test.json"));
        let turned = format!("turned={}", e.path("turned/splits/test_rotated.json"));
        let mut args = vec![
            "bench",
            "search-images",
            "--index",
            "idx",
            "--split",
            &upright,
            "--split",
            &turned,
            "--queries",
            "3",
            "--model",
            &model,
            "--size",
            "16",
        ];
        args.extend(extra);
        let out = e.ok(&args);
        // level, precision, kind, pass, n, p50, p99, mean, passes, stages, x passes, x p50,
        // R@1, peak MB
        let rows: Vec<Vec<String>> = out
            .lines()
            .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .filter(|c| c.len() == 14 && (c[2] == "upright" || c[2] == "turned"))
            .collect();
        (out, rows)
    };
    let cpu = e.ok(&["cpu"]);
    let levels = cpu
        .lines()
        .find_map(|l| l.strip_prefix("levels this CPU supports:"))
        .unwrap()
        .split_whitespace()
        .count();
    let (out, rows) = bench(&[]);
    assert_eq!(rows.len(), 4 * levels, "{out}");
    for r in &rows {
        assert_eq!(r[4], "3", "{out}");
        let passes: f64 = r[8].parse().unwrap();
        assert!(passes >= 1.0, "every query runs at least once:\n{out}");
        let right: f64 = r[12].parse().unwrap();
        assert!((0.0..=1.0).contains(&right), "{out}");
        if r[2] == "upright" {
            assert_eq!((r[10].as_str(), r[11].as_str()), ("1.00", "1.00"), "{out}");
        }
    }
    let (out, rows) = bench(&["--no-recheck", "--levels", "portable"]);
    assert_eq!(rows.len(), 4, "{out}");
    assert!(
        rows.iter().all(|r| r[0] == "portable" && r[8] == "1.00"),
        "{out}"
    );
    let (out, rows) = bench(&["--turns", "2", "--levels", "portable"]);
    assert!(
        rows.iter().all(|r| r[8] == "4.00" && r[10] == "1.00"),
        "{out}"
    );
    let refused = |extra: &[&str]| {
        let mut args = vec!["bench", "search-images", "--index", "idx"];
        args.extend(extra);
        let o = e.run(&args);
        assert!(!o.status.success());
        String::from_utf8(o.stderr).unwrap()
    };
    assert!(refused(&["--split", "upright"]).contains("NAME=PATH"));
    let upright = format!("upright={}", e.path("turned/splits/test.json"));
    let err = refused(&["--split", &upright, "--index-for", "turned=idx"]);
    assert!(
        err.contains("--index-for turned: no --split of that name"),
        "{err}"
    );
}

/// `bench extract` says what each precision reaches against the level's peak, where a pass
/// spends its time, and (`--scaling`) how it scales with threads and batch.
#[test]
fn bench_extract_reports_operations_peak_profile_and_scaling() {
    let e = Env::new();
    let model = e.tiny_model();
    let (tile, _) = write_tile(&e.root);
    std::fs::create_dir_all(e.root.join("imgs")).unwrap();
    for i in 0..4 {
        std::fs::copy(&tile, e.root.join(format!("imgs/{i}.png"))).unwrap();
    }
    let out = e.ok(&[
        "bench",
        "extract",
        "--dir",
        "imgs",
        "--images",
        "4",
        "--repeats",
        "1",
        "--no-reference",
        "--scaling",
        "--model",
        &model,
        "--size",
        "64",
    ]);
    // the tiny model at 64 px: D 32, one block, MLP 64, 4-px patches on a 16 x 16 grid
    let n = (64 / P) * (64 / P);
    let t = (n + 1) as f64;
    let flops = 2.0 * n as f64 * (3 * P * P * D) as f64
        + 2.0 * t * D as f64 * (4 * D + 2 * 2 * D) as f64
        + 4.0 * t * t * D as f64;
    assert!(
        out.contains(&format!("{:.2} MFLOP per image", flops / 1e6)),
        "{out}"
    );
    let f32_row = out
        .lines()
        .find(|l| l.starts_with("craterdex (f32)"))
        .unwrap();
    let cols: Vec<&str> = f32_row.split_whitespace().collect();
    let (rate, gflops): (f64, f64) = (cols[2].parse().unwrap(), cols[3].parse().unwrap());
    assert!(
        (gflops - rate * flops / 1e9).abs() <= 0.051 + 1e-3 * gflops,
        "{f32_row}"
    );
    for want in [
        "peak of craterdex (f32):",
        "where craterdex (f32) spends a pass: linear layers",
        "where craterdex (int8) spends a pass:",
        "craterdex (f32) threads 1 batch 1:",
    ] {
        assert!(out.contains(want), "{want:?} missing:\n{out}");
    }
}

/// A crater lit from the left: a bowl, `pits` small pits of its own around it and 60 bumps
/// on the terrain (placed by a hash of the pits), all under one Lambertian sun, so that every
/// crater looks different and its mirror image too, while its sun's heading reads the same in
/// every one. Albedo blotches in place of the bumps (edges along the pixel grid, as bright
/// one way as the other) turned the shading's axis by up to 19 degrees.
fn lit_crater(side: u32, pits: &[(f32, f32)]) -> GrayImage {
    let seed = pits.iter().fold(0u32, |h, &(px, py)| {
        h.wrapping_mul(2_654_435_761)
            .wrapping_add(((px + 2.0) * 1000.0) as u32 ^ ((py + 2.0) * 7919.0) as u32)
    });
    let bumps: Vec<(f32, f32, f32, f32)> = (0u32..)
        .map(|i| {
            let u = |k: u32| {
                let h = (seed ^ i.wrapping_mul(104_729) ^ k.wrapping_mul(0x9e37_79b9))
                    .wrapping_mul(2_654_435_761);
                let h = (h ^ (h >> 15)).wrapping_mul(2_246_822_519);
                ((h >> 20) & 0xfff) as f32 / 4096.0
            };
            let sign = if u(3) > 0.5 { 1.0 } else { -1.0 };
            (2.0 * u(0) - 1.0, 2.0 * u(1) - 1.0, 0.06 + 0.08 * u(2), sign)
        })
        // on the terrain around the bowl
        .filter(|&(bx, by, _, _)| bx * bx + by * by >= 0.5)
        .take(60)
        .collect();
    let c = (side as f32 - 1.0) / 2.0;
    GrayImage::from_fn(side, side, |x, y| {
        let (dx, dy) = ((x as f32 - c) / c, (y as f32 - c) / c);
        // each feature's slope along x, the sun's axis
        let mut slope = if dx * dx + dy * dy < 0.3 {
            2.0 * dx
        } else {
            0.0
        };
        for &(px, py) in pits {
            if (dx - px).powi(2) + (dy - py).powi(2) < 0.02 {
                slope += 6.0 * (dx - px);
            }
        }
        for &(bx, by, r, a) in &bumps {
            let g = a * (-((dx - bx).powi(2) + (dy - by).powi(2)) / (r * r)).exp();
            slope -= 0.16 * g * (dx - bx) / (r * r);
        }
        let v = 0.5 + 0.35 * slope;
        Luma([(v.clamp(0.0, 1.0) * 255.0) as u8])
    })
}

/// Eight lit craters (their own pits, one sun from the left) indexed with the tiny model at
/// 64 px in `idx`, and crater c3 turned by 2.3 rad and mirrored as a query; the model
/// options the index needs and the query's path. At every precision (f32, int8, bf16) and
/// kernel level (portable, avx2, avx512; 2026-11-30, Zen 4), of 256 patches: as given,
/// verified, no image gathers more than 55 inliers, in four turns and their mirror images
/// 71; turned toward the catalogue's sun (358 degrees), c3 134-135 and the next 97.
fn lit_catalogue(e: &Env, model: &str) -> (Vec<String>, PathBuf) {
    let dir = e.root.join("lit");
    std::fs::create_dir_all(&dir).unwrap();
    let mut csv = String::from("id,crater_id\n");
    for i in 0..8 {
        let a = i as f32 * 0.7;
        let pits = [
            (0.65 * a.cos(), 0.65 * a.sin()),
            (0.3 * (2.0 * a).sin(), -0.75),
        ];
        lit_crater(64, &pits)
            .save(dir.join(format!("c{i}.png")))
            .unwrap();
        csv.push_str(&format!("c{i},crater{i}\n"));
    }
    std::fs::write(e.root.join("lit.csv"), csv).unwrap();
    let common: Vec<String> = ["--model", model, "--size", "64"]
        .map(String::from)
        .to_vec();
    let mut build = vec!["index", "build", "--dir", "lit", "--out", "idx"];
    build.extend(common.iter().map(String::as_str));
    e.ok(&build);
    let turned = image::DynamicImage::ImageRgb32F(craterdex_model::preprocess::turn(
        &image::open(dir.join("c3.png")).unwrap().to_rgb32f(),
        2.3,
    ))
    .fliph()
    .to_luma8();
    let query = e.root.join("turned.png");
    turned.save(&query).unwrap();
    (common, query)
}

/// Asserts that the one catalogue sun a search's `stderr` names is `lit_catalogue`'s: from
/// the left, its heading along +x (each image's own within 10 degrees of it).
fn lit_from_the_left(stderr: &str) {
    let sun: f32 = stderr
        .split("toward the catalogue's suns (")
        .nth(1)
        .and_then(|rest| rest.split(" degrees)").next())
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("one sun heading in {stderr}"));
    assert!(sun <= 5.0 || sun >= 355.0, "{stderr}");
}

/// The hits of `query` searched by default in index `idx` (with the `model` options), whose
/// note on stderr says it was searched again as `note` says and not in turns; and that note.
fn searched_again_without_turns(
    e: &Env,
    query: &Path,
    model: &[&str],
    note: &str,
) -> (serde_json::Value, String) {
    let q = query.to_str().unwrap();
    let mut search = vec!["search", "--index", "idx", q, "--json", "--top", "3"];
    search.extend(model);
    let o = e.run(&search);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains(note), "{stderr}");
    assert!(!stderr.contains("searched again in turns"), "{stderr}");
    (
        serde_json::from_slice(&o.stdout).unwrap(),
        stderr.into_owned(),
    )
}

/// A query turned and mirrored does not register as given; turned toward the catalogue's
/// one sun it is the indexed crater again, found without the search in 12 turns.
#[test]
fn a_turned_query_is_found_again_toward_the_catalogues_sun_first() {
    let e = Env::new();
    let model = e.tiny_model();
    let (common, query) = lit_catalogue(&e, &model);
    let common: Vec<&str> = common.iter().map(String::as_str).collect();
    let (v, stderr) = searched_again_without_turns(
        &e,
        &query,
        &common,
        "searched again turned toward the catalogue's suns (",
    );
    lit_from_the_left(&stderr);
    let first = &v[0]["results"][0];
    assert_eq!(first["id"].as_str(), Some("c3"), "{v}");
    let inliers = first["inliers"].as_u64().unwrap() as f32;
    // 64-px crops in patches of P px
    let patches = (64 / P).pow(2) as f32;
    assert!(
        inliers >= craterdex_engine::RecheckPlan::shipped().unsure_share * patches,
        "{inliers} inliers"
    );
}

/// A crater in rough terrain (a bowl and 250 bumps 1-4 px across placed by `seed`) shaded by
/// a sun along `sun` radians under linear Lambertian light: brightness departs from flat
/// ground's by the slope along the sun, as the relit benchmark's hillshades do.
///
/// The bumps leave little flat ground, which looks alike in every image. Among 40 larger
/// bumps, the query's views turned toward the sun gathered 94-104 inliers with every crater,
/// where 103 register, so the stage that found it depended on the precision (issue 52). With
/// these, at every precision (f32, int8, bf16) and kernel level (portable, avx2, avx512;
/// 2026-11-30, Zen 4), of 256 patches: as given, verified, no image gathers more than 35
/// inliers, in four turns and their mirror images 54; relit, the right crater 213-215 and
/// the next 37. The catalogue's sun reads 181 degrees: brightness falls with the slope along
/// +x, so the lit walls face -x.
fn shaded_terrain(side: u32, seed: u32, sun: f32) -> GrayImage {
    let bumps: Vec<(f32, f32, f32, f32)> = (0..250u32)
        .map(|i| {
            // each coordinate from a hash of its own: drawn from shared bits of one hash, x
            // and y lay the bumps along a line, a lineation the shading's axis reads
            let u = |k: u32| {
                let h = ((seed * 7919 + i * 104_729) ^ k.wrapping_mul(0x9e37_79b9))
                    .wrapping_mul(2_654_435_761);
                let h = (h ^ (h >> 15)).wrapping_mul(2_246_822_519);
                ((h >> 20) & 0xfff) as f32 / 4096.0
            };
            (
                u(0),
                u(1),
                0.01 + 0.02 * u(2),
                if u(3) > 0.5 { 0.5 } else { -0.5 },
            )
        })
        .collect();
    let height = |x: f32, y: f32| {
        let r2 = (x - 0.5).powi(2) + (y - 0.5).powi(2);
        let bumps: f32 = bumps
            .iter()
            .map(|&(bx, by, r, a)| a * (-((x - bx).powi(2) + (y - by).powi(2)) / (r * r)).exp())
            .sum();
        -(-r2 / 0.03).exp() + 0.3 * bumps
    };
    let e = 1.0 / side as f32;
    let (sin, cos) = sun.sin_cos();
    GrayImage::from_fn(side, side, |x, y| {
        let (u, v) = (x as f32 * e, y as f32 * e);
        let gx = (height(u + e, v) - height(u - e, v)) / (2.0 * e);
        let gy = (height(u, v + e) - height(u, v - e)) / (2.0 * e);
        let b = 0.5 - 0.04 * (gx * cos + gy * sin);
        Luma([(b.clamp(0.0, 1.0) * 255.0) as u8])
    })
}

/// A query under a sun turned by 90 degrees registers neither as given nor turned toward the
/// catalogue's sun; relit toward it, it is the indexed crater again, found without the
/// search in 12 turns.
#[test]
fn a_query_under_another_sun_is_found_again_relit_toward_the_catalogues_sun() {
    let e = Env::new();
    let model = e.tiny_model();
    let dir = e.root.join("shaded");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..8 {
        shaded_terrain(64, i, 0.0)
            .save(dir.join(format!("t{i}.png")))
            .unwrap();
    }
    let query = e.root.join("relit.png");
    shaded_terrain(64, 3, std::f32::consts::FRAC_PI_2)
        .save(&query)
        .unwrap();
    let common = ["--model", model.as_str(), "--size", "64"];
    let mut build = vec!["index", "build", "--dir", "shaded", "--out", "idx"];
    build.extend(common);
    e.ok(&build);
    let (v, _) = searched_again_without_turns(
        &e,
        &query,
        &common,
        "searched again relit toward the catalogue's suns",
    );
    assert_eq!(v[0]["results"][0]["id"].as_str(), Some("t3"), "{v}");
    // as given, verified, no crater registers under the other sun (the tokens alone may
    // still rank t3 first: f32 at the portable level did)
    let q = query.to_str().unwrap();
    let mut search = vec![
        "search",
        "--index",
        "idx",
        q,
        "--json",
        "--no-recheck",
        "--verify",
        "50",
    ];
    search.extend(common);
    let v: serde_json::Value = serde_json::from_str(&e.ok(&search)).unwrap();
    let inliers = v[0]["results"][0]["inliers"].as_u64().unwrap() as f32;
    let patches = (64 / P).pow(2) as f32;
    assert!(
        inliers < craterdex_engine::RecheckPlan::shipped().unsure_share * patches,
        "{v}"
    );
    // bounded to 3 views, it is searched again turned toward the sun (2 views) and no
    // further; to 1, only as given
    let bounded = |views: &str| {
        let mut search = vec!["search", "--index", "idx", q, "--json"];
        search.extend(["--recheck-views", views]);
        search.extend(common);
        let o = e.run(&search);
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{stderr}");
        stderr
    };
    let three = bounded("3");
    assert!(three.contains("searched again turned toward"), "{three}");
    assert!(
        !three.contains("relit") && !three.contains("in turns"),
        "{three}"
    );
    let one = bounded("1");
    assert!(!one.contains("searched again"), "{one}");
    let mut zero = vec!["search", "--index", "idx", q, "--recheck-views", "0"];
    zero.extend(common);
    let o = e.run(&zero);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && stderr.contains("recheck_views must be at least 1"),
        "{stderr}"
    );
}

/// A shard set is searched as its index is: rechecked by default (the turned query found
/// toward the catalogue's sun, measured over every shard), in turns with verification, and
/// as given; the same hits, inliers and scores as the index the set was cut from.
#[test]
fn a_shard_set_searches_a_turned_query_as_its_index_does() {
    let e = Env::new();
    let model = e.tiny_model();
    let (common, query) = lit_catalogue(&e, &model);
    e.ok(&[
        "index", "split", "--index", "idx", "--shards", "2", "--out", "set",
    ]);
    let hits = |target: &[&str], options: &[&str]| {
        let mut search = vec!["search", query.to_str().unwrap(), "--json", "--top", "4"];
        search.extend(target);
        search.extend(options);
        search.extend(common.iter().map(String::as_str));
        let o = e.run(&search);
        let stderr = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "{stderr}");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let hits: Vec<(String, Option<u64>, i64)> = v[0]["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h["id"].as_str().unwrap().to_string(),
                    h["inliers"].as_u64(),
                    (h["score"].as_f64().unwrap() * 1e4).round() as i64,
                )
            })
            .collect();
        (hits, stderr)
    };
    for options in [
        &[][..],
        &["--turns", "4", "--verify", "5"][..],
        &["--no-recheck"][..],
    ] {
        let (whole, _) = hits(&["--index", "idx"], options);
        let (sharded, stderr) = hits(&["--shards", "set"], options);
        assert_eq!(whole, sharded, "{options:?}");
        if options.is_empty() {
            assert_eq!(sharded[0].0, "c3");
            assert!(sharded[0].1.is_some(), "{sharded:?}");
            assert!(
                stderr.contains("searched again turned toward the catalogue's suns ("),
                "{stderr}"
            );
            lit_from_the_left(&stderr);
        }
    }
}

/// A `craterdex serve` process, stopped when dropped.
struct Server(std::process::Child, std::net::SocketAddr);

impl Server {
    /// `craterdex serve` with `args` in `e`'s root, once it answers ready.
    fn start(e: &Env, args: &[&str]) -> Server {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_craterdex"))
            .arg("serve")
            .args(args)
            .args(["--addr", &addr.to_string()])
            .env("CRATERDEX_HOME", e.root.join("home"))
            .current_dir(&e.root)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let server = Server(child, addr);
        for _ in 0..300 {
            if server.request("GET", "/v1/ready", "", &[]).0 == 200 {
                return server;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("craterdex serve {args:?} not ready after 30 s");
    }

    /// Status and body of one request (HTTP/1.1, the connection closed after it).
    fn request(&self, method: &str, path: &str, content_type: &str, body: &[u8]) -> (u16, String) {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(self.1) else {
            return (0, String::new());
        };
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: \
             {content_type}\r\nContent-Length: {}\r\n\r\n",
            self.1,
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).to_string();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        (status, body)
    }

    /// A search by image (`query` the options) of the file at `image`.
    fn search_image(&self, image: &Path, query: &str) -> (u16, String) {
        let boundary = "craterdexboundary";
        let mut body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; \
             filename=\"q.png\"\r\nContent-Type: image/png\r\n\r\n"
        )
        .into_bytes();
        body.extend(std::fs::read(image).unwrap());
        body.extend(format!("\r\n--{boundary}--\r\n").as_bytes());
        self.request(
            "POST",
            &format!("/v1/search/image?{query}"),
            &format!("multipart/form-data; boundary={boundary}"),
            &body,
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Files under `dir`, at any depth.
fn files_under(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| match e.path().is_dir() {
                true => files_under(&e.path()),
                false => 1,
            })
            .sum()
    })
}

/// `craterdex serve` reads the candidates a verified search verifies through the on-disk
/// feature cache, as the command line does, so that a search again runs the model on none of
/// them; `--no-cache` writes nothing there.
#[test]
fn the_service_reads_verified_candidates_through_the_feature_cache_unless_told_not_to() {
    let e = Env::new();
    let model = e.tiny_model();
    let (common, _) = lit_catalogue(&e, &model);
    let query = e.root.join("lit").join("c2.png");
    let cache = e.root.join("home").join("features");
    let mut args = vec!["--index", "idx"];
    args.extend(common.iter().map(String::as_str));
    for (extra, cached) in [(None, true), (Some("--no-cache"), false)] {
        // the index build filled the cache with the gallery's features
        let _ = std::fs::remove_dir_all(&cache);
        let mut args = args.clone();
        args.extend(extra);
        let server = Server::start(&e, &args);
        let (status, body) = server.search_image(&query, "verify=4&recheck=false&top_k=4");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["results"][0]["id"], "c2", "{body}");
        assert!(v["results"][0]["inliers"].as_u64().is_some(), "{body}");
        // the 4 candidates' features kept (or not) for the next search
        let kept = files_under(&cache);
        assert_eq!(
            kept >= 4,
            cached,
            "{extra:?}: {kept} files in the feature cache"
        );
        assert!(
            cached || kept == 0,
            "{extra:?}: {kept} files in the feature cache"
        );
    }
}

/// `craterdex serve --max-query-views N` bounds every request: views past it are refused,
/// and the document it serves states the bound on `recheck_views`.
#[test]
fn serve_bounds_the_views_of_every_query_it_is_told_to() {
    let e = Env::new();
    let model = e.tiny_model();
    let (common, _) = lit_catalogue(&e, &model);
    let query = e.root.join("lit").join("c2.png");
    let mut args = vec!["--index", "idx", "--max-query-views", "2"];
    args.extend(common.iter().map(String::as_str));
    let server = Server::start(&e, &args);
    let (status, body) = server.search_image(&query, "turns=2");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("max_query_views"), "{body}");
    let (status, body) = server.search_image(&query, "top_k=1");
    assert_eq!(status, 200, "{body}");
    let (status, doc) = server.request("GET", "/v1/openapi.json", "", &[]);
    assert_eq!(status, 200);
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    let bound = doc["paths"]["/v1/search/image"]["post"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "recheck_views")
        .map(|p| p["schema"]["maximum"].clone());
    assert_eq!(bound, Some(serde_json::json!(2)));
}
