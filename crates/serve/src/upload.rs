//! Uploads: multipart forms (the `image` file part and text fields), the entry an add or a
//! link carries, and the image itself, decoded the one way craterdex decodes images
//! (`craterdex_model::preprocess::decode`).

use crate::error::{ApiError, ApiResult};
use crate::Service;
use axum::body::Bytes;
use axum::extract::Multipart;
use craterdex_api::readers::{entry_meta, upload_id, ENTRY_FIELDS};
use craterdex_engine::{Descriptors, Engine, ImageMeta};
use craterdex_model::preprocess::{self, DecodeLimits, MAX_CROP_PIXELS};
use std::collections::BTreeMap;

/// A decoded upload and its bytes (kept for the upload directory and thumbnails).
pub struct Upload {
    pub bytes: Bytes,
    /// The image as the model's views read it: reduced to `engine`'s query side when larger
    /// ([`decode`]).
    pub image: image::DynamicImage,
    /// The size it was uploaded at.
    pub width: u32,
    pub height: u32,
    pub format: image::ImageFormat,
}

/// Decodes an upload within the service's limits, then reduces it to what a search of it
/// reads (shorter side at most `engine`'s [`craterdex_engine::Extractor::query_short_side`],
/// 8 bits): every view of a search and every copy in floating point is made from that, so
/// that a 4096-pixel 16-bit upload costs what a crop does.
pub fn decode(svc: &Service, engine: &Engine, bytes: Bytes) -> ApiResult<Upload> {
    let limits = DecodeLimits {
        max_pixels: Some(MAX_CROP_PIXELS),
        max_side: Some(svc.config().max_image_side),
        allow_partial: svc.config().allow_partial_images,
    };
    let decoded = preprocess::decode(&bytes, &limits)?;
    let (width, height) = (decoded.image.width(), decoded.image.height());
    let image = match engine.extractor() {
        Some(x) => preprocess::reduced(decoded.image, x.query_short_side()),
        None => decoded.image,
    };
    Ok(Upload {
        bytes,
        image,
        width,
        height,
        format: decoded.format,
    })
}

/// The fields of a multipart upload: the file part `image` and the text parts `known`.
pub async fn read_multipart(
    mut mp: Multipart,
    known: &[&str],
) -> ApiResult<(Bytes, BTreeMap<String, String>)> {
    let mp_err =
        |e: axum::extract::multipart::MultipartError| ApiError::new(e.status(), e.body_text());
    let mut image = None;
    let mut fields = BTreeMap::new();
    while let Some(field) = mp.next_field().await.map_err(mp_err)? {
        let name = field.name().unwrap_or("").to_string();
        if name == "image" || (image.is_none() && field.file_name().is_some()) {
            image = Some(field.bytes().await.map_err(mp_err)?);
        } else if !known.contains(&name.as_str()) {
            let expected = if known.is_empty() {
                "expected only image".to_string()
            } else {
                format!("expected image and {known:?}")
            };
            return Err(ApiError::bad_request(format!(
                "unknown form field {name:?}; {expected}"
            )));
        } else {
            let text = field.text().await.map_err(mp_err)?;
            fields.insert(name, text);
        }
    }
    let image = image
        .ok_or_else(|| ApiError::bad_request("multipart form without an `image` file part"))?;
    Ok((image, fields))
}

/// An entry uploaded as a multipart form: the decoded image, its metadata (the id defaults
/// to `upload-<sha256 prefix>`) and its descriptors.
pub struct EntryUpload {
    pub upload: Upload,
    pub meta: ImageMeta,
    pub desc: Descriptors,
}

/// Reads and checks an entry form: the image's bytes and the entry's metadata.
pub async fn read_entry_form(mp: Multipart) -> ApiResult<(Bytes, ImageMeta)> {
    let (bytes, fields) = read_multipart(mp, &ENTRY_FIELDS).await?;
    Ok((bytes, entry_meta(&fields)?))
}

/// An entry form's image decoded and encoded with `engine`'s model (CPU work: run it off the
/// async threads); an entry without an id is named by its content.
pub fn entry_of(
    svc: &Service,
    engine: &Engine,
    bytes: Bytes,
    mut meta: ImageMeta,
) -> ApiResult<EntryUpload> {
    let upload = decode(svc, engine, bytes)?;
    let desc = engine.encode_image(&upload.image)?;
    if meta.id.is_empty() {
        meta.id = upload_id(&upload.bytes);
    }
    Ok(EntryUpload { upload, meta, desc })
}
