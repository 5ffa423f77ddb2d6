//! The OpenAPI document, generated from the routes' `#[utoipa::path]` declarations
//! (`paths.rs`) and the request and response types (`types.rs`, and the engine's and
//! workflows' own types behind their `openapi` feature). What only the running server knows
//! (its limits, its index's feature width) is written into the generated document's typed
//! model as it is served.

use crate::types;
use craterdex_engine::{QueryKind, SearchLimits, MAX_RECHECK_VIEWS};
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{ArrayItems, Schema};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{OpenApi as Document, RefOr};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "craterdex",
        version = "1",
        description = "Search a crater index by image, by backbone features or by an indexed image, \
and link new crater images to it. Reads are open unless the server protects them; writes need the \
API key (header X-Api-Key or Authorization: Bearer). Errors are JSON: {\"error\": {\"status\", \
\"message\"}}. A request answered 503 found the server at its concurrency limit (or not ready) and \
may be retried."
    ),
    paths(
        crate::paths::health,
        crate::paths::ready,
        crate::paths::openapi,
        crate::paths::stats,
        crate::paths::search_image,
        crate::paths::search_features,
        crate::paths::search_similar,
        crate::paths::image_meta,
        crate::paths::thumbnail,
        crate::paths::add_image,
        crate::paths::remove_image,
        crate::paths::link_image,
        crate::paths::link_whole_image,
        crate::paths::register_source,
    ),
    components(schemas(types::ErrorBody)),
    modifiers(&Security)
)]
struct ApiDoc;

/// The API key, as a header or a bearer token.
struct Security;

impl utoipa::Modify for Security {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        let key = ApiKeyValue::with_description(
            "X-Api-Key",
            "The server's key. Needed for writes; for reads too when the server protects them.",
        );
        components.add_security_scheme("apiKey", SecurityScheme::ApiKey(ApiKey::Header(key)));
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("The same key as a bearer token."))
                    .build(),
            ),
        );
    }
}

/// Every operation of the document.
fn operations(doc: &mut Document) -> impl Iterator<Item = &mut Operation> {
    doc.paths.paths.values_mut().flat_map(|item| {
        [&mut item.get, &mut item.post, &mut item.delete]
            .into_iter()
            .flatten()
    })
}

/// The document as a server answers it: its `limits` on the search parameters, and
/// `feature_dim` (the index's, once loaded) on the features a search may post.
pub fn document(limits: &SearchLimits, feature_dim: Option<usize>) -> Document {
    let mut doc = ApiDoc::openapi();
    let l = limits;
    for op in operations(&mut doc) {
        for p in op.parameters.iter_mut().flatten() {
            let max = match p.name.as_str() {
                "top_k" => l.max_top_k,
                "shortlist" => l.max_shortlist,
                "nprobe" => l.max_nprobe,
                "recheck_views" => l
                    .max_query_views
                    .map_or(MAX_RECHECK_VIEWS, |max| max.min(MAX_RECHECK_VIEWS)),
                _ => continue,
            };
            if let Some(RefOr::T(Schema::Object(o))) = &mut p.schema {
                o.maximum = Some(utoipa::Number::UInt(max));
            }
        }
    }
    // each search documents the options its kind of query can use (the engine's rule)
    for (path, item) in doc.paths.paths.iter_mut() {
        let kind = match path.as_str() {
            "/v1/search/image" => QueryKind::Image,
            "/v1/search/features" => QueryKind::Features,
            "/v1/images/{id}/similar" => QueryKind::Indexed,
            _ => continue,
        };
        let takes = |name: &str| kind.accepts(name);
        for op in [&mut item.get, &mut item.post, &mut item.delete]
            .into_iter()
            .flatten()
        {
            if let Some(params) = &mut op.parameters {
                params.retain(|p| takes(&p.name));
            }
        }
    }
    if let Some(d) = feature_dim {
        let features = doc
            .components
            .as_mut()
            .and_then(|c| c.schemas.get_mut("Features"));
        if let Some(RefOr::T(Schema::Object(f))) = features {
            let widths = [("cls", d, d), ("attention", 1, usize::MAX)];
            for (name, min, max) in widths {
                if let Some(RefOr::T(Schema::Array(a))) = f.properties.get_mut(name) {
                    a.min_items = Some(min);
                    a.max_items = (max != usize::MAX).then_some(max);
                }
            }
            if let Some(RefOr::T(Schema::OneOf(patches))) = f.properties.get_mut("patches") {
                // nested rows are D wide; the flat form is checked on arrival
                if let Some(RefOr::T(Schema::Array(rows))) = patches.items.get_mut(1) {
                    rows.min_items = Some(1);
                    if let ArrayItems::RefOrSchema(row) = &mut rows.items {
                        if let RefOr::T(Schema::Array(row)) = row.as_mut() {
                            row.min_items = Some(d);
                            row.max_items = Some(d);
                        }
                    }
                }
            }
        }
    }
    doc
}

/// The document of a server with the default limits and `feature_dim` wide features, as
/// JSON.
pub fn document_json(feature_dim: Option<usize>) -> serde_json::Value {
    serde_json::to_value(document(&crate::DEFAULT_LIMITS, feature_dim)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_describes_every_route_with_this_servers_limits() {
        let limits = SearchLimits {
            max_top_k: 77,
            max_query_views: Some(5),
            ..crate::DEFAULT_LIMITS
        };
        let doc = serde_json::to_value(document(&limits, Some(384))).unwrap();
        let paths = doc["paths"].as_object().unwrap();
        assert_eq!(paths.len(), 13, "{:?}", paths.keys());
        let similar = &doc["paths"]["/v1/images/{id}/similar"]["get"]["parameters"];
        let top_k = similar
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "top_k")
            .unwrap();
        assert_eq!(top_k["schema"]["maximum"], 77);
        assert_eq!(top_k["required"], false);
        let named = |path: &str, method: &str, name: &str| {
            doc["paths"][path][method]["parameters"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["name"] == name))
        };
        assert!(named("/v1/search/image", "post", "turns"));
        assert!(!named("/v1/search/features", "post", "turns"));
        assert!(!named("/v1/images/{id}/similar", "get", "turns"));
        assert!(named("/v1/search/image", "post", "opposite_sun"));
        assert!(!named("/v1/search/features", "post", "opposite_sun"));
        assert!(!named("/v1/images/{id}/similar", "get", "opposite_sun"));
        assert!(named("/v1/search/image", "post", "verify"));
        assert!(named("/v1/search/features", "post", "verify"));
        assert!(!named("/v1/images/{id}/similar", "get", "verify"));
        assert!(!named("/v1/search/features", "post", "recheck_views"));
        let recheck_views = doc["paths"]["/v1/search/image"]["post"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "recheck_views")
            .unwrap();
        assert_eq!(recheck_views["schema"]["maximum"], 5, "{recheck_views}");
        let open = serde_json::to_value(document(&crate::DEFAULT_LIMITS, None)).unwrap();
        let open_views = open["paths"]["/v1/search/image"]["post"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "recheck_views")
            .unwrap();
        assert_eq!(open_views["schema"]["maximum"], MAX_RECHECK_VIEWS);
        let mode = similar
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "mode")
            .unwrap();
        assert_eq!(
            mode["schema"]["enum"],
            serde_json::json!(["stage1", "two-stage", "exhaustive"])
        );
        let cls = &doc["components"]["schemas"]["Features"]["properties"]["cls"];
        assert_eq!(
            (&cls["minItems"], &cls["maxItems"]),
            (&384.into(), &384.into())
        );
        assert!(doc["components"]["securitySchemes"]["apiKey"].is_object());
    }
}
