//! The request handlers. Each takes a snapshot of the engine (`Arc<Engine>`), so a request
//! sees the index wholly before or wholly after a write; searches go through the engine,
//! writes through the index's atomic path under one writer lock.

use crate::auth::{authorize, path_id, valid_id};
use crate::error::{ApiError, ApiResult};
use crate::features::{check_features, decode_upload, parse_features, read_multipart};
use crate::{Service, Svc};
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Multipart, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use craterdex_engine::{Descriptors, Engine, ImageMeta, Mode, SearchHit, SearchParams, Stage1};
use craterdex_model::preprocess;
use craterdex_tokens::FeatureRef;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Cursor;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

const OPENAPI: &str = include_str!("openapi.json");

pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn ready(State(svc): State<Svc>) -> Response {
    let unready = |reason: String| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"ready": false, "reason": reason})),
        )
            .into_response()
    };
    if svc.draining.load(Ordering::SeqCst) {
        return unready("shutting down".into());
    }
    if let Some(e) = svc
        .load_error
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
    {
        return unready(format!("loading failed: {e}"));
    }
    match svc.snapshot() {
        Some(engine) => Json(json!({
            "ready": true,
            "images": engine.index().live(),
            "image_search": engine.extractor().is_some(),
        }))
        .into_response(),
        None => unready("loading the index and model".into()),
    }
}

/// The OpenAPI document as this server answers: the limits of its configuration and the
/// feature width of its index written into the schemas.
pub async fn openapi(State(svc): State<Svc>) -> Response {
    let mut doc: Value = serde_json::from_str(OPENAPI).unwrap_or_default();
    let c = svc.config();
    let mut bound = |param: &mut Value| {
        let max = match param["name"].as_str() {
            Some("top_k") => Some(c.max_top_k),
            Some("shortlist") => Some(c.max_shortlist),
            _ => None,
        };
        if let Some(max) = max {
            param["schema"]["maximum"] = json!(max);
        }
        if param["name"] == "id" && param["in"] == "path" {
            param["schema"]["pattern"] = json!(ID_PATTERN);
            param["schema"]["maxLength"] = json!(256);
        }
    };
    if let Some(paths) = doc["paths"].as_object_mut() {
        for op in paths.values_mut().filter_map(|p| p.as_object_mut()) {
            for method in op.values_mut() {
                if let Some(params) = method.get_mut("parameters").and_then(Value::as_array_mut) {
                    params.iter_mut().for_each(&mut bound);
                }
            }
        }
    }
    for path in ["/v1/images", "/v1/link"] {
        let upload_id = &mut doc["paths"][path]["post"]["requestBody"]["content"]
            ["multipart/form-data"]["schema"]["properties"]["id"];
        if upload_id.is_object() {
            // An empty id asks for the default.
            upload_id["pattern"] = json!(format!("^$|{ID_PATTERN}"));
        }
    }
    if let Some(engine) = svc.snapshot() {
        let d = engine.index().feature_dim();
        let features = &mut doc["components"]["schemas"]["Features"]["properties"];
        features["cls"]["minItems"] = json!(d);
        features["cls"]["maxItems"] = json!(d);
        features["attention"]["minItems"] = json!(1);
        features["patches"]["oneOf"][1]["minItems"] = json!(1);
        features["patches"]["oneOf"][1]["items"]["minItems"] = json!(d);
        features["patches"]["oneOf"][1]["items"]["maxItems"] = json!(d);
    }
    Json(doc).into_response()
}

/// What [`valid_id`] accepts, as a JSON Schema pattern (segments of letters, digits and
/// `-_.:+`, not starting with a dot, joined by `/`).
const ID_PATTERN: &str = "^[A-Za-z0-9_:+-][A-Za-z0-9._:+-]*(/[A-Za-z0-9_:+-][A-Za-z0-9._:+-]*)*$";

fn engine_of(svc: &Service) -> ApiResult<Arc<Engine>> {
    svc.snapshot().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the index is still loading; see /v1/ready",
        )
    })
}

fn live_row(engine: &Engine, id: &str) -> ApiResult<usize> {
    engine
        .index()
        .row_of(id)
        .ok_or_else(|| ApiError::not_found(format!("no image {id:?} in the index")))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SearchQuery {
    top_k: Option<usize>,
    shortlist: Option<usize>,
    mode: Option<String>,
    nprobe: Option<usize>,
    group_views: Option<bool>,
}

fn search_params(
    svc: &Service,
    q: Result<Query<SearchQuery>, QueryRejection>,
) -> ApiResult<SearchParams> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let c = svc.config();
    let d = SearchParams::default();
    let p = SearchParams {
        top_k: q.top_k.unwrap_or(d.top_k),
        shortlist: q.shortlist.unwrap_or(d.shortlist),
        mode: match q.mode {
            Some(m) => m
                .parse()
                .map_err(|e| ApiError::bad_request(format!("{e:#}")))?,
            None => d.mode,
        },
        stage1: Stage1::from_nprobe(q.nprobe),
        group_views: q.group_views.unwrap_or(d.group_views),
    };
    if p.top_k == 0 || p.top_k > c.max_top_k {
        return Err(ApiError::bad_request(format!(
            "top_k must be between 1 and {}",
            c.max_top_k
        )));
    }
    if p.shortlist == 0 || p.shortlist > c.max_shortlist {
        return Err(ApiError::bad_request(format!(
            "shortlist must be between 1 and {}",
            c.max_shortlist
        )));
    }
    if q.nprobe.is_some_and(|n| n > MAX_NPROBE) {
        return Err(ApiError::bad_request(format!(
            "nprobe must be at most {MAX_NPROBE}"
        )));
    }
    Ok(p)
}

/// The documented ceiling on `nprobe`; more lists than an index has already means all of them.
const MAX_NPROBE: usize = 1_000_000;

/// A hit as the API returns it: the engine's result and a thumbnail URL.
#[derive(Serialize)]
struct ApiHit {
    #[serde(flatten)]
    hit: SearchHit,
    thumbnail: String,
}

/// Everything but unreserved URL characters is escaped, `/` included: an id is one segment.
const ID_ESCAPES: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

fn thumbnail_url(id: &str) -> String {
    format!(
        "/v1/images/{}/thumbnail",
        percent_encoding::utf8_percent_encode(id, ID_ESCAPES)
    )
}

fn results_json(
    hits: Vec<SearchHit>,
    p: &SearchParams,
    query: Value,
    timing: Value,
) -> Json<Value> {
    let results: Vec<ApiHit> = hits
        .into_iter()
        .map(|hit| ApiHit {
            thumbnail: thumbnail_url(&hit.id),
            hit,
        })
        .collect();
    Json(json!({
        "query": query,
        "params": {"mode": p.mode.name(), "top_k": p.top_k, "shortlist": if p.mode == Mode::TwoStage { Some(p.shortlist) } else { None }},
        "timing_ms": timing,
        "results": results,
    }))
}

fn ms(t: Instant) -> f64 {
    (t.elapsed().as_secs_f64() * 1e6).round() / 1e3
}

/// Runs CPU work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(ApiError::internal)?
}

fn search_one(engine: &Engine, desc: &Descriptors, p: &SearchParams) -> Vec<SearchHit> {
    engine
        .search(std::slice::from_ref(desc), p)
        .pop()
        .unwrap_or_default()
}

pub async fn search_features(
    State(svc): State<Svc>,
    headers: HeaderMap,
    q: Result<Query<SearchQuery>, QueryRejection>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    authorize(&svc, &headers, false)?;
    let p = search_params(&svc, q)?;
    let engine = engine_of(&svc)?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let (cls, patches, attention) = check_features(
        parse_features(&body, content_type)?,
        engine.index().feature_dim(),
    )?;
    svc.counters.searches.fetch_add(1, Ordering::Relaxed);
    blocking(move || {
        let t = Instant::now();
        let desc = engine.encode_ref(FeatureRef {
            cls: &cls,
            patches: &patches,
            attention: &attention,
        });
        let encode_ms = ms(t);
        let t = Instant::now();
        let hits = search_one(&engine, &desc, &p);
        let timing = json!({"encode": encode_ms, "search": ms(t)});
        Ok(results_json(hits, &p, json!({"kind": "features"}), timing))
    })
    .await
}

pub async fn search_similar(
    State(svc): State<Svc>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<SearchQuery>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    authorize(&svc, &headers, false)?;
    let id = path_id(id)?;
    let p = search_params(&svc, q)?;
    let engine = engine_of(&svc)?;
    live_row(&engine, &id)?;
    svc.counters.searches.fetch_add(1, Ordering::Relaxed);
    blocking(move || {
        let t = Instant::now();
        let hits = engine
            .similar(&id, &p)
            .map_err(|e| ApiError::not_found(format!("{e:#}")))?;
        let timing = json!({"search": ms(t)});
        Ok(results_json(
            hits,
            &p,
            json!({"kind": "indexed", "id": id}),
            timing,
        ))
    })
    .await
}

/// The engine, refused with 501 when the server runs without a model.
fn image_engine(svc: &Service) -> ApiResult<Arc<Engine>> {
    let engine = engine_of(svc)?;
    if engine.extractor().is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "this server has no model loaded; search with features instead",
        ));
    }
    Ok(engine)
}

/// Descriptors of an uploaded image under the index's encoder.
fn image_descriptors(engine: &Engine, img: &image::DynamicImage) -> ApiResult<Descriptors> {
    let extractor = engine
        .extractor()
        .ok_or_else(|| ApiError::internal("no model"))?;
    let f = extractor.features_of(img).map_err(ApiError::internal)?;
    Ok(engine.encode_ref(FeatureRef {
        cls: &f.cls,
        patches: &f.patches,
        attention: &f.attention,
    }))
}

pub async fn search_image(
    State(svc): State<Svc>,
    headers: HeaderMap,
    q: Result<Query<SearchQuery>, QueryRejection>,
    mp: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> ApiResult<Json<Value>> {
    authorize(&svc, &headers, false)?;
    let p = search_params(&svc, q)?;
    let mp = mp.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (bytes, _) = read_multipart(mp, &[]).await?;
    let bytes = bytes
        .ok_or_else(|| ApiError::bad_request("multipart form without an `image` file part"))?;
    let engine = image_engine(&svc)?;
    let (max_side, partial) = (
        svc.config().max_image_side,
        svc.config().allow_partial_images,
    );
    svc.counters.image_searches.fetch_add(1, Ordering::Relaxed);
    blocking(move || {
        let t = Instant::now();
        let up = decode_upload(bytes, max_side, partial)?;
        let (w, h) = (up.image.width(), up.image.height());
        let desc = image_descriptors(&engine, &up.image)?;
        let features_ms = ms(t);
        let t = Instant::now();
        let hits = search_one(&engine, &desc, &p);
        let timing = json!({"features": features_ms, "search": ms(t)});
        let query = json!({"kind": "image", "width": w, "height": h, "bytes": up.bytes.len()});
        Ok(results_json(hits, &p, query, timing))
    })
    .await
}

pub async fn image_meta(
    State(svc): State<Svc>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<Value>> {
    authorize(&svc, &headers, false)?;
    let id = path_id(id)?;
    let engine = engine_of(&svc)?;
    let row = live_row(&engine, &id)?;
    let m = engine.index().meta(row);
    Ok(Json(json!({
        "id": m.id,
        "meta": m,
        "thumbnail": thumbnail_url(&m.id),
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThumbQuery {
    size: Option<u32>,
}

pub async fn thumbnail(
    State(svc): State<Svc>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<ThumbQuery>, QueryRejection>,
) -> ApiResult<Response> {
    authorize(&svc, &headers, false)?;
    let id = path_id(id)?;
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let size = q.size.unwrap_or(160);
    if !(16..=512).contains(&size) {
        return Err(ApiError::bad_request("size must be between 16 and 512"));
    }
    let engine = engine_of(&svc)?;
    let row = live_row(&engine, &id)?;
    // The file comes from the index's own metadata, never from the request.
    let Some(path) = engine.index().meta(row).path.clone() else {
        return Err(ApiError::not_found(format!(
            "no image file is recorded for {id:?}"
        )));
    };
    let png = blocking(move || {
        let img = preprocess::load_image(std::path::Path::new(&path)).map_err(|e| {
            ApiError::not_found(format!("the image file of {id:?} cannot be read: {e:#}"))
        })?;
        // Never enlarged: small crops are shown at their own size.
        let side = size.min(img.width().max(img.height()));
        let thumb = img.thumbnail(side, side).to_rgb8();
        let mut out = Cursor::new(Vec::new());
        thumb
            .write_to(&mut out, image::ImageFormat::Png)
            .map_err(ApiError::internal)?;
        Ok(out.into_inner())
    })
    .await?;
    Ok((
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("image/png")),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("max-age=3600"),
            ),
        ],
        png,
    )
        .into_response())
}

fn parse_coord(fields: &BTreeMap<String, String>, name: &str) -> ApiResult<Option<f64>> {
    match fields.get(name).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(s) => s
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .map(Some)
            .ok_or_else(|| ApiError::bad_request(format!("{name}: {s:?} is not a number"))),
    }
}

/// Free text is checked as sent: trimming first would let a trailing control
/// character (form feed, vertical tab) through the check the schema documents.
fn text_field(fields: &BTreeMap<String, String>, name: &str) -> ApiResult<Option<String>> {
    match fields
        .get(name)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
    {
        None => Ok(None),
        Some(s) if s.chars().count() <= 256 && !s.chars().any(char::is_control) => {
            Ok(Some(s.to_string()))
        }
        Some(_) => Err(ApiError::bad_request(format!(
            "{name}: at most 256 characters, no control characters"
        ))),
    }
}

/// An entry uploaded as a multipart form: the decoded image, its metadata (the id defaults
/// to `upload-<sha256 prefix>`) and its descriptors.
struct EntryUpload {
    up: crate::features::Upload,
    meta: ImageMeta,
    desc: Descriptors,
}

/// Reads and checks an entry form (`image` and the metadata fields), decodes the image and
/// encodes it with the model.
async fn read_entry(svc: &Svc, mp: Multipart) -> ApiResult<EntryUpload> {
    const KNOWN: [&str; 7] = [
        "id",
        "crater_id",
        "source",
        "view",
        "lat",
        "lon",
        "diameter_km",
    ];
    let (bytes, fields) = read_multipart(mp, &KNOWN).await?;
    let bytes = bytes
        .ok_or_else(|| ApiError::bad_request("multipart form without an `image` file part"))?;
    // Unlike the free-text fields an id is not trimmed: it is a key matched exactly.
    let id = fields.get("id").filter(|id| !id.is_empty()).cloned();
    if let Some(id) = &id {
        if !valid_id(id) {
            return Err(ApiError::bad_request(format!("invalid image id {id:?}")));
        }
    }
    let mut meta = ImageMeta {
        id: id.unwrap_or_default(),
        crater_id: text_field(&fields, "crater_id")?,
        source: text_field(&fields, "source")?,
        view: text_field(&fields, "view")?,
        lat: parse_coord(&fields, "lat")?,
        lon: parse_coord(&fields, "lon")?,
        diameter_km: parse_coord(&fields, "diameter_km")?,
        ..ImageMeta::default()
    };
    let engine = image_engine(svc)?;
    let (max_side, partial) = (
        svc.config().max_image_side,
        svc.config().allow_partial_images,
    );
    let (up, desc) = blocking(move || {
        let up = decode_upload(bytes, max_side, partial)?;
        let desc = image_descriptors(&engine, &up.image)?;
        Ok((up, desc))
    })
    .await?;
    if meta.id.is_empty() {
        let digest = craterdex_model::store::sha256_hex(&up.bytes);
        meta.id = format!("upload-{}", &digest[..16]);
    }
    Ok(EntryUpload { up, meta, desc })
}

/// Why an id cannot be added to the index now, if it cannot.
fn id_taken(engine: &Engine, id: &str) -> Option<String> {
    if engine.index().row_of(id).is_some() {
        return Some(format!("the index already has an image {id:?}"));
    }
    engine.index().was_removed(id).then(|| {
        format!("{id:?} was removed; its id can be reused after a rebuild (craterdex index build)")
    })
}

/// Stores the uploaded file and adds the entry through the index's atomic path; returns
/// the images now searchable. Callers hold the writer lock and checked the id.
async fn store_and_add(svc: &Svc, engine: Arc<Engine>, entry: EntryUpload) -> ApiResult<usize> {
    let EntryUpload { up, mut meta, desc } = entry;
    let digest = craterdex_model::store::sha256_hex(&up.bytes);
    let ext = up.format.extensions_str().first().copied().unwrap_or("img");
    let file = svc.config().upload_dir.join(format!("{digest}.{ext}"));
    let svc2 = svc.clone();
    let live = blocking(move || {
        let dir = svc2.config().upload_dir.clone();
        std::fs::create_dir_all(&dir)
            .map_err(|e| ApiError::internal(format!("cannot create {}: {e}", dir.display())))?;
        craterdex_durable::write_atomic(&file, &up.bytes).map_err(ApiError::internal)?;
        meta.path = Some(
            std::fs::canonicalize(&file)
                .unwrap_or(file)
                .display()
                .to_string(),
        );
        write_and_swap(&svc2, &engine, |e| e.add(&[(meta, desc)]))
    })
    .await?;
    svc.counters.added.fetch_add(1, Ordering::Relaxed);
    Ok(live)
}

pub async fn add_image(
    State(svc): State<Svc>,
    headers: HeaderMap,
    mp: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    authorize(&svc, &headers, true)?;
    let mp = mp.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let entry = read_entry(&svc, mp).await?;
    let id = entry.meta.id.clone();
    let _writer = svc.writer.lock().await;
    let engine = engine_of(&svc)?;
    if let Some(why) = id_taken(&engine, &id) {
        return Err(ApiError::new(StatusCode::CONFLICT, why));
    }
    let live = store_and_add(&svc, engine, entry).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": id, "images": live, "thumbnail": thumbnail_url(&id)})),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkQuery {
    /// Add the entry when it is decided `new` (needs the API key).
    #[serde(default)]
    insert: bool,
}

/// The index's link rule and the grid of its positions, built once per index version.
fn link_context(
    svc: &Service,
    engine: &Arc<Engine>,
) -> ApiResult<
    Arc<(
        craterdex_workflows::LinkRule,
        craterdex_workflows::Neighbours,
    )>,
> {
    let mut cache = svc.link_cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((made_for, ctx)) = cache.as_ref() {
        if made_for.upgrade().is_some_and(|e| Arc::ptr_eq(&e, engine)) {
            return Ok(ctx.clone());
        }
    }
    let rule = match engine.index().dir() {
        Some(dir) => craterdex_workflows::LinkRule::for_index(dir)
            .map_err(|e| ApiError::internal(format!("{e:#}")))?,
        None => craterdex_workflows::LinkRule::default(),
    };
    let near = craterdex_workflows::Neighbours::of_index(engine.index(), &rule);
    let ctx = Arc::new((rule, near));
    *cache = Some((Arc::downgrade(engine), ctx.clone()));
    Ok(ctx)
}

pub async fn link_image(
    State(svc): State<Svc>,
    headers: HeaderMap,
    q: Result<Query<LinkQuery>, QueryRejection>,
    mp: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> ApiResult<Json<Value>> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    authorize(&svc, &headers, q.insert)?;
    let mp = mp.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let entry = read_entry(&svc, mp).await?;
    let opts = craterdex_workflows::LinkOptions::default();
    let decide = |engine: &Arc<Engine>, entry: &EntryUpload| -> ApiResult<_> {
        let ctx = link_context(&svc, engine)?;
        let row = craterdex_workflows::link_one(
            engine,
            &ctx.1,
            &ctx.0,
            &opts,
            entry.meta.clone(),
            &entry.desc,
        );
        Ok((row, ctx.0.source.clone()))
    };
    let (mut row, rule, live) = if q.insert {
        // decided and added under the writer lock, so concurrent links see each other
        let _writer = svc.writer.lock().await;
        let engine = engine_of(&svc)?;
        let (mut row, rule) = decide(&engine, &entry)?;
        let mut live = engine.index().live();
        if row.decision == craterdex_workflows::Decision::New
            && id_taken(&engine, &entry.meta.id).is_none()
        {
            live = store_and_add(&svc, engine, entry).await?;
            row.inserted = true;
        }
        (row, rule, live)
    } else {
        let engine = engine_of(&svc)?;
        let (row, rule) = decide(&engine, &entry)?;
        (row, rule, engine.index().live())
    };
    row.query.path = None;
    let thumb = |c: &craterdex_workflows::Candidate| {
        let mut v = json!(c);
        v["thumbnail"] = json!(thumbnail_url(&c.id));
        v
    };
    Ok(Json(json!({
        "query": row.query,
        "decision": row.decision,
        "confidence": row.confidence,
        "best": row.best.as_ref().map(thumb),
        "second": row.second.as_ref().map(thumb),
        "inserted": std::mem::take(&mut row.inserted),
        "images": live,
        "rule": rule,
    })))
}

pub async fn remove_image(
    State(svc): State<Svc>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<Value>> {
    authorize(&svc, &headers, true)?;
    let id = path_id(id)?;
    let _writer = svc.writer.lock().await;
    let engine = engine_of(&svc)?;
    live_row(&engine, &id)?;
    let svc2 = svc.clone();
    let id2 = id.clone();
    let live = blocking(move || write_and_swap(&svc2, &engine, |e| e.remove(&[id2]))).await?;
    svc.counters.removed.fetch_add(1, Ordering::Relaxed);
    Ok(Json(json!({"removed": id, "images": live})))
}

/// Applies a write through the engine (the index's atomic path), then swaps the engine over
/// the changed index in whole; returns the images now searchable. Callers hold the writer
/// lock.
fn write_and_swap(
    svc: &Service,
    engine: &Engine,
    write: impl FnOnce(&Engine) -> craterdex_engine::Result<(usize, Engine)>,
) -> ApiResult<usize> {
    let (_, changed) = write(engine).map_err(|e| ApiError::internal(format!("{e:#}")))?;
    let live = changed.index().live();
    svc.replace_engine(changed);
    Ok(live)
}

pub async fn stats(State(svc): State<Svc>, headers: HeaderMap) -> ApiResult<Json<Value>> {
    authorize(&svc, &headers, false)?;
    let engine = engine_of(&svc)?;
    let idx = engine.index();
    let c = &svc.counters;
    Ok(Json(json!({
        "images": idx.live(),
        "rows": idx.rows(),
        "segments": idx.segment_count(),
        "codec": idx.codec.codec,
        "tokens_per_image": idx.tokens_per_image(),
        "token_dim": idx.token_dim(),
        "single_dim": idx.single_dim(),
        "feature_dim": idx.feature_dim(),
        "token_bytes_per_image": idx.token_bytes_per_image(),
        "model": idx.model(),
        "image_search": engine.extractor().is_some(),
        "writes_enabled": svc.config().api_key.is_some(),
        "requests": {
            "searches": c.searches.load(Ordering::Relaxed),
            "image_searches": c.image_searches.load(Ordering::Relaxed),
            "added": c.added.load(Ordering::Relaxed),
            "removed": c.removed.load(Ordering::Relaxed),
            "client_errors": c.client_errors.load(Ordering::Relaxed),
        },
    })))
}
