//! What one image search may cost in memory, measured by a counting allocator: a 16-bit
//! RGBA PNG of 4096 x 4096 pixels (a few hundred KB on the wire, 128 MiB decoded) searched
//! by default (rechecked: up to 25 views of the query) through the service. Its own binary,
//! so that no other test allocates while it measures.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use craterdex_engine::{Engine, Entries, Extractor, ImageMeta, IndexRecipe, ModelOptions, Silent};
use craterdex_serve::{router, Config, Service};
use image::{GrayImage, Luma};
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tower::ServiceExt;

/// The system allocator, counting the bytes live and the most live since the last reset.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the system allocator's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A 16-bit RGBA PNG of `side` x `side`: a dark square bowl in blocks of 256 pixels, which
/// compresses to little.
fn sixteen_bit_png(side: u32) -> Vec<u8> {
    let img = image::ImageBuffer::<image::Rgba<u16>, _>::from_fn(side, side, |x, y| {
        let (bx, by) = (x / 256, y / 256);
        let inside = (5..11).contains(&bx) && (5..11).contains(&by);
        let v = if inside {
            9_000
        } else {
            30_000 + 1_000 * (bx + by) as u16
        };
        image::Rgba([v, v, v, 65_535])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    image::DynamicImage::ImageRgba16(img)
        .write_to(&mut out, image::ImageFormat::Png)
        .unwrap();
    out.into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_sixteen_bit_upload_costs_what_a_crop_does() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let model_dir = craterdex_model::testing::import_tiny_model(root, "tiny", 32, 4, 4, 1);
    let options = ModelOptions {
        model: Some(model_dir),
        size: Some(16),
        cache: false,
        ..Default::default()
    };
    let extractor = Arc::new(Extractor::load(&options, &Silent).unwrap());
    std::fs::create_dir_all(root.join("crops")).unwrap();
    let metas: Vec<ImageMeta> = (0..8u32)
        .map(|i| {
            let path = root.join(format!("crops/c{i}.png"));
            GrayImage::from_fn(48, 48, |x, y| {
                let d = (x as f32 - 10.0 - 3.0 * i as f32).hypot(y as f32 - 24.0);
                Luma([if d < 8.0 {
                    60
                } else {
                    (100 + x + y + 9 * i) as u8
                }])
            })
            .save(&path)
            .unwrap();
            ImageMeta {
                id: format!("c{i}"),
                path: Some(path.display().to_string()),
                ..Default::default()
            }
        })
        .collect();
    let index = root.join("idx");
    let entries = Entries::from_metas(metas).unwrap();
    Engine::build(
        &index,
        &entries,
        &IndexRecipe::default(),
        extractor.clone(),
        &Silent,
    )
    .unwrap();
    let mut config = Config::new(index.clone());
    config.upload_dir = root.join("uploads");
    let svc = Service::new(config);
    svc.load(Some(Extractor::load(&options, &Silent).unwrap()))
        .unwrap();

    let png = sixteen_bit_png(4096);
    assert!(png.len() < 4 << 20, "{} bytes", png.len());
    let boundary = "memoryTestBoundary";
    let mut body = Vec::new();
    write!(
        body,
        "--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"q.png\"\r\n\r\n"
    )
    .unwrap();
    body.extend_from_slice(&png);
    write!(body, "\r\n--{boundary}--\r\n").unwrap();
    let request = Request::post("/v1/search/image")
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(Body::from(body))
        .unwrap();
    let app = router(svc.clone());
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let resp = app.oneshot(request).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let peak = PEAK.load(Ordering::Relaxed) - before;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["query"]["width"], 4096, "{v}");
    // decoding alone holds the 128 MiB of pixels; every view, float copy and forward pass
    // after it works on the image reduced to 448 pixels a side. Before, each of the
    // rechecked search's views converted the full image to floating point (about 5 GB).
    const MIB: usize = 1 << 20;
    eprintln!("peak allocated by the request: {} MiB", peak / MIB);
    assert!(peak < 400 * MIB, "{} MiB", peak / MIB);
}
