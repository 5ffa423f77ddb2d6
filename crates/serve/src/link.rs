//! Linking an uploaded crater image to the catalogue: match, new or ambiguous, with the
//! evidence, by the index's calibrated rule; with `insert=true` a new crater is added, decided
//! and added under the engine's writer so concurrent links see each other.

use crate::auth::authorize;
use crate::error::{ApiError, ApiResult};
use crate::images::{id_taken, store_upload};
use crate::search::image_engine;
use crate::upload::{entry_of, read_entry_form, read_multipart, EntryUpload};
use crate::work::{self, Admission};
use crate::{Counters, Service, Svc};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Multipart, Query, State};
use axum::http::HeaderMap;
use axum::{Extension, Json};
use craterdex_api::readers::thumbnail_url;
use craterdex_api::types::{
    ImageCraterLink, ImageLinkResponse, LinkCandidate, LinkQuery, LinkResponse,
};
use craterdex_detect::{detect, DetectOptions, GrayImage};
use craterdex_engine::Engine;
use craterdex_model::preprocess::DecodeLimits;
use craterdex_workflows::link::crop_turn_deg;
use craterdex_workflows::{link_images, ImageLinkOptions, ObservedImage};
use craterdex_workflows::{Candidate, Decision, LinkOptions, LinkRow, LinkRule, Neighbours};
use std::sync::{Arc, Mutex, Weak};

/// The index's link rule and the grid of its positions, made once per engine version.
type Context = Arc<(LinkRule, Neighbours)>;

#[derive(Default)]
pub struct ContextCache(Mutex<Option<(Weak<Engine>, Context)>>);

pub(crate) fn context(svc: &Service, engine: &Arc<Engine>) -> ApiResult<Context> {
    let mut cache = svc.link_context.0.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((made_for, ctx)) = cache.as_ref() {
        if made_for.upgrade().is_some_and(|e| Arc::ptr_eq(&e, engine)) {
            return Ok(ctx.clone());
        }
    }
    let rule = match engine.index().dir() {
        Some(dir) => LinkRule::for_index(dir)?,
        None => LinkRule::default(),
    };
    let near = Neighbours::of_index(engine.index(), &rule, &craterdex_workflows::Frames::none());
    let ctx = Arc::new((rule, near));
    *cache = Some((Arc::downgrade(engine), ctx.clone()));
    Ok(ctx)
}

/// The decision for one entry against `engine`, and where its rule came from. An entry of a
/// source registered before (`POST /v1/register`) is placed by its transform, its crop
/// turned to the catalogue's orientation.
fn decide(
    svc: &Service,
    engine: &Arc<Engine>,
    entry: &EntryUpload,
) -> ApiResult<(LinkRow, String)> {
    let ctx = context(svc, engine)?;
    let (rule, near) = (&ctx.0, &ctx.1);
    let opts = LinkOptions::default();
    let frames = svc
        .registrations
        .frames_for(entry.meta.source.as_deref(), rule);
    let turn = frames
        .place(&entry.meta)
        .registration
        .and_then(|r| crop_turn_deg(r));
    let turned = match turn {
        Some(deg) => {
            Some(engine.encode_image_turned(&entry.upload.image, deg.to_radians() as f32)?)
        }
        None => None,
    };
    let desc = turned.as_ref().unwrap_or(&entry.desc);
    let row =
        craterdex_workflows::link_one(engine, near, rule, &opts, &frames, entry.meta.clone(), desc);
    Ok((row, rule.source.clone()))
}

fn with_thumbnail(c: Candidate) -> LinkCandidate {
    LinkCandidate {
        thumbnail: thumbnail_url(&c.id),
        candidate: c,
    }
}

/// `POST /v1/link`: [`craterdex_api::paths::link_image`].
pub async fn link_image(
    State(svc): State<Svc>,
    Extension(admission): Extension<Admission>,
    headers: HeaderMap,
    q: Result<Query<LinkQuery>, QueryRejection>,
    mp: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> ApiResult<Json<LinkResponse>> {
    let timeout = svc.config().request_timeout;
    let deadline = work::deadline(timeout);
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    authorize(&svc, &headers, q.insert)?;
    let mp = mp.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (bytes, meta) = work::before(Some(deadline), timeout, read_entry_form(mp)).await?;
    let engine = image_engine(&svc)?;
    let svc2 = svc.clone();
    let (mut row, rule, images) = work::run(admission, Some((deadline, timeout)), move |ticket| {
        let entry = entry_of(&svc2, &engine, bytes, meta)?;
        if !q.insert {
            let engine = svc2.snapshot()?;
            let (row, rule) = decide(&svc2, &engine, &entry)?;
            return Ok((row, rule, engine.index().live()));
        }
        svc2.shared()?.write(|engine| -> ApiResult<_> {
            let (mut row, rule) = decide(&svc2, engine, &entry)?;
            if row.decision != Decision::New || id_taken(engine, &entry.meta.id).is_some() {
                return Ok(((row, rule, engine.index().live()), None));
            }
            ticket.commit()?;
            let meta = store_upload(&svc2, &entry)?;
            let (_, grown) = engine.add(&[(meta, entry.desc.clone())])?;
            row.inserted = true;
            Counters::count(&svc2.counters.added);
            Ok(((row, rule, grown.index().live()), Some(grown)))
        })
    })
    .await?;
    row.query.path = None;
    let registration = row.registration.take().map(|r| (*r).clone());
    Ok(Json(LinkResponse {
        registered: registration.as_ref().is_some_and(|r| r.registered),
        registration,
        query: row.query,
        decision: row.decision,
        confidence: row.confidence,
        best: row.best.take().map(with_thumbnail),
        second: row.second.take().map(with_thumbnail),
        inserted: row.inserted,
        images,
        rule,
    }))
}

/// How a server detects: tiles of [`SERVER_DETECT_TILE`] px, half the command line's side,
/// so that each request running the detector holds less working memory at once (the
/// layers' maps scale with the tile's area).
pub const SERVER_DETECT_TILE: usize = 512;

fn server_detect_options() -> DetectOptions {
    DetectOptions {
        max_tile: SERVER_DETECT_TILE,
        ..Default::default()
    }
}

/// `POST /v1/link/image`: [`craterdex_api::paths::link_whole_image`].
pub async fn link_whole_image(
    State(svc): State<Svc>,
    Extension(admission): Extension<Admission>,
    headers: HeaderMap,
    mp: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> ApiResult<Json<ImageLinkResponse>> {
    let timeout = svc.config().request_timeout;
    let deadline = work::deadline(timeout);
    authorize(&svc, &headers, false)?;
    let detector = svc.detector.get().cloned().ok_or_else(|| {
        ApiError::new(
            axum::http::StatusCode::NOT_IMPLEMENTED,
            "this server has no crater detector: start it with --detector",
        )
    })?;
    let mp = mp.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (bytes, _) = work::before(Some(deadline), timeout, read_multipart(mp, &[])).await?;
    let engine = image_engine(&svc)?;
    Counters::count(&svc.counters.image_searches);
    let svc2 = svc.clone();
    work::run(admission, Some((deadline, timeout)), move |ticket| {
        let side = svc2.config().max_image_side;
        let limits = DecodeLimits {
            max_pixels: Some(u64::from(side) * u64::from(side)),
            max_side: Some(side),
            allow_partial: svc2.config().allow_partial_images,
        };
        let decoded = craterdex_model::preprocess::decode(&bytes, &limits)?;
        let gray = GrayImage::from_dynamic(&decoded.image);
        drop(decoded);
        let (config, net) = (&detector.0, &detector.1);
        let detections = detect(net, config, &gray, &server_detect_options(), &|_| ())?;
        let ctx = context(&svc2, &engine)?;
        let rule = &ctx.0;
        let observed = [ObservedImage {
            source: "upload".into(),
            image: &gray,
            detections,
        }];
        let links = link_images(
            &engine,
            &observed,
            rule,
            &LinkOptions::default(),
            &ImageLinkOptions::default(),
            ticket,
        )?;
        let image = links
            .images
            .into_iter()
            .next()
            .ok_or_else(|| ApiError::internal("the image was not linked"))?;
        let shown = |c: Candidate| {
            with_thumbnail(Candidate {
                meta: svc2.shown(c.meta.clone()),
                ..c
            })
        };
        let craters = links
            .craters
            .into_iter()
            .map(|c| ImageCraterLink {
                id: c.link.query.id.clone(),
                x: c.x,
                y: c.y,
                diameter_px: c.diameter_px,
                found_by: c.found_by,
                detector_score: c.detector_score,
                decision: c.decision,
                confidence: c.link.confidence,
                best: c.link.best.map(shown),
                second: c.link.second.map(shown),
            })
            .collect();
        Ok(Json(ImageLinkResponse {
            image,
            craters,
            detector: config.name.clone(),
            detector_precision: net.precision().name().into(),
            rule: rule.source.clone(),
        }))
    })
    .await
}
