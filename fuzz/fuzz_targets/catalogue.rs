//! Crater catalogues in every accepted layout: pixel catalogues (pycda `long,lat,diameter`,
//! NAC `ID,X,Y,W,H,C_X,CY`, comma or tab separated) and catalogues in degrees and km
//! (Robbins-style or `id,lat,lon,diameter_km`). Nothing may panic.
#![no_main]
use craterdex_eval::catalogue::{read_geo_catalogue, read_pixel_catalogue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = craterdex_fuzz::scratch();
    let path = dir.join("craters.csv");
    std::fs::write(&path, data).unwrap();
    if let Ok(craters) = read_pixel_catalogue(&path) {
        assert!(craters
            .iter()
            .all(|c| c.x.is_finite() && c.y.is_finite() && c.diameter.is_finite()));
    }
    if let Ok(craters) = read_geo_catalogue(&path) {
        assert!(craters
            .iter()
            .all(|c| c.lat.is_finite() && c.lon.is_finite()));
    }
});
