//! Indexed images: their metadata and thumbnails, and adding and removing them through the
//! index's atomic path (the engine's writer, one write at a time).

use crate::auth::{authorize, path_id};
use crate::error::{ApiError, ApiResult};
use crate::search::image_engine;
use crate::upload::{entry_of, read_entry_form, EntryUpload};
use crate::work::{self, Admission};
use crate::{Counters, Service, Svc};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Multipart, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use craterdex_api::readers::{stored_upload, thumbnail_png, thumbnail_url};
use craterdex_api::types::{AddedResponse, ImageResponse, RemovedResponse, ThumbnailQuery};
use craterdex_engine::{Engine, ImageMeta};

fn live_row(engine: &Engine, id: &str) -> ApiResult<usize> {
    engine
        .index()
        .row_of(id)
        .ok_or_else(|| ApiError::not_found(format!("no image {id:?} in the index")))
}

/// `GET /v1/images/{id}`: [`craterdex_api::paths::image_meta`].
pub async fn image_meta(
    State(svc): State<Svc>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<ImageResponse>> {
    authorize(&svc, &headers, false)?;
    let id = path_id(id)?;
    let engine = svc.snapshot()?;
    let meta = svc.shown(engine.index().meta(live_row(&engine, &id)?).clone());
    Ok(Json(ImageResponse {
        thumbnail: thumbnail_url(&meta.id),
        id: meta.id.clone(),
        meta,
    }))
}

/// `GET /v1/images/{id}/thumbnail`: [`craterdex_api::paths::thumbnail`].
pub async fn thumbnail(
    State(svc): State<Svc>,
    Extension(admission): Extension<Admission>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<ThumbnailQuery>, QueryRejection>,
) -> ApiResult<Response> {
    authorize(&svc, &headers, false)?;
    let id = path_id(id)?;
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let size = q.size.unwrap_or(160);
    if !(16..=512).contains(&size) {
        return Err(ApiError::bad_request("size must be between 16 and 512"));
    }
    let engine = svc.snapshot()?;
    let row = live_row(&engine, &id)?;
    // The file comes from the index's own metadata, never from the request.
    let Some(path) = engine.index().meta(row).path.clone() else {
        return Err(ApiError::not_found(format!(
            "no image file is recorded for {id:?}"
        )));
    };
    let png = work::run(admission, None, move |_| {
        thumbnail_png(std::path::Path::new(&path), &id, size)
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

/// Why an id cannot be added to the index now, if it cannot.
pub fn id_taken(engine: &Engine, id: &str) -> Option<ApiError> {
    let index = engine.index();
    let why = if index.row_of(id).is_some() {
        format!("the index already has an image {id:?}")
    } else if index.was_removed(id) {
        format!("{id:?} was removed; its id can be used again once the index is rebuilt")
    } else {
        return None;
    };
    Some(ApiError::new(StatusCode::CONFLICT, why))
}

/// Stores the uploaded file (named by its SHA-256) and returns the entry's metadata with
/// that path, for thumbnails.
pub fn store_upload(svc: &Service, entry: &EntryUpload) -> ApiResult<ImageMeta> {
    let up = &entry.upload;
    let path = stored_upload(&svc.config().upload_dir, &up.bytes, up.format)?;
    Ok(ImageMeta {
        path: Some(path),
        ..entry.meta.clone()
    })
}

/// Deletes the stored upload at `path` once no image of `engine` (the index after a removal)
/// is read from it: uploads are named by their content, so two ids can share one file.
/// Files outside the upload directory are the operator's and stay.
fn forget_upload(svc: &Service, engine: &Engine, path: &str) {
    let uploads = std::fs::canonicalize(&svc.config().upload_dir);
    let stored = uploads.is_ok_and(|dir| std::path::Path::new(path).parent() == Some(&dir));
    let index = engine.index();
    let shared = index
        .live_rows()
        .any(|r| index.meta(r).path.as_deref() == Some(path));
    if stored && !shared {
        // a file left behind costs disk, not correctness
        let _ = std::fs::remove_file(path);
    }
}

/// `POST /v1/images`: [`craterdex_api::paths::add_image`].
pub async fn add_image(
    State(svc): State<Svc>,
    Extension(admission): Extension<Admission>,
    headers: HeaderMap,
    mp: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> ApiResult<(StatusCode, Json<AddedResponse>)> {
    authorize(&svc, &headers, true)?;
    let timeout = svc.config().request_timeout;
    let deadline = work::deadline(timeout);
    let mp = mp.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (bytes, meta) = work::before(Some(deadline), timeout, read_entry_form(mp)).await?;
    let engine = image_engine(&svc)?;
    let svc2 = svc.clone();
    let (id, images) = work::run(admission, Some((deadline, timeout)), move |ticket| {
        let entry = entry_of(&svc2, &engine, bytes, meta)?;
        let id = entry.meta.id.clone();
        let images = svc2.shared()?.write(|engine| -> ApiResult<_> {
            if let Some(taken) = id_taken(engine, &entry.meta.id) {
                return Err(taken);
            }
            ticket.commit()?;
            let meta = store_upload(&svc2, &entry)?;
            let (_, grown) = engine.add(&[(meta, entry.desc)])?;
            Ok((grown.index().live(), Some(grown)))
        })?;
        Ok((id, images))
    })
    .await?;
    Counters::count(&svc.counters.added);
    Ok((
        StatusCode::CREATED,
        Json(AddedResponse {
            thumbnail: thumbnail_url(&id),
            id,
            images,
        }),
    ))
}

/// `DELETE /v1/images/{id}`: [`craterdex_api::paths::remove_image`].
pub async fn remove_image(
    State(svc): State<Svc>,
    Extension(admission): Extension<Admission>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<RemovedResponse>> {
    let timeout = svc.config().request_timeout;
    let deadline = work::deadline(timeout);
    authorize(&svc, &headers, true)?;
    let id = path_id(id)?;
    let svc2 = svc.clone();
    let id2 = id.clone();
    let images = work::run(admission, Some((deadline, timeout)), move |ticket| {
        svc2.shared()?.write(|engine| -> ApiResult<_> {
            let path = engine.index().meta(live_row(engine, &id2)?).path.clone();
            ticket.commit()?;
            let (_, shrunk) = engine.remove(&[id2])?;
            if let Some(path) = path {
                forget_upload(&svc2, &shrunk, &path);
            }
            Ok((shrunk.index().live(), Some(shrunk)))
        })
    })
    .await?;
    Counters::count(&svc.counters.removed);
    Ok(Json(RemovedResponse {
        removed: id,
        images,
    }))
}
