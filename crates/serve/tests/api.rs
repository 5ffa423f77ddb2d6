//! The service over a tiny generated model and index: every endpoint, its errors and limits,
//! writes through the API, load shedding, timeouts and graceful shutdown over real sockets.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use craterdex_index::codec::{Codec, TokenCodec};
use craterdex_index::{ImageMeta, Index};
use craterdex_model::Vit;
use craterdex_serve::{router, Config, Service};
use craterdex_tokens::aggregate::{Aggregation, SeedStrategy};
use craterdex_tokens::{Encoder, FeatureRef, Recipe};
use image::{GrayImage, Luma};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

const D: usize = 32;
const N: usize = 12;

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    index: PathBuf,
    model_dir: PathBuf,
    images: Vec<PathBuf>,
}

fn tiny_model(root: &Path) -> PathBuf {
    craterdex_model::testing::import_tiny_model(root, "tiny", D, 4, 4, 1)
}

fn load_model(dir: &Path) -> Vit {
    craterdex_model::load(dir, Some(16)).unwrap()
}

/// The model as the service runs it (no feature cache).
fn extractor(dir: &Path) -> craterdex_engine::Extractor {
    let options = craterdex_engine::ModelOptions {
        cache: false,
        ..Default::default()
    };
    craterdex_engine::Extractor::new(load_model(dir), &options)
}

fn write_image(path: &Path, seed: u64, side: u32) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let (cx, cy, r) = (
        rng.gen_range(10.0..30.0),
        rng.gen_range(10.0..30.0),
        rng.gen_range(5.0..15.0),
    );
    let phase: f64 = rng.gen_range(0.0..6.0);
    let img = GrayImage::from_fn(side, side, |x, y| {
        let (x, y) = (x as f64 * 48.0 / side as f64, y as f64 * 48.0 / side as f64);
        let mut v = 120.0 + 50.0 * ((x * 0.4 + phase).sin() * (y * 0.3 - phase).cos());
        if ((x - cx).powi(2) + (y - cy).powi(2)).sqrt() < r {
            v -= 70.0;
        }
        Luma([v.clamp(0.0, 255.0) as u8])
    });
    img.save(path).unwrap();
}

/// An image's features as a client with the service's model computes them.
fn features(x: &craterdex_engine::Extractor, path: &Path) -> craterdex_model::vit::ImageFeatures {
    let img = craterdex_model::preprocess::load_image(path).unwrap();
    x.features_of(&img).unwrap()
}

fn descriptors(
    x: &craterdex_engine::Extractor,
    encoder: &Encoder,
    path: &Path,
) -> craterdex_tokens::Descriptors {
    let f = features(x, path);
    encoder.encode(FeatureRef {
        cls: &f.cls,
        patches: &f.patches,
        attention: &f.attention,
    })
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let model_dir = tiny_model(&root);
    let vit = extractor(&model_dir);
    std::fs::create_dir_all(root.join("images")).unwrap();
    let images: Vec<PathBuf> = (0..N + 2)
        .map(|i| {
            let p = root.join(format!("images/c{i:02}.png"));
            write_image(&p, i as u64, 48);
            p
        })
        .collect();
    let encoder = Encoder::plain(Recipe {
        aggregation: Aggregation::Instance {
            seeds: SeedStrategy::Fps,
            k: 4,
            soft_m: 1,
        },
        whiten: false,
        ..Default::default()
    });
    // The last two images stay out of the index (for adding through the API).
    let entries: Vec<(ImageMeta, craterdex_tokens::Descriptors)> = images[..N]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let desc = descriptors(&vit, &encoder, p);
            let meta = ImageMeta {
                id: format!("c{i:02}"),
                crater_id: Some(format!("crater-{}", i / 2)),
                lat: Some(10.0 + i as f64),
                lon: Some(-20.0),
                diameter_km: Some(1.5),
                path: Some(p.display().to_string()),
                ..Default::default()
            };
            (meta, desc)
        })
        .collect();
    let codec = TokenCodec::train(Codec::F16, D, &[], 0).unwrap();
    let index = root.join("idx");
    Index::create(
        &index,
        &encoder,
        &codec,
        Some(vit.fingerprint()),
        &entries,
        None,
    )
    .unwrap();
    Fixture {
        _tmp: tmp,
        root,
        index,
        model_dir,
        images,
    }
}

fn service(f: &Fixture, edit: impl FnOnce(&mut Config)) -> Arc<Service> {
    let mut c = Config::new(f.index.clone());
    c.upload_dir = f.root.join("uploads");
    edit(&mut c);
    let svc = Service::new(c);
    svc.load(Some(extractor(&f.model_dir))).unwrap();
    svc
}

async fn call(svc: &Arc<Service>, req: Request<Body>) -> (StatusCode, Vec<u8>) {
    let resp = router(svc.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), 64 << 20)
        .await
        .unwrap();
    (status, body.to_vec())
}

async fn call_json(svc: &Arc<Service>, req: Request<Body>) -> (StatusCode, Value) {
    let (s, b) = call(svc, req).await;
    let v = serde_json::from_slice(&b)
        .unwrap_or_else(|e| panic!("{s}: not JSON ({e}): {}", String::from_utf8_lossy(&b)));
    (s, v)
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

const BOUNDARY: &str = "craterdexBoundary7d1f";

fn multipart(parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, file, data) in parts {
        body.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        match file {
            Some(f) => body.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes(),
            ),
            None => body.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes(),
            ),
        }
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

fn post_multipart(uri: &str, body: Vec<u8>, key: Option<&str>) -> Request<Body> {
    let mut r = Request::post(uri).header(
        "content-type",
        format!("multipart/form-data; boundary={BOUNDARY}"),
    );
    if let Some(k) = key {
        r = r.header("x-api-key", k);
    }
    r.body(Body::from(body)).unwrap()
}

fn upload(uri: &str, image: &Path) -> Request<Body> {
    let bytes = std::fs::read(image).unwrap();
    post_multipart(uri, multipart(&[("image", Some("q.png"), &bytes)]), None)
}

fn features_json(vit: &craterdex_engine::Extractor, path: &Path, nested: bool) -> Vec<u8> {
    let f = features(vit, path);
    let patches: Value = if nested {
        json!(f.patches.chunks(D).map(|r| r.to_vec()).collect::<Vec<_>>())
    } else {
        json!(f.patches)
    };
    serde_json::to_vec(&json!({"cls": f.cls, "patches": patches, "attention": f.attention}))
        .unwrap()
}

fn top_ids(v: &Value) -> Vec<String> {
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect()
}

/// The best hit of search answer `v` is `id`, found through a view of the query that matches
/// it nearly exactly by late interaction and scored that view's `margin` lower.
fn assert_found_through_a_view(v: &Value, id: &str, margin: f32) {
    assert_eq!(top_ids(v)[0], id);
    let hit = &v["results"][0];
    let (score, li) = (
        hit["score"].as_f64().unwrap(),
        hit["stage2"].as_f64().unwrap(),
    );
    assert!(li > 0.99, "{v}");
    assert!((score - (li - margin as f64)).abs() < 1e-4, "{v}");
}

#[tokio::test]
async fn searches_find_the_image_itself_by_upload_features_and_id() {
    let f = fixture();
    let svc = service(&f, |_| {});
    let vit = extractor(&f.model_dir);

    let (s, v) = call_json(&svc, upload("/v1/search/image?top_k=5", &f.images[3])).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(top_ids(&v)[0], "c03");
    assert_eq!(v["results"].as_array().unwrap().len(), 5);
    let first = &v["results"][0];
    assert!(first["stage1"].as_f64().unwrap() > 0.99);
    assert!(first["stage2"].as_f64().unwrap() > 0.99);
    assert_eq!(first["crater_id"], "crater-1");
    assert_eq!(first["meta"]["lat"], 13.0);
    // rechecked by default: the best images verified, the image itself with every patch in
    // place (so not searched again; extraction and search timed as one); recheck=false
    // searches as given
    let patches = features(&vit, &f.images[3]).attention.len() as u64;
    assert_eq!(first["inliers"].as_u64(), Some(patches), "{v}");
    assert!(v["timing_ms"].get("features").is_none(), "{v}");
    let (s, v) = call_json(
        &svc,
        upload("/v1/search/image?top_k=5&recheck=false", &f.images[3]),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(top_ids(&v)[0], "c03");
    assert!(v["results"][0].get("inliers").is_none(), "{v}");
    assert!(v["timing_ms"]["features"].is_f64(), "{v}");

    // Turned by a quarter and mirrored, it is found through the variant that undoes that,
    // scored the turn margin below its late-interaction score; posted features cannot turn.
    let turned = f.images[3].with_file_name("turned.png");
    image::open(&f.images[3])
        .unwrap()
        .rotate90()
        .fliph()
        .save(&turned)
        .unwrap();
    let (s, v) = call_json(&svc, upload("/v1/search/image?top_k=1&turns=4", &turned)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_found_through_a_view(&v, "c03", craterdex_engine::TURN_MARGIN);
    let body = features_json(&vit, &f.images[7], false);
    let req = Request::post("/v1/search/features?turns=2")
        .body(Body::from(body))
        .unwrap();
    let (s, v) = call_json(&svc, req).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, _) = call_json(&svc, upload("/v1/search/image?turns=37", &turned)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    // Inverted (lit from the other side, to first order), it is found through the inverted
    // view, scored the opposite sun's margin below its late-interaction score; posted
    // features cannot be relit.
    let relit = f.images[3].with_file_name("relit.png");
    let mut im = image::open(&f.images[3]).unwrap();
    im.invert();
    im.save(&relit).unwrap();
    let (s, v) = call_json(
        &svc,
        upload("/v1/search/image?top_k=1&opposite_sun=true", &relit),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_found_through_a_view(&v, "c03", craterdex_engine::OPPOSITE_SUN_MARGIN);
    let req = Request::post("/v1/search/features?opposite_sun=true")
        .body(Body::from(features_json(&vit, &f.images[7], false)))
        .unwrap();
    let (s, v) = call_json(&svc, req).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("opposite_sun"), "{v}");

    // A rechecked search's views can be bounded per request, the query as given counted;
    // posted features are never rechecked, so the bound is moot there, as `recheck` is.
    let (s, v) = call_json(
        &svc,
        upload("/v1/search/image?top_k=1&recheck_views=1", &f.images[3]),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(top_ids(&v)[0], "c03");
    let (s, v) = call_json(
        &svc,
        upload("/v1/search/image?recheck_views=0", &f.images[3]),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("recheck_views"), "{v}");
    let req = Request::post("/v1/search/features?top_k=1&recheck_views=3")
        .body(Body::from(features_json(&vit, &f.images[7], false)))
        .unwrap();
    let (s, v) = call_json(&svc, req).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(top_ids(&v)[0], "c07");

    // Verified (by image or by posted features), the image itself comes first with every
    // patch in place; a search by id cannot verify.
    let by_features = Request::post("/v1/search/features?top_k=3&verify=3")
        .body(Body::from(features_json(&vit, &f.images[3], false)))
        .unwrap();
    for req in [
        upload("/v1/search/image?top_k=3&verify=3", &f.images[3]),
        by_features,
    ] {
        let (s, v) = call_json(&svc, req).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(top_ids(&v)[0], "c03");
        assert_eq!(v["results"][0]["inliers"].as_u64(), Some(patches), "{v}");
        let verified = v["results"].as_array().unwrap();
        assert!(verified.iter().filter(|h| h["inliers"].is_u64()).count() <= 3);
    }
    // turned and mirrored, at 4 turns: verified against the view that undoes it
    let (s, v) = call_json(&svc, upload("/v1/search/image?verify=3&turns=4", &turned)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(top_ids(&v)[0], "c03", "{v}");
    assert_eq!(v["results"][0]["inliers"].as_u64(), Some(patches), "{v}");
    let (s, v) = call_json(&svc, upload("/v1/search/image?verify=101", &turned)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, v) = call_json(&svc, get("/v1/images/c03/similar?verify=3")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("verify needs"),
        "{v}"
    );

    // The thumbnail URL it gives is served as a PNG.
    let (s, png) = call(&svc, get(first["thumbnail"].as_str().unwrap())).await;
    assert_eq!(s, StatusCode::OK);
    let thumb = image::load_from_memory(&png).unwrap();
    assert_eq!((thumb.width(), thumb.height()), (48, 48));

    for nested in [false, true] {
        let body = features_json(&vit, &f.images[7], nested);
        let req = Request::post("/v1/search/features?top_k=3&mode=exhaustive")
            .body(Body::from(body))
            .unwrap();
        let (s, v) = call_json(&svc, req).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(top_ids(&v)[0], "c07");
        assert_eq!(v["params"]["mode"], "exhaustive");
        assert!(v["results"][0]["stage1"].is_null());
    }

    // The same features as a safetensors body (what `craterdex extract` writes), f32 and f16.
    let feats = features(&vit, &f.images[9]);
    for dtype in [safetensors::Dtype::F32, safetensors::Dtype::F16] {
        let enc = |v: &[f32]| -> Vec<u8> {
            match dtype {
                safetensors::Dtype::F16 => v
                    .iter()
                    .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                    .collect(),
                _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            }
        };
        let (c, p, a) = (enc(&feats.cls), enc(&feats.patches), enc(&feats.attention));
        let t = feats.attention.len();
        let views = vec![
            (
                "cls",
                safetensors::tensor::TensorView::new(dtype, vec![1, D], &c).unwrap(),
            ),
            (
                "patch_tokens",
                safetensors::tensor::TensorView::new(dtype, vec![1, t, D], &p).unwrap(),
            ),
            (
                "attention",
                safetensors::tensor::TensorView::new(dtype, vec![1, t], &a).unwrap(),
            ),
        ];
        let body = safetensors::serialize(views, &None).unwrap();
        let req = Request::post("/v1/search/features?top_k=2")
            .header("content-type", "application/octet-stream")
            .body(Body::from(body))
            .unwrap();
        let (s, v) = call_json(&svc, req).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(top_ids(&v)[0], "c09", "{dtype:?}");
    }
    let req = Request::post("/v1/search/features")
        .header("content-type", "application/octet-stream")
        .body(Body::from(vec![9u8; 64]))
        .unwrap();
    // Any bytes are a well-formed binary body; bytes that are no safetensors file are 422.
    assert_eq!(call(&svc, req).await.0, StatusCode::UNPROCESSABLE_ENTITY);

    let (s, v) = call_json(&svc, get("/v1/images/c05/similar?top_k=4&mode=stage1")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(top_ids(&v)[0], "c05");
    assert!(v["results"][0]["stage2"].is_null());

    let (s, v) = call_json(&svc, get("/v1/images/c05")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["meta"]["diameter_km"], 1.5);

    let (s, v) = call_json(&svc, get("/v1/stats")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["images"], N);
    assert_eq!(v["tokens_per_image"], 4);
    // two verified, one relit, one not rechecked, one bounded (the refused one not counted)
    assert_eq!(v["requests"]["image_searches"], 7);
    assert_eq!(v["requests"]["searches"], 7); // one verified, one bounded (moot)
    assert_eq!(v["writes_enabled"], false);
}

/// Where the server keeps images is its own business: no file path in a search hit or an
/// image's metadata unless the operator asks for them.
#[tokio::test]
async fn responses_show_no_server_paths_unless_asked() {
    let f = fixture();
    for expose in [false, true] {
        let svc = service(&f, |c| c.expose_paths = expose);
        let (s, hits) = call_json(&svc, upload("/v1/search/image?top_k=3", &f.images[1])).await;
        assert_eq!(s, StatusCode::OK, "{hits}");
        let (s, meta) = call_json(&svc, get("/v1/images/c01")).await;
        assert_eq!(s, StatusCode::OK, "{meta}");
        let (s, similar) = call_json(&svc, get("/v1/images/c01/similar?top_k=3")).await;
        assert_eq!(s, StatusCode::OK, "{similar}");
        for body in [&hits, &meta, &similar] {
            let text = body.to_string();
            assert_eq!(
                text.contains(&f.root.display().to_string()),
                expose,
                "expose_paths {expose}: {text}"
            );
        }
        assert_eq!(hits["results"][0]["meta"]["path"].is_string(), expose);
    }
}

/// A browser cannot be made to use the server from elsewhere: a page of another site that
/// rebinds its name to the server's address names its own host (421), and a form or script of
/// another site that posts an image (or changes anything) is refused before its body is read
/// (403); programs and the server's own page pass. Every response forbids sniffing and
/// framing; the page runs only its own script and style, named by hash.
#[tokio::test]
async fn browsers_of_other_sites_are_refused_and_responses_say_what_browsers_may_do() {
    let f = fixture();
    let svc = service(&f, |c| {
        c.allowed_hosts = Some(craterdex_serve::LOOPBACK_HOSTS.map(String::from).to_vec())
    });
    let with = |req: axum::http::request::Builder, headers: &[(&str, &str)]| {
        headers
            .iter()
            .fold(req, |r, (k, v)| r.header(*k, *v))
            .body(Body::empty())
            .unwrap()
    };
    for (host, want) in [
        ("evil.example", StatusCode::MISDIRECTED_REQUEST),
        ("evil.example:8080", StatusCode::MISDIRECTED_REQUEST),
        ("localhost:8080", StatusCode::OK),
        ("127.0.0.1:8080", StatusCode::OK),
        ("[::1]:8080", StatusCode::OK),
    ] {
        let (s, v) = call_json(&svc, with(Request::get("/v1/stats"), &[("host", host)])).await;
        assert_eq!(s, want, "{host}: {v}");
    }
    // a multipart image search from another site's page: refused before the body is read
    let img = std::fs::read(&f.images[1]).unwrap();
    let form = multipart(&[("image", Some("q.png"), &img)]);
    let post = |headers: &[(&str, &str)], body: Vec<u8>| {
        let r = Request::post("/v1/search/image").header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        );
        headers
            .iter()
            .fold(r, |r, (k, v)| r.header(*k, *v))
            .body(Body::from(body))
            .unwrap()
    };
    let host = ("host", "127.0.0.1:8080");
    for refused in [
        vec![host, ("origin", "http://evil.example")],
        vec![host, ("origin", "null")],
        vec![host, ("sec-fetch-site", "cross-site")],
        vec![host, ("sec-fetch-site", "same-site")],
    ] {
        let (s, v) = call_json(&svc, post(&refused, b"never read".to_vec())).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{refused:?}: {v}");
    }
    for allowed in [
        vec![host],
        vec![host, ("origin", "http://127.0.0.1:8080")],
        vec![
            host,
            ("sec-fetch-site", "same-origin"),
            ("origin", "http://127.0.0.1:8080"),
        ],
    ] {
        let (s, v) = call_json(&svc, post(&allowed, form.clone())).await;
        assert_eq!(s, StatusCode::OK, "{allowed:?}: {v}");
    }
    // what browsers may do with every response
    let page = router(svc.clone()).oneshot(get("/")).await.unwrap();
    let api = router(svc.clone()).oneshot(get("/v1/stats")).await.unwrap();
    for resp in [&page, &api] {
        assert_eq!(resp.headers()["x-content-type-options"], "nosniff");
        assert_eq!(resp.headers()["x-frame-options"], "DENY");
    }
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'sha256-") && !csp.contains("unsafe"),
        "{csp}"
    );
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(
        api.headers()["content-security-policy"],
        "default-src 'none'; frame-ancestors 'none'"
    );
}

/// /metrics in the Prometheus text format: requests by route template (never the raw path),
/// method and status, latency histograms, slots and the work holding them, the index's
/// images and segments.
#[tokio::test]
async fn metrics_count_requests_by_route_and_status_in_the_prometheus_format() {
    let f = fixture();
    let svc = service(&f, |_| {});
    for uri in [
        "/v1/images/c01/similar",
        "/v1/images/c02/similar",
        "/v1/images/nope/similar",
    ] {
        call(&svc, get(uri)).await;
    }
    let resp = router(svc.clone()).oneshot(get("/metrics")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let text = String::from_utf8(
        axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap()
            .to_vec(),
    )
    .unwrap();
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{series} missing:\n{text}"))
    };
    let similar = r#"route="/v1/images/{id}/similar",method="GET""#;
    assert_eq!(
        value(&format!(
            "craterdex_http_requests_total{{{similar},status=\"200\"}}"
        )),
        2.0
    );
    assert_eq!(
        value(&format!(
            "craterdex_http_requests_total{{{similar},status=\"404\"}}"
        )),
        1.0
    );
    assert_eq!(
        value(r#"craterdex_http_request_duration_seconds_count{route="/v1/images/{id}/similar"}"#),
        3.0
    );
    assert!(text.contains(r#"craterdex_http_request_duration_seconds_bucket{le="0.001",route="/v1/images/{id}/similar"}"#)
        || text.contains(r#"craterdex_http_request_duration_seconds_bucket{route="/v1/images/{id}/similar",le="0.001"}"#), "{text}");
    assert!(!text.contains("c01"), "raw paths are no labels");
    assert_eq!(value(r#"craterdex_work_slots{group="image"}"#), 8.0);
    assert_eq!(value(r#"craterdex_work_in_flight{group="image"}"#), 0.0);
    assert_eq!(value("craterdex_index_images"), N as f64);
    assert_eq!(value("craterdex_index_segments"), 1.0);
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
}

#[tokio::test]
async fn health_readiness_page_and_every_documented_route() {
    let f = fixture();
    let c = Config::new(f.index.clone());
    let svc = Service::new(c);
    // Not loaded yet: alive but not ready, searches refused with 503.
    assert_eq!(call(&svc, get("/v1/health")).await.0, StatusCode::OK);
    let (s, v) = call_json(&svc, get("/v1/ready")).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(v["ready"], false);
    assert_eq!(
        call(&svc, get("/v1/stats")).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    svc.load(None).unwrap();
    let (s, v) = call_json(&svc, get("/v1/ready")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["image_search"], false);
    // Without a model, image search says so.
    let (s, v) = call_json(&svc, upload("/v1/search/image", &f.images[0])).await;
    assert_eq!(s, StatusCode::NOT_IMPLEMENTED, "{v}");

    let (s, page) = call(&svc, get("/")).await;
    assert_eq!(s, StatusCode::OK);
    let page = String::from_utf8(page).unwrap();
    assert!(page.contains("/v1/search/image"));
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "external assets"
    );

    let (s, doc) = call_json(&svc, get("/v1/openapi.json")).await;
    assert_eq!(s, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let mut checked = 0;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            let uri = path.replace("{id}", "c01");
            let req = Request::builder()
                .method(method.to_uppercase().as_str())
                .uri(&uri)
                .body(Body::empty())
                .unwrap();
            let (s, body) = call(&svc, req).await;
            let body = String::from_utf8_lossy(&body);
            assert!(
                s != StatusCode::METHOD_NOT_ALLOWED && !body.contains("no such endpoint"),
                "{method} {path} is documented but not routed ({s})"
            );
            checked += 1;
        }
    }
    assert!(checked >= 11, "{checked}");
    // The document states this server's limits and its index's feature width.
    let params = |path: &str| doc["paths"][path]["get"]["parameters"].as_array().cloned();
    let top_k = params("/v1/images/{id}/similar")
        .unwrap()
        .into_iter()
        .find(|p| p["name"] == "top_k")
        .unwrap();
    assert_eq!(top_k["schema"]["maximum"], 1000);
    assert!(
        params("/v1/health").is_none(),
        "no parameters: the key stays absent"
    );
    let cls = &doc["components"]["schemas"]["Features"]["properties"]["cls"];
    assert_eq!((&cls["minItems"], &cls["maxItems"]), (&json!(D), &json!(D)));
    let (s, v) = call_json(&svc, get("/v2/nothing")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(v["error"]["message"].as_str().unwrap().contains("openapi"));
}

#[tokio::test]
async fn bad_requests_get_clear_4xx_errors() {
    let f = fixture();
    let svc = service(&f, |c| {
        c.max_image_side = 64;
        c.max_upload_bytes = 64 << 10;
    });
    let status = |r: (StatusCode, Value)| {
        assert!(
            r.1["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{}",
            r.1
        );
        r.0
    };
    // Not an image, corrupt image, too many pixels, too many bytes.
    let text = post_multipart(
        "/v1/search/image",
        multipart(&[("image", Some("x.png"), b"hello world")]),
        None,
    );
    assert_eq!(
        status(call_json(&svc, text).await),
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    let mut png = std::fs::read(&f.images[0]).unwrap();
    png.truncate(png.len() / 2);
    let cut = post_multipart(
        "/v1/search/image",
        multipart(&[("image", Some("x.png"), &png)]),
        None,
    );
    assert_eq!(
        status(call_json(&svc, cut).await),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    // a JPEG cut short decodes "fine" in the image crate; the service refuses it by name
    let img = image::open(&f.images[0]).unwrap();
    let mut jpeg = std::io::Cursor::new(Vec::new());
    img.write_to(&mut jpeg, image::ImageFormat::Jpeg).unwrap();
    let mut jpeg = jpeg.into_inner();
    jpeg.truncate(jpeg.len() * 2 / 3);
    let cut = post_multipart(
        "/v1/search/image",
        multipart(&[("image", Some("x.jpg"), &jpeg)]),
        None,
    );
    let (code, body) = call_json(&svc, cut).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("truncated or corrupt JPEG"),
        "{body}"
    );
    let big = f.root.join("big.png");
    write_image(&big, 99, 100);
    assert_eq!(
        status(call_json(&svc, upload("/v1/search/image", &big)).await),
        StatusCode::PAYLOAD_TOO_LARGE
    );
    let huge = vec![7u8; 80 << 10];
    let req = post_multipart(
        "/v1/search/image",
        multipart(&[("image", Some("x.png"), &huge)]),
        None,
    );
    assert_eq!(
        status(call_json(&svc, req).await),
        StatusCode::PAYLOAD_TOO_LARGE
    );
    // Every error is the documented JSON, the framework's own too: a body over the limit
    // where the service reads raw bytes, a method an endpoint does not take (with Allow)
    let over = vec![b' '; svc.config().max_upload_bytes + 1];
    let req = Request::post("/v1/search/features")
        .header("content-type", "application/octet-stream")
        .body(Body::from(over))
        .unwrap();
    let (s, v) = call_json(&svc, req).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_eq!(v["error"]["status"], 413, "{v}");
    let wrong = router(svc.clone())
        .oneshot(
            Request::delete("/v1/search/features")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(wrong.headers()["allow"], "POST");
    let body = axum::body::to_bytes(wrong.into_body(), 1 << 16)
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["status"], 405, "{v}");
    // Malformed multipart, no image part, not multipart at all.
    let req = post_multipart("/v1/search/image", b"--nonsense\r\ngarbage".to_vec(), None);
    assert_eq!(status(call_json(&svc, req).await), StatusCode::BAD_REQUEST);
    let req = post_multipart(
        "/v1/search/image",
        multipart(&[("note", None, b"hi")]),
        None,
    );
    assert_eq!(status(call_json(&svc, req).await), StatusCode::BAD_REQUEST);
    let req = Request::post("/v1/search/image")
        .body(Body::from("x"))
        .unwrap();
    assert_eq!(status(call_json(&svc, req).await), StatusCode::BAD_REQUEST);
    // Bad JSON, wrong shapes, bad parameters.
    for (body, want) in [
        ("{not json", StatusCode::BAD_REQUEST),
        (r#"{"cls": [1, 2]}"#, StatusCode::BAD_REQUEST),
        (
            r#"{"cls": [1], "patches": [1], "attention": [1], "extra": 1}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            r#"{"cls": [1, 2], "patches": [1, 2], "attention": [1]}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ] {
        let req = Request::post("/v1/search/features")
            .body(Body::from(body))
            .unwrap();
        assert_eq!(status(call_json(&svc, req).await), want, "{body}");
    }
    // declared binary, merely starting like JSON: unusable content, as the schema allows any
    // bytes there (found by schemathesis)
    let req = Request::post("/v1/search/features")
        .header("content-type", "application/octet-stream")
        .body(Body::from("{"))
        .unwrap();
    assert_eq!(
        status(call_json(&svc, req).await),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let ones = vec![0.5f32; D];
    let body = json!({"cls": ones, "patches": vec![0.5f32; 3 * D], "attention": [1.0, 1.0]});
    let req = Request::post("/v1/search/features")
        .body(Body::from(body.to_string()))
        .unwrap();
    assert_eq!(
        status(call_json(&svc, req).await),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    for q in [
        "top_k=0",
        "top_k=abc",
        "mode=fast",
        "shortlist=0",
        "colour=red",
        "top_k=100000",
    ] {
        let (s, _) = call_json(&svc, get(&format!("/v1/images/c01/similar?{q}"))).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}");
    }
    // Ids: traversal attempts are refused before any lookup; unknown ids are 404.
    for id in [
        "..%2F..%2Fetc%2Fpasswd",
        "%2Fetc%2Fpasswd",
        "a%2F..%2Fb",
        "a%20b",
    ] {
        let (s, _) = call_json(&svc, get(&format!("/v1/images/{id}/thumbnail"))).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{id}");
    }
    assert_eq!(
        status(call_json(&svc, get("/v1/images/nope")).await),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        status(call_json(&svc, get("/v1/images/nope/similar")).await),
        StatusCode::NOT_FOUND
    );
    let (s, v) = call_json(&svc, get("/v1/stats")).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        v["requests"]["client_errors"].as_u64().unwrap() >= 10,
        "{v}"
    );
}

#[tokio::test]
async fn writes_need_the_key_persist_and_are_seen_whole() {
    let f = fixture();
    let svc = service(&f, |c| c.api_key = Some("s3cret".into()));
    let img = std::fs::read(&f.images[N]).unwrap();
    let form = |id: &str| {
        multipart(&[
            ("image", Some("new.png"), &img),
            ("id", None, id.as_bytes()),
            ("crater_id", None, b"crater-new"),
            ("lat", None, b"-4.25"),
            ("diameter_km", None, b"0.8"),
        ])
    };
    for key in [None, Some("wrong")] {
        let (s, _) = call_json(&svc, post_multipart("/v1/images", form("n1"), key)).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
    }
    let (s, v) = call_json(
        &svc,
        post_multipart("/v1/images", form("n1"), Some("s3cret")),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["images"], N + 1);
    let (s, _) = call_json(
        &svc,
        post_multipart("/v1/images", form("n1"), Some("s3cret")),
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT);
    let bad = multipart(&[("image", Some("new.png"), &img), ("lat", None, b"north")]);
    let (s, _) = call_json(&svc, post_multipart("/v1/images", bad, Some("s3cret"))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let bad = multipart(&[("image", Some("new.png"), &img), ("lat", None, b"91")]);
    let (s, v) = call_json(&svc, post_multipart("/v1/images", bad, Some("s3cret"))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("lat 91.0 is out of range"));
    // A trailing control character is refused, not trimmed away (found by schemathesis).
    let bad = multipart(&[
        ("image", Some("new.png"), &img),
        ("source", None, "\u{f5}\x0c".as_bytes()),
    ]);
    let (s, v) = call_json(&svc, post_multipart("/v1/images", bad, Some("s3cret"))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");

    // Searchable at once, with its metadata and a thumbnail of the stored upload.
    let (s, v) = call_json(&svc, upload("/v1/search/image?top_k=3", &f.images[N])).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(top_ids(&v)[0], "n1");
    assert_eq!(v["results"][0]["meta"]["lat"], -4.25);
    let (s, _) = call(&svc, get("/v1/images/n1/thumbnail?size=32")).await;
    assert_eq!(s, StatusCode::OK);
    // Durable: a fresh open of the directory has it.
    let reopened = Index::open(&f.index).unwrap();
    assert!(reopened.row_of("n1").is_some());

    // Removal.
    let del = |key: Option<&str>| {
        let mut r = Request::delete("/v1/images/c02");
        if let Some(k) = key {
            r = r.header("authorization", format!("Bearer {k}"));
        }
        r.body(Body::empty()).unwrap()
    };
    assert_eq!(call(&svc, del(None)).await.0, StatusCode::UNAUTHORIZED);
    let (s, v) = call_json(&svc, del(Some("s3cret"))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["images"], N);
    // schemes are case-insensitive: a lowercase bearer is the same key
    let lower = Request::delete("/v1/images/c03")
        .header("authorization", "bearer s3cret")
        .body(Body::empty())
        .unwrap();
    let (s, v) = call_json(&svc, lower).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["images"], N - 1);
    assert_eq!(
        call(&svc, del(Some("s3cret"))).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(&svc, get("/v1/images/c02")).await.0,
        StatusCode::NOT_FOUND
    );
    let (_, v) = call_json(
        &svc,
        upload("/v1/search/image?top_k=13&mode=exhaustive", &f.images[2]),
    )
    .await;
    assert!(!top_ids(&v).contains(&"c02".to_string()));
    assert!(!top_ids(&v).contains(&"c03".to_string()));
    let reopened = Index::open(&f.index).unwrap();
    assert!(reopened.row_of("c02").is_none() && reopened.was_removed("c02"));
    let again = multipart(&[("image", Some("c02.png"), &img), ("id", None, b"c02")]);
    let (s, v) = call_json(&svc, post_multipart("/v1/images", again, Some("s3cret"))).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");

    // Searches running while images are added each see a whole index: N or N+1 images,
    // never an error.
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                for _ in 0..20 {
                    let (s, v) =
                        call_json(&svc, get("/v1/images/c01/similar?top_k=20&mode=exhaustive"))
                            .await;
                    assert_eq!(s, StatusCode::OK, "{v}");
                    seen.push(v["results"].as_array().unwrap().len());
                }
                seen
            })
        })
        .collect();
    let (s, v) = call_json(
        &svc,
        post_multipart("/v1/images", form("n2"), Some("s3cret")),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    for r in readers {
        for n in r.await.unwrap() {
            assert!(n == N - 1 || n == N, "{n}");
        }
    }
    assert!(Index::open(&f.index).unwrap().row_of("n2").is_some());

    // n1 and n2 share one stored upload (the same bytes): removing one keeps the file, the
    // other's removal deletes it
    let uploads = || {
        std::fs::read_dir(svc.config().upload_dir.clone())
            .unwrap()
            .count()
    };
    assert_eq!(uploads(), 1);
    let remove = |id: &str| {
        Request::delete(format!("/v1/images/{id}"))
            .header("x-api-key", "s3cret")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(call(&svc, remove("n1")).await.0, StatusCode::OK);
    assert_eq!(uploads(), 1);
    let (_, png) = call(&svc, get("/v1/images/n2/thumbnail?size=16")).await;
    assert!(png.starts_with(b"\x89PNG"));
    assert_eq!(call(&svc, remove("n2")).await.0, StatusCode::OK);
    assert_eq!(uploads(), 0);
    // images the operator indexed stay where they are
    assert_eq!(call(&svc, remove("c04")).await.0, StatusCode::OK);
    assert!(f.images[4].exists());
}

#[tokio::test]
async fn without_a_key_writes_are_off_and_protected_reads_need_it() {
    let f = fixture();
    let svc = service(&f, |_| {});
    let img = std::fs::read(&f.images[N]).unwrap();
    let req = post_multipart(
        "/v1/images",
        multipart(&[("image", Some("a.png"), &img)]),
        Some("any"),
    );
    assert_eq!(call(&svc, req).await.0, StatusCode::FORBIDDEN);
    let svc = service(&f, |c| {
        c.api_key = Some("k".into());
        c.protect_reads = true;
    });
    assert_eq!(
        call(&svc, get("/v1/stats")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let req = Request::get("/v1/stats")
        .header("x-api-key", "k")
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&svc, req).await.0, StatusCode::OK);
    // Health and readiness stay open for probes.
    assert_eq!(call(&svc, get("/v1/ready")).await.0, StatusCode::OK);
}

/// Sends a request over a real socket; `hold` keeps the body unfinished until it is dropped.
fn raw_request(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    s
}

fn read_status(s: std::net::TcpStream) -> u16 {
    read_response(s).0
}

/// A response read to its end: status and body.
fn read_response(mut s: std::net::TcpStream) -> (u16, String) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
    (status, body.unwrap_or_default())
}

fn partial_post(addr: std::net::SocketAddr) -> std::net::TcpStream {
    raw_request(
        addr,
        "POST /v1/search/features HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 100\r\n\r\n",
        b"{\"cls\": [",
    )
}

fn simple_get(addr: std::net::SocketAddr, path: &str) -> u16 {
    read_status(raw_request(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        b"",
    ))
}

/// `svc` served over a real socket on loopback within `max_connections` and
/// `header_timeout`: its address, what stops it, and the server's task.
async fn serve_on_socket(
    svc: &Arc<Service>,
    max_connections: usize,
    header_timeout: Duration,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = craterdex_serve::connections::ConnectionLimits {
        max_connections,
        header_timeout,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(craterdex_serve::connections::serve(
        listener,
        router(svc.clone()),
        limits,
        async move {
            let _ = stopped.await;
        },
    ));
    (addr, stop, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_shedding_timeouts_and_graceful_shutdown_over_sockets() {
    let f = fixture();
    let svc = service(&f, |c| {
        c.max_concurrent = 1;
        c.request_timeout = Duration::from_millis(1500);
    });
    let (addr, stop, server) = serve_on_socket(&svc, 64, Duration::from_secs(10)).await;
    let blocking = |f: Box<dyn FnOnce() -> u16 + Send>| tokio::task::spawn_blocking(f);

    // One slow request holds the only slot: the next search is shed with 503 at once, while
    // health stays answerable.
    let slow = blocking(Box::new(move || {
        let s = partial_post(addr);
        std::thread::sleep(Duration::from_millis(400));
        let mut s2 = s.try_clone().unwrap();
        // Complete the body: 9 bytes sent, 91 to go (an invalid document -> 400).
        s2.write_all(&[b' '; 91]).unwrap();
        read_status(s)
    }));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        blocking(Box::new(move || simple_get(addr, "/v1/stats")))
            .await
            .unwrap(),
        503
    );
    assert_eq!(
        blocking(Box::new(move || simple_get(addr, "/v1/health")))
            .await
            .unwrap(),
        200
    );
    assert_eq!(slow.await.unwrap(), 400);
    assert_eq!(
        blocking(Box::new(move || simple_get(addr, "/v1/stats")))
            .await
            .unwrap(),
        200
    );

    // A body that never completes times out with 408, answered as the documented JSON.
    let timed_out = tokio::task::spawn_blocking(move || read_response(partial_post(addr)));
    let (status, body) = timed_out.await.unwrap();
    assert_eq!(status, 408);
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(v["error"]["status"], 408, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("timeout"),
        "{v}"
    );

    // Shutdown waits for the request in flight, which still gets its answer.
    let in_flight = blocking(Box::new(move || {
        let s = partial_post(addr);
        std::thread::sleep(Duration::from_millis(500));
        s.try_clone().unwrap().write_all(&[b' '; 91]).unwrap();
        read_status(s)
    }));
    tokio::time::sleep(Duration::from_millis(150)).await;
    stop.send(()).unwrap();
    assert_eq!(in_flight.await.unwrap(), 400);
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server did not stop")
        .unwrap();
}

/// Whether the server has closed `s` (or answered and closed it) within `wait`: a read that
/// returns, rather than one still waiting when the wait is up. How much it read does not
/// matter: an answer or an end are both the server's doing.
#[allow(clippy::unused_io_amount)]
fn closed_within(s: &mut std::net::TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut b = [0u8; 256];
    match s.read(&mut b) {
        Ok(_) => true,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// Idle and half-sent connections are closed after the header timeout, connections past
/// the limit are closed as they come, and 500 idle connections do not delay readiness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_do_not_crowd_out_requests() {
    let f = fixture();
    let svc = service(&f, |_| {});
    let (addr, stop, server) = serve_on_socket(&svc, 600, Duration::from_millis(1500)).await;
    let result = tokio::task::spawn_blocking(move || {
        // 500 connections that send nothing, and one that sends half a request head
        let mut idle: Vec<std::net::TcpStream> = (0..500)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let mut half = std::net::TcpStream::connect(addr).unwrap();
        half.write_all(b"GET /v1/stats HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let t = std::time::Instant::now();
        assert_eq!(simple_get(addr, "/v1/ready"), 200);
        let ready = t.elapsed();
        assert!(ready < Duration::from_millis(500), "{ready:?}");
        // past the header timeout, every one of them is closed by the server
        std::thread::sleep(Duration::from_millis(1600));
        let mut open = 0;
        for s in idle.iter_mut().chain(std::iter::once(&mut half)) {
            open += usize::from(!closed_within(s, Duration::from_millis(20)));
        }
        open
    })
    .await
    .unwrap();
    assert_eq!(result, 0, "{result} connections still open");
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap();

    // one connection over the limit is closed at once, while those within are served
    let (addr, stop, server) = serve_on_socket(&svc, 4, Duration::from_secs(30)).await;
    tokio::task::spawn_blocking(move || {
        let held: Vec<std::net::TcpStream> = (0..4)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut extra = std::net::TcpStream::connect(addr).unwrap();
        assert!(closed_within(&mut extra, Duration::from_secs(2)));
        drop(held);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(simple_get(addr, "/v1/health"), 200);
    })
    .await
    .unwrap();
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn run_reports_an_unreadable_index_and_stops() {
    let tmp = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let svc = Service::new(Config::new(tmp.path().join("missing")));
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        craterdex_serve::run(listener, svc, Box::new(|| Ok(None)), std::future::pending()),
    )
    .await
    .expect("run did not stop");
    let e = format!("{:#}", r.unwrap_err());
    assert!(e.contains("missing"), "{e}");
}

#[tokio::test]
async fn link_decides_and_inserts_only_with_the_key_and_only_once() {
    let f = fixture();
    let svc = service(&f, |c| c.api_key = Some("s3cret".into()));
    // an indexed image links to itself... or to its other view, which is the same crater
    let known = std::fs::read(&f.images[3]).unwrap();
    let form = |img: &[u8], id: &str| {
        multipart(&[("image", Some("x.png"), img), ("id", None, id.as_bytes())])
    };
    let (s, v) = call_json(&svc, post_multipart("/v1/link", form(&known, "k3"), None)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["inserted"], false);
    assert!(["match", "new", "ambiguous"].contains(&v["decision"].as_str().unwrap()));
    let best = &v["best"];
    assert!(best["score"].as_f64().unwrap() > 0.99, "{v}");
    assert!(best["thumbnail"]
        .as_str()
        .unwrap()
        .starts_with("/v1/images/"));
    assert!(v["rule"].as_str().unwrap().starts_with("default"));
    // inserting needs the key; unknown query parameters are refused
    let (s, _) = call_json(
        &svc,
        post_multipart("/v1/link?insert=true", form(&known, "k3"), None),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = call_json(
        &svc,
        post_multipart("/v1/link?inserted=true", form(&known, "k3"), Some("s3cret")),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // a new image: inserted exactly when decided new, and a second identical call adds nothing
    let fresh = std::fs::read(&f.images[N]).unwrap();
    let (s, v) = call_json(
        &svc,
        post_multipart("/v1/link?insert=true", form(&fresh, "l1"), Some("s3cret")),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let inserted = v["inserted"].as_bool().unwrap();
    assert_eq!(inserted, v["decision"] == "new", "{v}");
    assert_eq!(v["images"], N + inserted as usize);
    assert_eq!(
        Index::open(&f.index).unwrap().row_of("l1").is_some(),
        inserted
    );
    let (s, v) = call_json(
        &svc,
        post_multipart("/v1/link?insert=true", form(&fresh, "l1"), Some("s3cret")),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["inserted"], false, "{v}");
    assert_eq!(v["images"], N + inserted as usize);
    if inserted {
        assert_eq!(v["best"]["id"], "l1", "{v}");
    }
}

/// The fixture with its index replaced by an irregular field of 40 craters on the body (a
/// pattern to register), each crop one of the fixture's images.
fn field_fixture() -> (Fixture, Vec<(f64, f64, f64)>) {
    let mut f = fixture();
    let vit = extractor(&f.model_dir);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    let field: Vec<(f64, f64, f64)> = (0..40)
        .map(|_| {
            (
                10.0 + rng.gen_range(0.0..1.0),
                -20.0 + rng.gen_range(0.0..1.0),
                1.0 * (1.0 - rng.gen_range(0.0..0.9f64)).powf(-0.6),
            )
        })
        .collect();
    let encoder = Index::open(&f.index).unwrap().encoder.clone();
    let entries: Vec<(ImageMeta, craterdex_tokens::Descriptors)> = field
        .iter()
        .enumerate()
        .map(|(i, &(lat, lon, d))| {
            let p = &f.images[i % f.images.len()];
            let desc = descriptors(&vit, &encoder, p);
            let meta = ImageMeta {
                id: format!("f{i:02}"),
                crater_id: Some(format!("crater-{i}")),
                source: Some("obs1".into()),
                lat: Some(lat),
                lon: Some(lon),
                diameter_km: Some(d),
                path: Some(p.display().to_string()),
                ..Default::default()
            };
            (meta, desc)
        })
        .collect();
    let codec = TokenCodec::train(Codec::F16, D, &[], 0).unwrap();
    f.index = f.root.join("field-idx");
    Index::create(
        &f.index,
        &encoder,
        &codec,
        Some(vit.fingerprint()),
        &entries,
        None,
    )
    .unwrap();
    (f, field)
}

#[tokio::test]
async fn a_registered_source_places_its_linked_crops() {
    let (f, field) = field_fixture();
    let svc = service(&f, |_| {});
    // the second image: turned by 40 degrees about the field's centre, 0.05 degrees (about
    // three km, one to five radii) north
    let turn = 40f64.to_radians();
    let seen = |&(lat, lon, d): &(f64, f64, f64)| {
        let (y, x) = (lat - 10.5, lon + 19.5);
        (
            10.55 + x * turn.sin() + y * turn.cos(),
            -19.5 + x * turn.cos() - y * turn.sin(),
            d,
        )
    };
    let craters: Vec<Value> = field
        .iter()
        .map(|c| {
            let (lat, lon, d) = seen(c);
            json!({"lat": lat, "lon": lon, "diameter_km": d})
        })
        .collect();
    let post = |body: Value| {
        Request::post("/v1/register")
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let (s, v) = call_json(&svc, post(json!({"source": "obs2", "craters": craters}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["registered"], true, "{v}");
    assert!(
        (v["rotation_deg"].as_f64().unwrap().abs() - 40.0).abs() < 1.0,
        "{v}"
    );
    assert!(v["inliers"].as_u64().unwrap() >= 38, "{v}");
    // a crop of that image, linked with its source: placed by the transform
    let k = 17;
    let (lat, lon, d) = seen(&field[k]);
    let crop = std::fs::read(&f.images[k % f.images.len()]).unwrap();
    let link = |source: &str| {
        let (lat, lon, d) = (lat.to_string(), lon.to_string(), d.to_string());
        let body = multipart(&[
            ("image", Some("x.png"), &crop),
            ("id", None, b"new17"),
            ("source", None, source.as_bytes()),
            ("lat", None, lat.as_bytes()),
            ("lon", None, lon.as_bytes()),
            ("diameter_km", None, d.as_bytes()),
        ]);
        post_multipart("/v1/link", body, None)
    };
    let (s, v) = call_json(&svc, link("obs2")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["registered"], true, "{v}");
    assert_eq!(v["registration"]["source"], "obs2");
    assert_eq!(v["best"]["crater_id"], format!("crater-{k}"), "{v}");
    assert!(v["best"]["offset_radii"].as_f64().unwrap() < 0.3, "{v}");
    // the same crop from an image never registered: its position as given, far off
    let (s, v) = call_json(&svc, link("obs3")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["registered"], false, "{v}");
    assert!(v["registration"].is_null());
    assert!(
        v["best"]["crater_id"] != format!("crater-{k}")
            || v["best"]["offset_radii"].as_f64().is_none_or(|o| o > 1.0),
        "{v}"
    );
    // bad requests name the problem
    let (s, v) = call_json(
        &svc,
        post(json!({"source": "obs4", "craters": [{"lat": 1.0}]})),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("craters[0]"),
        "{v}"
    );
    let (s, _) = call_json(&svc, post(json!({"craters": []}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    // finite but off the body: refused by name, never an origin of infinity (null in JSON)
    let far = json!({"lat": -1.7e308, "lon": 3.0, "diameter_km": 2.0});
    let (s, v) = call_json(
        &svc,
        post(json!({"source": "obs5", "craters": [far.clone(), far]})),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("craters[0]: lat"), "{v}");

    // a registration that fails never replaces one that succeeded: obs2 still places its crop
    let lost: Vec<Value> = (0..6)
        .map(|i| json!({"lat": -60.0 + i as f64 * 0.01, "lon": 100.0, "diameter_km": 1.0}))
        .collect();
    let (s, v) = call_json(&svc, post(json!({"source": "obs2", "craters": lost}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["registered"], false, "{v}");
    let (s, v) = call_json(&svc, link("obs2")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["registered"], true, "{v}");
    assert_eq!(v["best"]["crater_id"], format!("crater-{k}"), "{v}");
}

/// A registration changes what the server keeps: with a write key, it needs the key, checked
/// before the body is read.
#[tokio::test]
async fn registering_needs_the_write_key_where_there_is_one() {
    let (f, field) = field_fixture();
    let svc = service(&f, |c| c.api_key = Some("s3cret".into()));
    let craters: Vec<Value> = field
        .iter()
        .map(|&(lat, lon, d)| json!({"lat": lat, "lon": lon, "diameter_km": d}))
        .collect();
    let post = |key: Option<&str>, body: String| {
        let mut r = Request::post("/v1/register").header("content-type", "application/json");
        if let Some(k) = key {
            r = r.header("x-api-key", k);
        }
        r.body(Body::from(body)).unwrap()
    };
    let body = json!({"source": "obs2", "craters": craters}).to_string();
    assert_eq!(
        call(&svc, post(None, body.clone())).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(&svc, post(Some("wrong"), body.clone())).await.0,
        StatusCode::UNAUTHORIZED
    );
    // refused before the (here malformed) body is read
    assert_eq!(
        call(&svc, post(None, "{not json".into())).await.0,
        StatusCode::UNAUTHORIZED
    );
    let (s, v) = call_json(&svc, post(Some("s3cret"), body)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["registered"], true, "{v}");
}

/// `POST /v1/link/image`: a whole image's craters found by the server's detector and linked
/// (here a catalogue on the body, which an image's pixel pattern cannot register to: linked
/// by appearance, and the answer says so); without a detector the route answers 501.
#[tokio::test]
async fn a_whole_image_is_detected_and_linked_where_the_server_has_a_detector() {
    let f = fixture();
    const DISCS: [(f64, f64, f64); 3] =
        [(40.0, 50.0, 14.0), (150.0, 70.0, 22.0), (90.0, 140.0, 30.0)];
    let g = craterdex_detect::testing::discs(200, 180, &DISCS);
    let png = f.root.join("scene.png");
    image::GrayImage::from_raw(200, 180, g.pixels)
        .unwrap()
        .save(&png)
        .unwrap();
    let without = service(&f, |_| {});
    let (s, v) = call_json(&without, upload("/v1/link/image", &png)).await;
    assert_eq!(s, StatusCode::NOT_IMPLEMENTED, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--detector"));

    let (config, weights) = craterdex_detect::testing::brightness_detector(24);
    let dir = f.root.join("bright");
    craterdex_detect::write_detector_dir(&dir, config, &weights).unwrap();
    let svc = service(&f, |c| c.detector = Some(dir.clone()));
    let (s, v) = call_json(&svc, upload("/v1/link/image", &png)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let craters = v["craters"].as_array().unwrap();
    assert_eq!(craters.len(), DISCS.len(), "{v}");
    for (x, y, d) in DISCS {
        let found = craters.iter().any(|c| {
            let at = |k: &str| c[k].as_f64().unwrap();
            (at("x") - x).hypot(at("y") - y) < 0.1 * d + 1.0 && c["found_by"] == "detector"
        });
        assert!(found, "disc ({x}, {y}, {d}) not in {v}");
    }
    assert!(
        craters.iter().all(|c| c["best"]["thumbnail"].is_string()),
        "{v}"
    );
    let image = &v["image"];
    assert_eq!(
        (image["width"].as_u64(), image["detections"].as_u64()),
        (Some(200), Some(3))
    );
    assert!(
        image["note"].as_str().unwrap().contains("appearance alone"),
        "{v}"
    );
    // not registered: what matches nothing is not claimed new
    assert!(craters.iter().all(|c| c["decision"] != "new"), "{v}");
    // by default the detector runs at this CPU's fastest precision
    let default = craterdex_detect::default_precision().name();
    assert_eq!(
        (&v["detector"], &v["detector_precision"]),
        (
            &serde_json::json!("brightness"),
            &serde_json::json!(default)
        )
    );
    // in f32 (`serve --detector-precision f32`) it finds the same craters
    let other = if default == "f32" { "int8" } else { "f32" };
    let at_other = service(&f, |c| {
        c.detector = Some(dir.clone());
        c.detector_precision = other.parse().unwrap();
    });
    let (s, w) = call_json(&at_other, upload("/v1/link/image", &png)).await;
    assert_eq!(s, StatusCode::OK, "{w}");
    assert_eq!(w["detector_precision"], other, "{w}");
    let centres = |v: &serde_json::Value| -> Vec<(i64, i64)> {
        let mut c: Vec<_> = v["craters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let at = |k: &str| c[k].as_f64().unwrap().round() as i64;
                (at("x"), at("y"))
            })
            .collect();
        c.sort();
        c
    };
    assert_eq!(centres(&w), centres(&v));
    // bytes that are no image are refused as such
    let bad = post_multipart(
        "/v1/link/image",
        multipart(&[("image", Some("x.png"), b"nope")]),
        None,
    );
    assert_eq!(call(&svc, bad).await.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

/// A server bounded to `max_query_views` refuses the views past it and runs every rechecked
/// search within it, whatever the request asks.
#[tokio::test]
async fn a_servers_bound_on_a_querys_views_holds_for_every_request() {
    let f = fixture();
    let bounded = service(&f, |c| c.limits.max_query_views = Some(1));
    for asked in ["turns=2", "opposite_sun=true", "recheck_views=2"] {
        let (s, v) = call_json(
            &bounded,
            upload(&format!("/v1/search/image?{asked}"), &f.images[3]),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{asked}: {v}");
        assert!(v.to_string().contains("max_query_views"), "{asked}: {v}");
    }
    let (s, v) = call_json(&bounded, upload("/v1/search/image?top_k=1", &f.images[3])).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(top_ids(&v)[0], "c03");
    // lit from the other side, a query is found through the opposite sun's view, a later
    // stage of the recheck, by an open server; the bounded one searches it as given only
    let relit = f.images[3].with_file_name("relit-bounded.png");
    let mut im = image::open(&f.images[3]).unwrap();
    im.invert();
    im.save(&relit).unwrap();
    let open = service(&f, |_| {});
    let (s, v) = call_json(&open, upload("/v1/search/image?top_k=1", &relit)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(top_ids(&v)[0], "c03");
    let (s, w) = call_json(&bounded, upload("/v1/search/image?top_k=1", &relit)).await;
    assert_eq!(s, StatusCode::OK, "{w}");
    let inliers = |v: &Value| v["results"][0]["inliers"].as_u64().unwrap();
    assert!(inliers(&w) < inliers(&v), "{w} against {v}");
    // as the open server answers a request that asks for the same bound itself
    let (s, asked) = call_json(
        &open,
        upload("/v1/search/image?top_k=1&recheck_views=1", &relit),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{asked}");
    assert_eq!(asked["results"], w["results"]);
}
