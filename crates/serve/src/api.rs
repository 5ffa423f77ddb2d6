//! Routes, handlers and the JSON error shape `{"error": {"status", "message"}}`.

use crate::Service;
use axum::body::Bytes;
use axum::error_handling::HandleErrorLayer;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Multipart, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{BoxError, Json, Router};
use craterdex_index::{Hit, ImageMeta, Index};
use craterdex_index::{Mode, SearchParams};
use craterdex_model::extract::FEATURE_DTYPES;
use craterdex_model::{layouts, preprocess};
use craterdex_tokens::{Descriptors, FeatureRef};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::Cursor;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::ServiceBuilder;
use tower_http::timeout::TimeoutLayer;

const PAGE: &str = include_str!("page.html");
const OPENAPI: &str = include_str!("openapi.json");

type Svc = Arc<Service>;

/// An error answered to the client.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
    fn internal(e: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"status": self.status.as_u16(), "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// The whole application: page, OpenAPI document and `/v1`.
pub fn router(svc: Svc) -> Router {
    let c = svc.config().clone();
    // One semaphore per group, shared by all its routes (a plain ConcurrencyLimitLayer would
    // give each route its own).
    let shed = |limit: usize| {
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(overloaded))
            .load_shed()
            .layer(GlobalConcurrencyLimitLayer::new(limit))
    };
    let image_work = Router::new()
        .route("/v1/search/image", post(search_image))
        .route("/v1/images", post(add_image))
        .layer(shed(c.max_concurrent_images));
    let search_work = Router::new()
        .route("/v1/search/features", post(search_features))
        .route("/v1/images/{id}/similar", get(search_similar))
        .route("/v1/images/{id}/thumbnail", get(thumbnail))
        .route("/v1/images/{id}", get(image_meta).delete(remove_image))
        .route("/v1/stats", get(stats))
        .merge(image_work)
        .layer(shed(c.max_concurrent))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            c.request_timeout,
        ));
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/v1/health", get(health))
        .route("/v1/ready", get(ready))
        .route("/v1/openapi.json", get(openapi))
        .merge(search_work)
        .fallback(|| async { ApiError::not_found("no such endpoint; see /v1/openapi.json") })
        .layer(DefaultBodyLimit::max(c.max_upload_bytes))
        .layer(axum::middleware::from_fn_with_state(
            svc.clone(),
            count_client_errors,
        ))
        .with_state(svc)
}

async fn count_client_errors(
    State(svc): State<Svc>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let resp = next.run(req).await;
    if resp.status().is_client_error() {
        svc.counters.client_errors.fetch_add(1, Ordering::Relaxed);
    }
    resp
}

async fn overloaded(err: BoxError) -> ApiError {
    if err.is::<tower::load_shed::error::Overloaded>() {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many requests in flight; retry shortly",
        )
    } else {
        ApiError::internal(err)
    }
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn ready(State(svc): State<Svc>) -> Response {
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
        Some(idx) => Json(json!({
            "ready": true,
            "images": idx.live(),
            "image_search": svc.model().is_some(),
        }))
        .into_response(),
        None => unready("loading the index and model".into()),
    }
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

fn unauthorized(svc: &Service, headers: &HeaderMap, write: bool) -> Option<ApiError> {
    if !write && !svc.config().protect_reads {
        return None;
    }
    let Some(key) = &svc.config().api_key else {
        return Some(ApiError::new(
            StatusCode::FORBIDDEN,
            "this server was started without an API key; writes are disabled",
        ));
    };
    let given = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        });
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), key.as_bytes()) => None,
        Some(_) => Some(ApiError::new(StatusCode::UNAUTHORIZED, "wrong API key")),
        None => Some(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "an API key is required (header X-Api-Key or Authorization: Bearer)",
        )),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn authorize(svc: &Service, headers: &HeaderMap, write: bool) -> ApiResult<()> {
    unauthorized(svc, headers, write).map_or(Ok(()), Err)
}

fn index_of(svc: &Service) -> ApiResult<Arc<Index>> {
    svc.snapshot().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the index is still loading; see /v1/ready",
        )
    })
}

/// Ids are opaque keys, never file names; still, refuse anything that could be mistaken for
/// a path or break a URL or a log line.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 256
        && !id.starts_with('/')
        && !id
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..")
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/+".contains(c))
}

fn path_id(p: Result<Path<String>, PathRejection>) -> ApiResult<String> {
    let Path(id) = p.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if !valid_id(&id) {
        return Err(ApiError::bad_request(format!("invalid image id {id:?}")));
    }
    Ok(id)
}

fn live_row(idx: &Index, id: &str) -> ApiResult<usize> {
    idx.row_of(id)
        .ok_or_else(|| ApiError::not_found(format!("no image {id:?} in the index")))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SearchQuery {
    top_k: Option<usize>,
    shortlist: Option<usize>,
    mode: Option<String>,
    nprobe: Option<usize>,
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
        stage1: craterdex_index::Stage1::from_nprobe(q.nprobe),
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
    Ok(p)
}

#[derive(Serialize)]
struct Result1 {
    rank: usize,
    id: String,
    crater_id: Option<String>,
    score: f32,
    stage1: Option<f32>,
    stage2: Option<f32>,
    meta: ImageMeta,
    thumbnail: String,
}

/// Everything but unreserved URL characters is escaped, `/` included: an id is one segment.
const ID_ESCAPES: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

fn id_url(id: &str) -> String {
    percent_encoding::utf8_percent_encode(id, ID_ESCAPES).to_string()
}

fn thumbnail_url(id: &str) -> String {
    format!("/v1/images/{}/thumbnail", id_url(id))
}

fn results_json(
    idx: &Index,
    hits: &[Hit],
    p: &SearchParams,
    query: Value,
    timing: Value,
) -> Json<Value> {
    let results: Vec<Result1> = hits
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let m = idx.meta(h.row);
            Result1 {
                rank: i + 1,
                id: m.id.clone(),
                crater_id: m.crater_id.clone(),
                score: h.score,
                stage1: h.stage1,
                stage2: h.stage2,
                meta: m.clone(),
                thumbnail: thumbnail_url(&m.id),
            }
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

fn search_one(idx: &Index, desc: Descriptors, p: &SearchParams) -> Vec<Hit> {
    idx.search(std::slice::from_ref(&desc), p)
        .pop()
        .unwrap_or_default()
}

/// Numbers given as a flat list `[T*D]` or as nested lists `[T][D]`, read straight into one
/// vector (an untagged enum would buffer the whole document first: 3x slower).
struct FlatFloats(Vec<f32>);

impl<'de> Deserialize<'de> for FlatFloats {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Outer;
        struct Row<'a>(&'a mut Vec<f32>);
        impl<'de> serde::de::DeserializeSeed<'de> for Row<'_> {
            type Value = ();
            fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
                d.deserialize_any(self)
            }
        }
        impl<'de> serde::de::Visitor<'de> for Row<'_> {
            type Value = ();
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number or a list of numbers")
            }
            fn visit_f64<E>(self, v: f64) -> Result<(), E> {
                self.0.push(v as f32);
                Ok(())
            }
            fn visit_i64<E>(self, v: i64) -> Result<(), E> {
                self.0.push(v as f32);
                Ok(())
            }
            fn visit_u64<E>(self, v: u64) -> Result<(), E> {
                self.0.push(v as f32);
                Ok(())
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
                while let Some(v) = seq.next_element::<f32>()? {
                    self.0.push(v);
                }
                Ok(())
            }
        }
        impl<'de> serde::de::Visitor<'de> for Outer {
            type Value = Vec<f32>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of numbers or of lists of numbers")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Vec<f32>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while seq.next_element_seed(Row(&mut out))?.is_some() {}
                Ok(out)
            }
        }
        d.deserialize_seq(Outer).map(FlatFloats)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FeaturesBody {
    cls: Vec<f32>,
    patches: FlatFloats,
    attention: Vec<f32>,
}

/// `(cls, patches, attention)` from a JSON document or a safetensors file (the features
/// format of `craterdex extract`, one image: `cls` `[D]` or `[1, D]`, `patch_tokens` `[T, D]`
/// or `[1, T, D]` in f32 or f16, `attention` `[T]` or `[1, T]`).
fn parse_features(body: &[u8], content_type: &str) -> ApiResult<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    if content_type.starts_with("application/json") || body.first() == Some(&b'{') {
        let b: FeaturesBody = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("bad features JSON: {e}")))?;
        return Ok((b.cls, b.patches.0, b.attention));
    }
    let st = safetensors::SafeTensors::deserialize(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body is neither features JSON nor a safetensors file: {e}"
        ))
    })?;
    let read = |name: &str| -> ApiResult<Vec<f32>> {
        let t = st.tensor(name).map_err(|_| {
            ApiError::bad_request(format!("the safetensors body has no tensor {name:?}"))
        })?;
        layouts::tensor_floats_of(&t, FEATURE_DTYPES).ok_or_else(|| {
            ApiError::bad_request(format!(
                "{name}: dtype {:?}, expected F32 or F16",
                t.dtype()
            ))
        })
    };
    Ok((read("cls")?, read("patch_tokens")?, read("attention")?))
}

/// Checks the shapes against the index's feature width.
fn check_features(
    (cls, patches, attention): (Vec<f32>, Vec<f32>, Vec<f32>),
    dim: usize,
) -> ApiResult<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    let bad = |m: String| Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, m));
    if cls.len() != dim {
        return bad(format!(
            "cls has {} values, the index expects {dim}",
            cls.len()
        ));
    }
    if patches.is_empty() || patches.len() % dim != 0 {
        return bad(format!(
            "patches has {} values, not a positive multiple of {dim}",
            patches.len()
        ));
    }
    let t = patches.len() / dim;
    if attention.len() != t {
        return bad(format!(
            "attention has {} values for {t} patch tokens",
            attention.len()
        ));
    }
    if !cls
        .iter()
        .chain(&patches)
        .chain(&attention)
        .all(|x| x.is_finite())
    {
        return bad("features contain NaN or infinite values".into());
    }
    Ok((cls, patches, attention))
}

async fn search_features(
    State(svc): State<Svc>,
    headers: HeaderMap,
    q: Result<Query<SearchQuery>, QueryRejection>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    authorize(&svc, &headers, false)?;
    let p = search_params(&svc, q)?;
    let idx = index_of(&svc)?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let (cls, patches, attention) =
        check_features(parse_features(&body, content_type)?, idx.feature_dim())?;
    svc.counters.searches.fetch_add(1, Ordering::Relaxed);
    blocking(move || {
        let t = Instant::now();
        let desc = idx.encoder.encode(FeatureRef {
            cls: &cls,
            patches: &patches,
            attention: &attention,
        });
        let encode_ms = ms(t);
        let t = Instant::now();
        let hits = search_one(&idx, desc, &p);
        let timing = json!({"encode": encode_ms, "search": ms(t)});
        Ok(results_json(
            &idx,
            &hits,
            &p,
            json!({"kind": "features"}),
            timing,
        ))
    })
    .await
}

async fn search_similar(
    State(svc): State<Svc>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<SearchQuery>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    authorize(&svc, &headers, false)?;
    let id = path_id(id)?;
    let p = search_params(&svc, q)?;
    let idx = index_of(&svc)?;
    let row = live_row(&idx, &id)?;
    svc.counters.searches.fetch_add(1, Ordering::Relaxed);
    blocking(move || {
        let t = Instant::now();
        let hits = search_one(&idx, idx.descriptors_of(row), &p);
        let timing = json!({"search": ms(t)});
        Ok(results_json(
            &idx,
            &hits,
            &p,
            json!({"kind": "indexed", "id": id}),
            timing,
        ))
    })
    .await
}

/// A checked, decoded upload.
struct Upload {
    bytes: Bytes,
    image: image::DynamicImage,
    format: image::ImageFormat,
}

fn decode_upload(bytes: Bytes, max_side: u32) -> ApiResult<Upload> {
    let reader = image::ImageReader::new(Cursor::new(&bytes[..]))
        .with_guessed_format()
        .map_err(ApiError::internal)?;
    let Some(format) = reader.format() else {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "not an image: JPEG, PNG, TIFF or PNM expected",
        ));
    };
    let unreadable = |e: image::ImageError| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("cannot read the {format:?} image: {e}"),
        )
    };
    let (w, h) = image::ImageReader::with_format(Cursor::new(&bytes[..]), format)
        .into_dimensions()
        .map_err(unreadable)?;
    if w > max_side || h > max_side {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the image is {w}x{h} pixels; at most {max_side} per side is accepted"),
        ));
    }
    let mut reader = image::ImageReader::with_format(Cursor::new(&bytes[..]), format);
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(max_side);
    limits.max_image_height = Some(max_side);
    reader.limits(limits);
    let image = reader.decode().map_err(unreadable)?;
    Ok(Upload {
        bytes,
        image,
        format,
    })
}

/// The fields of a multipart upload: the file part `image` and any text parts.
async fn read_multipart(
    mut mp: Multipart,
) -> ApiResult<(Option<Bytes>, std::collections::BTreeMap<String, String>)> {
    let mp_err =
        |e: axum::extract::multipart::MultipartError| ApiError::new(e.status(), e.body_text());
    let mut image = None;
    let mut fields = std::collections::BTreeMap::new();
    while let Some(field) = mp.next_field().await.map_err(mp_err)? {
        let name = field.name().unwrap_or("").to_string();
        if name == "image" || (image.is_none() && field.file_name().is_some()) {
            image = Some(field.bytes().await.map_err(mp_err)?);
        } else {
            let text = field.text().await.map_err(mp_err)?;
            fields.insert(name, text);
        }
    }
    Ok((image, fields))
}

fn model_of(svc: &Service) -> ApiResult<Arc<craterdex_model::Vit>> {
    svc.model().cloned().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "this server has no model loaded; search with features instead",
        )
    })
}

fn image_descriptors(
    svc: &Service,
    idx: &Index,
    img: &image::DynamicImage,
) -> ApiResult<Descriptors> {
    let vit = model_of(svc)?;
    let tensor = preprocess::to_tensor(img, &vit.preprocess(svc.config().resize));
    let f = vit
        .forward(&[tensor])
        .map_err(ApiError::internal)?
        .pop()
        .ok_or_else(|| ApiError::internal("the model returned no features"))?;
    Ok(idx.encoder.encode(FeatureRef {
        cls: &f.cls,
        patches: &f.patches,
        attention: &f.attention,
    }))
}

async fn search_image(
    State(svc): State<Svc>,
    headers: HeaderMap,
    q: Result<Query<SearchQuery>, QueryRejection>,
    mp: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> ApiResult<Json<Value>> {
    authorize(&svc, &headers, false)?;
    let p = search_params(&svc, q)?;
    let mp = mp.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (bytes, _) = read_multipart(mp).await?;
    let bytes = bytes
        .ok_or_else(|| ApiError::bad_request("multipart form without an `image` file part"))?;
    model_of(&svc)?;
    let idx = index_of(&svc)?;
    let max_side = svc.config().max_image_side;
    svc.counters.image_searches.fetch_add(1, Ordering::Relaxed);
    let svc2 = svc.clone();
    blocking(move || {
        let t = Instant::now();
        let up = decode_upload(bytes, max_side)?;
        let (w, h) = (up.image.width(), up.image.height());
        let desc = image_descriptors(&svc2, &idx, &up.image)?;
        let features_ms = ms(t);
        let t = Instant::now();
        let hits = search_one(&idx, desc, &p);
        let timing = json!({"features": features_ms, "search": ms(t)});
        let query = json!({"kind": "image", "width": w, "height": h, "bytes": up.bytes.len()});
        Ok(results_json(&idx, &hits, &p, query, timing))
    })
    .await
}

async fn image_meta(
    State(svc): State<Svc>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<Value>> {
    authorize(&svc, &headers, false)?;
    let id = path_id(id)?;
    let idx = index_of(&svc)?;
    let row = live_row(&idx, &id)?;
    let m = idx.meta(row);
    Ok(Json(json!({
        "id": m.id,
        "meta": m,
        "thumbnail": thumbnail_url(&m.id),
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ThumbQuery {
    size: Option<u32>,
}

async fn thumbnail(
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
    let idx = index_of(&svc)?;
    let row = live_row(&idx, &id)?;
    // The file comes from the index's own metadata, never from the request.
    let Some(path) = idx.meta(row).path.clone() else {
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

fn parse_coord(
    fields: &std::collections::BTreeMap<String, String>,
    name: &str,
) -> ApiResult<Option<f64>> {
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

fn text_field(
    fields: &std::collections::BTreeMap<String, String>,
    name: &str,
) -> ApiResult<Option<String>> {
    match fields.get(name).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(s) if s.len() <= 256 && !s.chars().any(char::is_control) => Ok(Some(s.to_string())),
        Some(_) => Err(ApiError::bad_request(format!(
            "{name}: at most 256 characters, no control characters"
        ))),
    }
}

async fn add_image(
    State(svc): State<Svc>,
    headers: HeaderMap,
    mp: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    authorize(&svc, &headers, true)?;
    let mp = mp.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (bytes, fields) = read_multipart(mp).await?;
    const KNOWN: [&str; 7] = [
        "id",
        "crater_id",
        "source",
        "view",
        "lat",
        "lon",
        "diameter_km",
    ];
    if let Some(k) = fields.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "unknown form field {k:?}; expected image and {KNOWN:?}"
        )));
    }
    let bytes = bytes
        .ok_or_else(|| ApiError::bad_request("multipart form without an `image` file part"))?;
    let id = text_field(&fields, "id")?;
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
        path: None,
    };
    model_of(&svc)?;
    let idx = index_of(&svc)?;
    let max_side = svc.config().max_image_side;
    let svc2 = svc.clone();
    let (up, desc) = blocking(move || {
        let up = decode_upload(bytes, max_side)?;
        let desc = image_descriptors(&svc2, &idx, &up.image)?;
        Ok((up, desc))
    })
    .await?;
    let digest = craterdex_model::store::sha256_hex(&up.bytes);
    if meta.id.is_empty() {
        meta.id = format!("upload-{}", &digest[..16]);
    }
    let ext = up.format.extensions_str().first().copied().unwrap_or("img");
    let file = svc.config().upload_dir.join(format!("{digest}.{ext}"));

    let _writer = svc.writer.lock().await;
    let idx = index_of(&svc)?;
    if idx.row_of(&meta.id).is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("the index already has an image {:?}", meta.id),
        ));
    }
    if idx.was_removed(&meta.id) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "{:?} was removed; its id can be reused after a rebuild (craterdex index build)",
                meta.id
            ),
        ));
    }
    let svc2 = svc.clone();
    let id = meta.id.clone();
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
        write_and_swap(&svc2, |dir| Index::add(dir, &[(meta, desc)]))
    })
    .await?;
    svc.counters.added.fetch_add(1, Ordering::Relaxed);
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": id, "images": live, "thumbnail": thumbnail_url(&id)})),
    ))
}

async fn remove_image(
    State(svc): State<Svc>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<Value>> {
    authorize(&svc, &headers, true)?;
    let id = path_id(id)?;
    let _writer = svc.writer.lock().await;
    let idx = index_of(&svc)?;
    live_row(&idx, &id)?;
    let svc2 = svc.clone();
    let id2 = id.clone();
    let live = blocking(move || write_and_swap(&svc2, |dir| Index::remove(dir, &[id2]))).await?;
    svc.counters.removed.fetch_add(1, Ordering::Relaxed);
    Ok(Json(json!({"removed": id, "images": live})))
}

/// Applies a write through the index's atomic path, then swaps the reopened index in whole;
/// returns the images now searchable. Callers hold the writer lock.
fn write_and_swap(
    svc: &Service,
    write: impl FnOnce(&std::path::Path) -> anyhow::Result<usize>,
) -> ApiResult<usize> {
    let dir = &svc.config().index_dir;
    write(dir).map_err(|e| ApiError::internal(format!("{e:#}")))?;
    let reopened =
        Index::open_with(dir, false).map_err(|e| ApiError::internal(format!("{e:#}")))?;
    let live = reopened.live();
    svc.replace_index(reopened);
    Ok(live)
}

async fn stats(State(svc): State<Svc>, headers: HeaderMap) -> ApiResult<Json<Value>> {
    authorize(&svc, &headers, false)?;
    let idx = index_of(&svc)?;
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
        "image_search": svc.model().is_some(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_look_like_paths_are_refused() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "a/./b",
            "a b",
            "a\nb",
            "x%2e",
        ] {
            assert!(!valid_id(bad), "{bad:?} accepted");
        }
        for good in [
            "holdout_tile-00025_2x",
            "M1.tile/crater-7",
            "upload-0a1b",
            "c:12+3",
        ] {
            assert!(valid_id(good), "{good:?} refused");
        }
    }

    #[test]
    fn keys_compare_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
    }
}
