//! The map layers the workflows write, opened with GDAL/OGR (what QGIS reads them with):
//! their body's coordinate system, features, rims, and the GeoPackage with its styles.
#![cfg(feature = "gdal")]

use gdal::vector::LayerAccess;

/// The GeoJSON the workflows write opens in GDAL/OGR (what QGIS reads it with) on its own
/// body: the Moon's IAU 2015 coordinate system, the features and their positions, a 0-360
/// longitude as given.
#[test]
fn link_outputs_open_in_ogr_on_their_body() {
    use craterdex_index::ImageMeta;
    use craterdex_workflows::{Decision, LinkRow};
    let tmp = tempfile::tempdir().unwrap();
    let row = |id: &str, lat: f64, lon: f64| LinkRow {
        query: ImageMeta {
            id: id.into(),
            lat: Some(lat),
            lon: Some(lon),
            diameter_km: Some(2.0),
            ..Default::default()
        },
        decision: Decision::New,
        confidence: 0.0,
        best: None,
        second: None,
        inserted: false,
        candidates: Vec::new(),
        registration: None,
    };
    let rows = [row("a", 10.0, 350.5), row("b", -20.0, 12.25)];
    let map = craterdex_workflows::output::MapLayers {
        body_radius_km: 1737.4,
        rims: true,
    };
    let files = craterdex_workflows::output::write_links(tmp.path(), &rows, &map).unwrap();
    let gpkg = tmp.path().join("links.gpkg");
    assert!(files.contains(&gpkg), "{files:?}");
    assert!(!tmp.path().join("links.gpkg.partial").exists());
    let on_the_moon = |layer: &gdal::vector::Layer| {
        let srs = layer.spatial_ref().expect("a coordinate system");
        // PROJ names the authority IAU_2015; some GDAL versions report it as IAU
        let authority = srs.auth_name().unwrap();
        assert!(authority.starts_with("IAU"), "{authority}");
        assert_eq!(srs.auth_code().unwrap(), 30100);
        assert!(srs.name().unwrap().contains("Moon"), "{:?}", srs.name());
        assert!((srs.semi_major().unwrap() - 1_737_400.0).abs() < 1.0);
    };
    let geojson = gdal::Dataset::open(tmp.path().join("links.geojson")).unwrap();
    let package = gdal::Dataset::open(&gpkg).unwrap();
    for mut layer in [
        geojson.layer(0).unwrap(),
        package.layer_by_name("links").unwrap(),
    ] {
        on_the_moon(&layer);
        let points: Vec<(f64, f64, String)> = layer
            .features()
            .map(|f| {
                let (x, y, _) = f.geometry().unwrap().get_point(0);
                (x, y, text(&f, "decision"))
            })
            .collect();
        assert_eq!(
            points,
            vec![(350.5, 10.0, "new".into()), (12.25, -20.0, "new".into())]
        );
    }
    // rims: a 2 km crater's ring, 1 km from its centre all round, in both files
    for mut rims in [
        gdal::Dataset::open(tmp.path().join("links_rims.geojson")).unwrap(),
        gdal::Dataset::open(&gpkg).unwrap(),
    ]
    .iter()
    .map(|d| d.layer_by_name_or_first("links_rims"))
    {
        on_the_moon(&rims);
        let first = rims.features().next().unwrap();
        let ring = first.geometry().unwrap().get_geometry(0);
        assert_eq!(ring.point_count(), 65);
        let (lon, lat, _) = ring.get_point(16);
        let km = craterdex_workflows::geometry::distance_km((10.0, 350.5), (lat, lon), 1737.4);
        assert!((km - 1.0).abs() < 1e-6, "{km}");
    }
    // each layer's QGIS style is the GeoPackage's default for it
    let mut styles = package.layer_by_name("layer_styles").unwrap();
    let styled: Vec<(String, i32, bool)> = styles
        .features()
        .map(|f| {
            (
                text(&f, "f_table_name"),
                f.field_as_integer(f.field_index("useAsDefault").unwrap())
                    .unwrap()
                    .unwrap(),
                text(&f, "styleQML").contains(r#"attr="decision""#),
            )
        })
        .collect();
    assert_eq!(
        styled,
        vec![("links".into(), 1, true), ("links_rims".into(), 1, true)]
    );
}

fn text(f: &gdal::vector::Feature, field: &str) -> String {
    f.field_as_string(f.field_index(field).unwrap())
        .unwrap()
        .unwrap_or_default()
}

trait LayerByName {
    fn layer_by_name_or_first(&self, name: &str) -> gdal::vector::Layer<'_>;
}

impl LayerByName for gdal::Dataset {
    /// The layer `name` of a GeoPackage, or a GeoJSON file's one layer.
    fn layer_by_name_or_first(&self, name: &str) -> gdal::vector::Layer<'_> {
        self.layer_by_name(name).or_else(|_| self.layer(0)).unwrap()
    }
}
