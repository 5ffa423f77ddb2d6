//! Registering a new observation's craters to the catalogue (`POST /v1/register`) ahead of
//! linking its crops one at a time (`POST /v1/link` with the same `source`): one crop is no
//! pattern, the image's craters are. The service keeps the latest registrations of the most
//! recent sources.

use crate::auth::authorize_change;
use crate::error::{ApiError, ApiResult};
use crate::work::{self, Admission};
use crate::Svc;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, State};
use axum::http::HeaderMap;
use axum::{Extension, Json};
use craterdex_api::types::RegisterRequest;
use craterdex_engine::ImageMeta;
use craterdex_workflows::{Frames, LinkOptions, LinkRule, SourceRegistration};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Sources whose registration the service keeps (the oldest is forgotten first).
pub const KEPT_SOURCES: usize = 4096;

/// Each source's registration, and the sources oldest first.
type Kept = (HashMap<String, Arc<SourceRegistration>>, VecDeque<String>);

/// The latest registration of each recent source.
#[derive(Default)]
pub struct Registrations(Mutex<Kept>);

impl Registrations {
    pub fn get(&self, source: &str) -> Option<Arc<SourceRegistration>> {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.0.get(source).cloned()
    }

    /// Keeps `reg` as `source`'s registration, unless it failed where the one kept
    /// succeeded: a failed attempt never undoes a good registration.
    fn put(&self, source: String, reg: Arc<SourceRegistration>) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (by_source, order) = &mut *kept;
        if !reg.registered && by_source.get(&source).is_some_and(|r| r.registered) {
            return;
        }
        if by_source.insert(source.clone(), reg).is_none() {
            order.push_back(source);
        }
        while order.len() > KEPT_SOURCES {
            if let Some(old) = order.pop_front() {
                by_source.remove(&old);
            }
        }
    }

    /// The frames that place an entry of `source` (none known: as given).
    pub fn frames_for(&self, source: Option<&str>, rule: &LinkRule) -> Frames {
        match source.and_then(|s| self.get(s)) {
            Some(reg) => Frames::of_registrations([(*reg).clone()], rule.body_radius_km),
            None => Frames::none(),
        }
    }
}

/// Well-formed JSON whose content cannot be registered.
fn unprocessable(message: impl Into<String>) -> ApiError {
    ApiError::new(axum::http::StatusCode::UNPROCESSABLE_ENTITY, message)
}

fn metas_of(req: &RegisterRequest) -> ApiResult<Vec<ImageMeta>> {
    if req.source.trim().is_empty() || req.source.len() > 256 {
        return Err(unprocessable(
            "source: give the image's name (1 to 256 characters)",
        ));
    }
    req.craters
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let pixels = [c.x, c.y, c.diameter_px];
            let body = [c.lat, c.lon, c.diameter_km];
            let full = |v: &[Option<f64>; 3]| v.iter().all(|x| x.is_some_and(f64::is_finite));
            if !full(&pixels) && !full(&body) {
                return Err(unprocessable(format!(
                    "craters[{i}]: give finite x, y and diameter_px, or lat, lon and diameter_km"
                )));
            }
            let meta = ImageMeta {
                id: format!("{}#{i}", req.source),
                source: Some(req.source.clone()),
                x: c.x,
                y: c.y,
                diameter_px: c.diameter_px,
                lat: c.lat,
                lon: c.lon,
                diameter_km: c.diameter_km,
                ..ImageMeta::default()
            };
            match meta.position_problem() {
                Some(problem) => Err(unprocessable(format!("craters[{i}]: {problem}"))),
                None => Ok(meta),
            }
        })
        .collect()
}

/// `POST /v1/register`: [`craterdex_api::paths::register_source`].
pub async fn register_source(
    State(svc): State<Svc>,
    Extension(admission): Extension<Admission>,
    headers: HeaderMap,
    request: axum::extract::Request,
) -> ApiResult<Json<SourceRegistration>> {
    let timeout = svc.config().request_timeout;
    let deadline = work::deadline(timeout);
    // the key is checked before the body is read
    authorize_change(&svc, &headers)?;
    let read = async {
        let body: Result<Json<RegisterRequest>, JsonRejection> =
            Json::from_request(request, &()).await;
        body.map_err(|e| ApiError::new(e.status(), e.body_text()))
    };
    let Json(req) = work::before(Some(deadline), timeout, read).await?;
    let metas = metas_of(&req)?;
    let engine = svc.snapshot()?;
    let svc2 = svc.clone();
    let reg = work::run(admission, Some((deadline, timeout)), move |ticket| {
        let rule = crate::link::context(&svc2, &engine)?.0.clone();
        let frames =
            craterdex_workflows::register_entries(&engine, &rule, &LinkOptions::default(), &metas);
        let reg = frames
            .registrations()
            .into_iter()
            .next()
            .ok_or_else(|| unprocessable("no crater with a position"))?;
        ticket.commit()?;
        svc2.registrations.put(req.source, reg.clone());
        Ok(reg)
    })
    .await?;
    Ok(Json((*reg).clone()))
}
