//! GeoPackage output through GDAL's GPKG driver: the GeoJSON layers a workflow wrote, copied
//! with their coordinate system into one file, each with its QGIS style as the layer's
//! default (the `layer_styles` table QGIS reads and writes). The file appears whole or not
//! at all: it is written beside its final name and renamed.

use crate::error::{Error, Result};
use gdal::vector::{FieldDefn, LayerAccess, LayerOptions};
use gdal::{Dataset, DriverManager};
use gdal_sys::{OGRFieldType, OGRwkbGeometryType};
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// Columns of QGIS's `layer_styles` table, as QGIS creates it (text widths included).
const STYLE_COLUMNS: [(&str, u32, i32); 12] = [
    ("f_table_catalog", OGRFieldType::OFTString, 256),
    ("f_table_schema", OGRFieldType::OFTString, 256),
    ("f_table_name", OGRFieldType::OFTString, 256),
    ("f_geometry_column", OGRFieldType::OFTString, 256),
    ("styleName", OGRFieldType::OFTString, 30),
    ("styleQML", OGRFieldType::OFTString, 0),
    ("styleSLD", OGRFieldType::OFTString, 0),
    ("useAsDefault", OGRFieldType::OFTInteger, 0),
    ("description", OGRFieldType::OFTString, 0),
    ("owner", OGRFieldType::OFTString, 30),
    ("ui", OGRFieldType::OFTString, 30),
    ("update_time", OGRFieldType::OFTDateTime, 0),
];

/// `layers`: (layer name, its GeoJSON file, its QML style).
pub(crate) fn write(path: &Path, layers: &[(String, PathBuf, String)]) -> Result<()> {
    let partial = path.with_extension("gpkg.partial");
    let _ = std::fs::remove_file(&partial);
    let written = fill(&partial, layers);
    let done = written.and_then(|()| {
        std::fs::rename(&partial, path).map_err(|e| {
            Error::MapLayer(format!("cannot move {} into place: {e}", partial.display()))
        })
    });
    if done.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    done.map_err(|e| Error::MapLayer(format!("{}: {e}", path.display())))
}

fn fill(partial: &Path, layers: &[(String, PathBuf, String)]) -> Result<()> {
    let gdal_error =
        |what: &str, e: gdal::errors::GdalError| Error::MapLayer(format!("{what}: {e}"));
    let driver = DriverManager::get_driver_by_name("GPKG")
        .map_err(|e| gdal_error("GDAL has no GeoPackage driver", e))?;
    let mut out = driver
        .create_vector_only(partial)
        .map_err(|e| gdal_error("cannot create the GeoPackage", e))?;
    for (name, geojson, _) in layers {
        let source = Dataset::open(geojson)
            .map_err(|e| gdal_error(&format!("cannot read {}", geojson.display()), e))?;
        let layer = source
            .layer(0)
            .map_err(|e| gdal_error(&format!("{} has no layer", geojson.display()), e))?;
        let c_name = CString::new(name.as_str())
            .map_err(|_| Error::MapLayer(format!("layer name {name:?}")))?;
        // GDALDatasetCopyLayer keeps the fields, their types, the geometries and the
        // coordinate system; the gdal crate has no wrapper for it.
        let copied = unsafe {
            gdal_sys::GDALDatasetCopyLayer(
                out.c_dataset(),
                layer.c_layer(),
                c_name.as_ptr(),
                std::ptr::null_mut(),
            )
        };
        if copied.is_null() {
            return Err(Error::MapLayer(format!(
                "GDAL could not copy {} into the GeoPackage",
                geojson.display()
            )));
        }
    }
    let styles = out
        .create_layer(LayerOptions {
            name: "layer_styles",
            ty: OGRwkbGeometryType::wkbNone,
            ..Default::default()
        })
        .map_err(|e| gdal_error("cannot add the styles table", e))?;
    for (column, kind, width) in STYLE_COLUMNS {
        let field = FieldDefn::new(column, kind).map_err(|e| gdal_error(column, e))?;
        if width > 0 {
            field.set_width(width);
        }
        field
            .add_to_layer(&styles)
            .map_err(|e| gdal_error(column, e))?;
    }
    for (name, _, qml) in layers {
        let mut style =
            gdal::vector::Feature::new(styles.defn()).map_err(|e| gdal_error("a style row", e))?;
        let text = [
            ("f_table_catalog", ""),
            ("f_table_schema", ""),
            ("f_table_name", name.as_str()),
            ("f_geometry_column", "geom"),
            ("styleName", name.as_str()),
            ("styleQML", qml.as_str()),
            ("description", "craterdex"),
        ];
        for (column, value) in text {
            let i = style
                .field_index(column)
                .map_err(|e| gdal_error(column, e))?;
            style
                .set_field_string(i, value)
                .map_err(|e| gdal_error(column, e))?;
        }
        let i = style
            .field_index("useAsDefault")
            .map_err(|e| gdal_error("useAsDefault", e))?;
        style
            .set_field_integer(i, 1)
            .map_err(|e| gdal_error("useAsDefault", e))?;
        style
            .create(&styles)
            .map_err(|e| gdal_error("a style row", e))?;
    }
    out.close()
        .map_err(|e| gdal_error("cannot finish the GeoPackage", e))?;
    Ok(())
}
