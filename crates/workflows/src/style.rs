//! QGIS styles of the map layers: a `.qml` file beside each GeoJSON layer, which QGIS loads
//! by itself when the layer is opened, and the same style as the default of each GeoPackage
//! layer. Link decisions and dedup groups are coloured by category; detections have one colour.

/// One category of a layer: the value of its attribute, its legend label and colour.
#[derive(Clone, Copy, Debug)]
pub struct Category {
    pub value: &'static str,
    pub label: &'static str,
    pub rgb: (u8, u8, u8),
}

/// Crater centres as points, or rims as outlines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Points,
    Rims,
}

/// Link decisions (the `decision` attribute of `links.geojson`).
pub const DECISIONS: [Category; 3] = [
    Category {
        value: "match",
        label: "match: a catalogue crater",
        rgb: (26, 150, 65),
    },
    Category {
        value: "new",
        label: "new: not in the catalogue",
        rgb: (44, 123, 182),
    },
    Category {
        value: "ambiguous",
        label: "ambiguous: to review",
        rgb: (253, 141, 60),
    },
];

/// Decisions on the craters of a new image (the `decision` attribute of `links.geojson`
/// of `link --image`): the link decisions, and catalogue craters placed in the image that did
/// not look like their entry.
pub const IMAGE_DECISIONS: [Category; 4] = [
    DECISIONS[0],
    DECISIONS[1],
    DECISIONS[2],
    Category {
        value: "unconfirmed",
        label: "unconfirmed: a catalogue crater not seen where it should be",
        rgb: (150, 150, 150),
    },
];

/// The colour of craters found by the detector (`detections_lonlat`).
pub const DETECTED: (u8, u8, u8) = (255, 200, 0);

/// Entries of the merged catalogue (the `kind` attribute of `merged.geojson`).
pub const GROUPS: [Category; 2] = [
    Category {
        value: "group",
        label: "merged from duplicates",
        rgb: (215, 25, 28),
    },
    Category {
        value: "single",
        label: "no duplicate found",
        rgb: (120, 120, 120),
    },
];

/// A QGIS layer style (QML) colouring features by `attribute` in `categories`.
pub fn categorized(attribute: &str, categories: &[Category], shape: Shape) -> String {
    let mut cats = String::new();
    let mut symbols = String::new();
    for (i, c) in categories.iter().enumerate() {
        cats.push_str(&format!(
            "      <category symbol=\"{i}\" value=\"{}\" label=\"{}\" render=\"true\"/>\n",
            xml_escape(c.value),
            xml_escape(c.label)
        ));
        symbols.push_str(&symbol(&i.to_string(), c.rgb, shape));
    }
    let renderer = format!(
        "type=\"categorizedSymbol\" attr=\"{}\"",
        xml_escape(attribute)
    );
    qml(
        &renderer,
        &format!("\x20   <categories>\n{cats}\x20   </categories>\n"),
        &symbols,
        shape,
    )
}

/// A QML document whose renderer has the attributes `renderer`, then `categories` (any
/// elements before the symbols) and `symbols`, for features of `shape`.
fn qml(renderer: &str, categories: &str, symbols: &str, shape: Shape) -> String {
    let geometry_type = match shape {
        Shape::Points => 0,
        Shape::Rims => 2,
    };
    format!(
        "<!DOCTYPE qgis PUBLIC 'http://mrcc.com/qgis.dtd' 'SYSTEM'>\n\
         <qgis version=\"3.22.0\" styleCategories=\"Symbology\">\n\
         \x20 <renderer-v2 {renderer} symbollevels=\"0\" enableorderby=\"0\" forceraster=\"0\">\n\
         {categories}\
         \x20   <symbols>\n{symbols}\x20   </symbols>\n\
         \x20 </renderer-v2>\n\
         \x20 <layerGeometryType>{geometry_type}</layerGeometryType>\n\
         </qgis>\n"
    )
}

/// A QGIS layer style (QML) drawing every feature with one symbol of colour `rgb`.
pub fn single(rgb: (u8, u8, u8), shape: Shape) -> String {
    qml("type=\"singleSymbol\"", "", &symbol("0", rgb, shape), shape)
}

fn symbol(name: &str, (r, g, b): (u8, u8, u8), shape: Shape) -> String {
    let color = format!("{r},{g},{b},255");
    let (kind, class, props): (&str, &str, Vec<(&str, String)>) = match shape {
        Shape::Points => (
            "marker",
            "SimpleMarker",
            vec![
                ("name", "circle".into()),
                ("color", color),
                ("size", "2.4".into()),
                ("size_unit", "MM".into()),
                ("outline_color", "35,35,35,255".into()),
                ("outline_style", "solid".into()),
                ("outline_width", "0.2".into()),
                ("outline_width_unit", "MM".into()),
            ],
        ),
        Shape::Rims => (
            "fill",
            "SimpleFill",
            vec![
                ("style", "no".into()),
                ("color", "0,0,0,0".into()),
                ("outline_color", color),
                ("outline_style", "solid".into()),
                ("outline_width", "0.5".into()),
                ("outline_width_unit", "MM".into()),
            ],
        ),
    };
    // QGIS 3.26 and later read the Option map, earlier 3.x versions the prop elements.
    let mut options = String::new();
    let mut legacy = String::new();
    for (k, v) in &props {
        options.push_str(&format!(
            "            <Option name=\"{k}\" type=\"QString\" value=\"{v}\"/>\n"
        ));
        legacy.push_str(&format!("          <prop k=\"{k}\" v=\"{v}\"/>\n"));
    }
    format!(
        "      <symbol type=\"{kind}\" name=\"{name}\" alpha=\"1\" clip_to_extent=\"1\" force_rhr=\"0\">\n\
         \x20       <layer class=\"{class}\" enabled=\"1\" pass=\"0\" locked=\"0\">\n\
         \x20         <Option type=\"Map\">\n{options}\x20         </Option>\n{legacy}\
         \x20       </layer>\n\
         \x20     </symbol>\n"
    )
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}
