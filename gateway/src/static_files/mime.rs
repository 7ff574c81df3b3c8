//! Content types for files (from the extension, via `mime_guess`) and which types are worth
//! compressing: text-like formats shrink several-fold, while images, video, archives and WOFF
//! fonts are already compressed and would only cost CPU.

use std::path::Path;

use http::HeaderValue;

/// The `Content-Type` of a file and whether on-the-fly compression may apply.
pub(super) struct TypeInfo {
    pub(super) content_type: HeaderValue,
    pub(super) compressible: bool,
}

/// Looks the type up from the file name (the name requested, so a symlink serves the type of
/// its own name, as nginx does).
pub(super) fn type_of(path: &Path) -> TypeInfo {
    let raw = mime_guess::from_path(path)
        .first_raw()
        .unwrap_or("application/octet-stream");
    let content_type = if needs_charset(raw) {
        HeaderValue::try_from(format!("{raw}; charset=utf-8")).ok()
    } else {
        None
    }
    .unwrap_or_else(|| HeaderValue::from_static(raw));
    TypeInfo {
        content_type,
        compressible: compressible(raw),
    }
}

/// Text is assumed UTF-8, which browsers otherwise guess at (and may guess wrong).
fn needs_charset(essence: &str) -> bool {
    essence.starts_with("text/") || essence == "application/javascript"
}

pub(crate) fn compressible(essence: &str) -> bool {
    if essence.starts_with("text/") || essence.ends_with("+json") || essence.ends_with("+xml") {
        return true;
    }
    matches!(
        essence,
        "application/javascript"
            | "application/x-javascript"
            | "application/ecmascript"
            | "application/json"
            | "application/xml"
            | "application/wasm"
            | "application/x-yaml"
            | "application/yaml"
            | "application/toml"
            | "application/x-sh"
            | "application/x-tex"
            | "application/postscript"
            | "application/rtf"
            | "application/vnd.ms-fontobject"
            | "application/font-sfnt"
            | "application/x-font-ttf"
            | "application/x-font-otf"
            | "application/x-tar"
            | "font/ttf"
            | "font/otf"
            | "font/collection"
            | "image/svg+xml"
            | "image/x-icon"
            | "image/vnd.microsoft.icon"
            | "image/bmp"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ct(name: &str) -> (String, bool) {
        let t = type_of(Path::new(name));
        (t.content_type.to_str().unwrap().to_owned(), t.compressible)
    }

    #[test]
    fn types_and_charsets() {
        assert_eq!(ct("index.html"), ("text/html; charset=utf-8".into(), true));
        assert_eq!(ct("a.css"), ("text/css; charset=utf-8".into(), true));
        assert_eq!(ct("a.js"), ("text/javascript; charset=utf-8".into(), true));
        assert_eq!(
            ct("a.mjs"),
            ("application/javascript; charset=utf-8".into(), true)
        );
        assert_eq!(ct("a.json"), ("application/json".into(), true));
        assert_eq!(ct("a.svg"), ("image/svg+xml".into(), true));
        assert_eq!(ct("a.wasm"), ("application/wasm".into(), true));
        assert_eq!(
            ct("a.webmanifest"),
            ("application/manifest+json".into(), true)
        );
        assert_eq!(ct("a.png"), ("image/png".into(), false));
        assert_eq!(ct("a.jpg"), ("image/jpeg".into(), false));
        assert_eq!(ct("a.mp4"), ("video/mp4".into(), false));
        assert_eq!(ct("a.woff2"), ("font/woff2".into(), false));
        assert_eq!(ct("a.zip"), ("application/zip".into(), false));
        assert_eq!(ct("a.gz"), ("application/gzip".into(), false));
        assert_eq!(ct("noext"), ("application/octet-stream".into(), false));
        assert_eq!(
            ct("weird.ünknown"),
            ("application/octet-stream".into(), false)
        );
    }
}
