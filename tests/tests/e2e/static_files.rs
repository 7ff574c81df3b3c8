//! The `static` terminal end to end: index files and redirects, MIME types, validators and
//! 304s, ranges, HEAD, methods, precompressed siblings and on-the-fly compression (decoded and
//! compared), large files streamed and hashed, a sparse 1 GiB file with bounded memory, every
//! path-traversal form we know of, and cached files picked up after they change on disk.

use std::time::{Duration, Instant};

use bytes::Bytes;
use gateway_tests::{
    TestGateway, TestResponse, http1, http2c, raw, raw_status, rss_kib, temp_dir, write_file,
};
use http::Request;
use http_body_util::Full;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A config with one listener and one static route; `extra` is more YAML under `static:`.
fn config(extra: &str) -> String {
    format!(
        r#"
listeners:
  - name: main
    bind: 127.0.0.1:0
routes:
  - name: site
    match: {{ path_prefix: / }}
    static:
      root: public
{extra}
"#
    )
}

fn req(method: &str, path: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

async fn send(
    gw: &TestGateway,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> TestResponse {
    let mut c = http1(gw.addr("main")).await;
    c.send(req(method, path, headers)).await.expect("request")
}

/// Deterministic incompressible bytes.
fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[3]
        })
        .collect()
}

/// Compressible text of about `len` bytes.
fn text(len: usize) -> String {
    let mut s = String::with_capacity(len + 64);
    let mut i = 0u64;
    while s.len() < len {
        s.push_str(&format!(
            "line {i}: the quick brown fox jumps over the lazy dog\n"
        ));
        i += 1;
    }
    s
}

async fn decode(encoding: &str, data: &[u8]) -> Vec<u8> {
    use async_compression::tokio::bufread::{BrotliDecoder, GzipDecoder, ZstdDecoder};
    let mut out = Vec::new();
    match encoding {
        "gzip" => GzipDecoder::new(data).read_to_end(&mut out).await,
        "br" => BrotliDecoder::new(data).read_to_end(&mut out).await,
        "zstd" => ZstdDecoder::new(data).read_to_end(&mut out).await,
        other => panic!("unexpected encoding {other}"),
    }
    .expect("decodes");
    out
}

fn sha(data: &[u8]) -> Vec<u8> {
    Sha256::digest(data).to_vec()
}

async fn start_with(files: &[(&str, &[u8])], extra: &str) -> TestGateway {
    let dir = temp_dir();
    std::fs::create_dir_all(dir.path().join("public")).unwrap();
    for (rel, data) in files {
        write_file(&dir.path().join("public"), rel, data);
    }
    TestGateway::start_in(dir, &config(extra)).await
}

#[tokio::test]
async fn index_redirect_mime_and_no_listing() {
    let gw = start_with(
        &[
            ("index.html", b"<h1>home</h1>"),
            ("docs/index.html", b"<h1>docs</h1>"),
            ("empty/readme", b"not an index"),
            ("style.css", b"body{}"),
            ("data.json", b"{}"),
            ("logo.png", b"\x89PNG"),
            ("font.woff2", b"wOF2"),
            ("blob", b"raw"),
            ("a b/é.txt", b"unicode"),
        ],
        "",
    )
    .await;
    for h2 in [false, true] {
        let addr = gw.addr("main");
        let mut c = if h2 {
            http2c(addr).await
        } else {
            http1(addr).await
        };
        let r = c.get("/").await;
        assert_eq!((r.status(), r.text().as_str()), (200, "<h1>home</h1>"));
        assert_eq!(r.header("content-type"), "text/html; charset=utf-8");
        assert_eq!(r.header("accept-ranges"), "bytes");
        assert_eq!(r.header("content-length"), "13");

        let r = c.get("/docs").await;
        assert_eq!(r.status(), 301);
        assert_eq!(r.header("location"), "/docs/");
        let r = c.get("/docs?x=1").await;
        assert_eq!(r.header("location"), "/docs/?x=1");
        let r = c.get("/docs/").await;
        assert_eq!((r.status(), r.text().as_str()), (200, "<h1>docs</h1>"));
        let r = c.get("/docs/index.html").await;
        assert_eq!(r.status(), 200);

        // A directory without an index is never listed.
        assert_eq!(c.get("/empty/").await.status(), 404);
        assert_eq!(c.get("/missing.txt").await.status(), 404);
        assert_eq!(c.get("/style.css/").await.status(), 404);
        assert_eq!(c.get("/style.css/x").await.status(), 404);

        for (path, ty) in [
            ("/style.css", "text/css; charset=utf-8"),
            ("/data.json", "application/json"),
            ("/logo.png", "image/png"),
            ("/font.woff2", "font/woff2"),
            ("/blob", "application/octet-stream"),
            ("/a%20b/%C3%A9.txt", "text/plain; charset=utf-8"),
        ] {
            let r = c.get(path).await;
            assert_eq!(r.status(), 200, "{path}");
            assert_eq!(r.header("content-type"), ty, "{path}");
        }
        // The query is not part of the file name.
        assert_eq!(c.get("/style.css?v=3").await.text(), "body{}");
    }
}

#[tokio::test]
async fn etag_and_last_modified_give_304() {
    let gw = start_with(&[("page.html", b"<p>cached</p>")], "").await;
    let r = send(&gw, "GET", "/page.html", &[]).await;
    let etag = r.header("etag").to_owned();
    let lm = r.header("last-modified").to_owned();
    assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
    assert!(lm.ends_with("GMT"), "{lm}");

    let r = send(&gw, "GET", "/page.html", &[("if-none-match", &etag)]).await;
    assert_eq!(r.status(), 304);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag"), etag);
    let r = send(
        &gw,
        "GET",
        "/page.html",
        &[("if-none-match", &format!("\"x\", W/{etag}"))],
    )
    .await;
    assert_eq!(r.status(), 304);
    let r = send(&gw, "GET", "/page.html", &[("if-none-match", "\"other\"")]).await;
    assert_eq!((r.status(), r.text().as_str()), (200, "<p>cached</p>"));

    let r = send(&gw, "GET", "/page.html", &[("if-modified-since", &lm)]).await;
    assert_eq!(r.status(), 304);
    let r = send(&gw, "HEAD", "/page.html", &[("if-modified-since", &lm)]).await;
    assert_eq!(r.status(), 304);
    let r = send(
        &gw,
        "GET",
        "/page.html",
        &[("if-modified-since", "Thu, 01 Jan 1970 00:00:00 GMT")],
    )
    .await;
    assert_eq!(r.status(), 200);
    // If-None-Match takes precedence over If-Modified-Since.
    let r = send(
        &gw,
        "GET",
        "/page.html",
        &[("if-none-match", "\"x\""), ("if-modified-since", &lm)],
    )
    .await;
    assert_eq!(r.status(), 200);
    let r = send(&gw, "GET", "/page.html", &[("if-match", "\"x\"")]).await;
    assert_eq!(r.status(), 412);
}

#[tokio::test]
async fn ranges_206_416_and_if_range() {
    let small: Vec<u8> = (0..1000u32).map(|i| (i % 256) as u8).collect();
    let big = noise(3 << 20);
    let gw = start_with(&[("small.bin", &small), ("big.bin", &big)], "").await;
    for (path, data) in [("/small.bin", &small), ("/big.bin", &big)] {
        let len = data.len();
        let r = send(&gw, "GET", path, &[("range", "bytes=10-19")]).await;
        assert_eq!(r.status(), 206, "{path}");
        assert_eq!(r.header("content-range"), format!("bytes 10-19/{len}"));
        assert_eq!(r.header("content-length"), "10");
        assert_eq!(&r.body[..], &data[10..20]);

        let r = send(&gw, "GET", path, &[("range", "bytes=-5")]).await;
        assert_eq!(r.status(), 206);
        assert_eq!(&r.body[..], &data[len - 5..]);

        let r = send(
            &gw,
            "GET",
            path,
            &[("range", &format!("bytes={}-", len - 3))],
        )
        .await;
        assert_eq!(&r.body[..], &data[len - 3..]);

        let r = send(&gw, "GET", path, &[("range", &format!("bytes={len}-"))]).await;
        assert_eq!(r.status(), 416);
        assert_eq!(r.header("content-range"), format!("bytes */{len}"));

        // Several ranges: answered with the whole file.
        let r = send(&gw, "GET", path, &[("range", "bytes=0-1,5-6")]).await;
        assert_eq!((r.status(), r.body.len()), (200, len));
        // Garbage is ignored.
        let r = send(&gw, "GET", path, &[("range", "bytes=oops")]).await;
        assert_eq!(r.status(), 200);

        let etag = send(&gw, "HEAD", path, &[]).await.header("etag").to_owned();
        let r = send(
            &gw,
            "GET",
            path,
            &[("range", "bytes=0-0"), ("if-range", &etag)],
        )
        .await;
        assert_eq!((r.status(), r.body.len()), (206, 1));
        let r = send(
            &gw,
            "GET",
            path,
            &[("range", "bytes=0-0"), ("if-range", "\"stale\"")],
        )
        .await;
        assert_eq!((r.status(), r.body.len()), (200, len));
        // A range asks for identity bytes even when the client accepts compression.
        let r = send(
            &gw,
            "GET",
            path,
            &[("range", "bytes=0-3"), ("accept-encoding", "gzip, br")],
        )
        .await;
        assert_eq!(r.status(), 206);
        assert_eq!(r.header("content-encoding"), "");
    }
}

#[tokio::test]
async fn head_and_methods() {
    let big = noise(1 << 20);
    let gw = start_with(&[("hello.txt", b"hello world"), ("big.bin", &big)], "").await;
    let r = send(&gw, "HEAD", "/hello.txt", &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.header("content-length"), "11");
    assert!(r.body.is_empty());
    let r = send(&gw, "HEAD", "/big.bin", &[]).await;
    assert_eq!(r.header("content-length"), (1u64 << 20).to_string());

    // On the wire: headers and nothing after them.
    let out = raw(
        gw.addr("main"),
        b"HEAD /hello.txt HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(raw_status(&out), 200);
    assert!(
        out.to_ascii_lowercase().contains("content-length: 11\r\n"),
        "{out}"
    );
    assert!(out.ends_with("\r\n\r\n"), "{out:?}");

    for m in ["POST", "PUT", "DELETE", "OPTIONS", "PATCH"] {
        let r = send(&gw, m, "/hello.txt", &[]).await;
        assert_eq!(r.status(), 405, "{m}");
        assert_eq!(r.header("allow"), "GET, HEAD");
    }
}

#[tokio::test]
async fn precompressed_siblings_follow_q_values_with_vary() {
    let js = text(2000);
    let gw = start_with(
        &[
            ("app.js", js.as_bytes()),
            ("app.js.br", b"BR-SIBLING"),
            ("app.js.gz", b"GZ-SIBLING"),
            ("app.js.zst", b"ZST-NOT-CONFIGURED"),
        ],
        "      precompressed: [br, gzip]\n      compress: [gzip]",
    )
    .await;
    let cases: &[(&str, &str, &str)] = &[
        ("gzip, deflate, br, zstd", "br", "BR-SIBLING"),
        ("gzip", "gzip", "GZ-SIBLING"),
        ("br;q=0.5, gzip;q=0.9", "gzip", "GZ-SIBLING"),
        ("br;q=0.9, gzip;q=0.5", "br", "BR-SIBLING"),
        ("br;q=0, *;q=0.3", "gzip", "GZ-SIBLING"),
        // zstd has a sibling on disk but is not configured: identity.
        ("zstd", "", ""),
        ("identity", "", ""),
        ("", "", ""),
    ];
    let mut etags = std::collections::HashSet::new();
    for h2 in [false, true] {
        let addr = gw.addr("main");
        let mut c = if h2 {
            http2c(addr).await
        } else {
            http1(addr).await
        };
        for &(ae, enc, body) in cases {
            let headers: &[(&str, &str)] = if ae.is_empty() {
                &[]
            } else {
                &[("accept-encoding", ae)]
            };
            let r = c.send(req("GET", "/app.js", headers)).await.unwrap();
            assert_eq!(r.status(), 200, "{ae}");
            assert_eq!(r.header("content-encoding"), enc, "{ae}");
            assert_eq!(
                r.header("vary").to_ascii_lowercase(),
                "accept-encoding",
                "{ae}"
            );
            assert_eq!(r.header("content-type"), "text/javascript; charset=utf-8");
            if body.is_empty() {
                assert_eq!(r.text(), js, "{ae}");
            } else {
                assert_eq!(r.text(), body, "{ae}");
                assert_eq!(r.header("content-length"), body.len().to_string());
            }
            etags.insert((enc.to_owned(), r.header("etag").to_owned()));
            // Each representation revalidates against its own ETag.
            let mut h = headers.to_vec();
            let etag = r.header("etag").to_owned();
            h.push(("if-none-match", &etag));
            assert_eq!(
                c.send(req("GET", "/app.js", &h)).await.unwrap().status(),
                304
            );
        }
    }
    // One ETag per representation, and they differ.
    let distinct: std::collections::HashSet<_> = etags.iter().map(|(_, t)| t.clone()).collect();
    assert_eq!(distinct.len(), 3, "{etags:?}");
    assert_eq!(etags.len(), 3, "{etags:?}");
}

#[tokio::test]
async fn compression_on_the_fly_round_trips() {
    let small_text = text(100 * 1024);
    let large_text = text(3 << 20);
    let png = noise(64 * 1024);
    let gw = start_with(
        &[
            ("cached.html", small_text.as_bytes()),
            ("large.txt", large_text.as_bytes()),
            ("tiny.css", b"a{}"),
            ("image.png", &png),
            ("app.wasm", &vec![0u8; 4096]),
        ],
        "",
    )
    .await;
    for h2 in [false, true] {
        let addr = gw.addr("main");
        let mut c = if h2 {
            http2c(addr).await
        } else {
            http1(addr).await
        };
        for (path, original) in [
            ("/cached.html", small_text.as_bytes()),
            ("/large.txt", large_text.as_bytes()),
        ] {
            for enc in ["gzip", "br", "zstd"] {
                let r = c
                    .send(req("GET", path, &[("accept-encoding", enc)]))
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                assert_eq!(r.header("content-encoding"), enc, "{path}");
                assert_eq!(r.header("vary").to_ascii_lowercase(), "accept-encoding");
                assert!(
                    r.body.len() < original.len() / 3,
                    "{path} {enc}: {}",
                    r.body.len()
                );
                assert_eq!(decode(enc, &r.body).await, original, "{path} {enc}");
            }
        }
        // HEAD mirrors GET; a body compressed on the fly has no length to announce.
        let r = c
            .send(req("HEAD", "/large.txt", &[("accept-encoding", "gzip")]))
            .await
            .unwrap();
        assert_eq!((r.status(), r.header("content-encoding")), (200, "gzip"));
        assert_eq!(r.header("content-length"), "");
        assert!(r.body.is_empty());
        let r = c
            .send(req("HEAD", "/cached.html", &[("accept-encoding", "br")]))
            .await
            .unwrap();
        assert_eq!(r.header("content-encoding"), "br");
        assert!(r.header("content-length").parse::<usize>().unwrap() < small_text.len() / 3);
        // Default preference (zstd, br, gzip) when all are equally acceptable.
        let r = c
            .send(req(
                "GET",
                "/cached.html",
                &[("accept-encoding", "gzip, br, zstd")],
            ))
            .await
            .unwrap();
        assert_eq!(r.header("content-encoding"), "zstd");
        let r = c
            .send(req("GET", "/app.wasm", &[("accept-encoding", "gzip")]))
            .await
            .unwrap();
        assert_eq!(r.header("content-encoding"), "gzip");
        // Below compress_min_size (256 B): sent as is.
        let r = c
            .send(req("GET", "/tiny.css", &[("accept-encoding", "gzip")]))
            .await
            .unwrap();
        assert_eq!(
            (r.header("content-encoding"), r.text().as_str()),
            ("", "a{}")
        );
        // Already compressed types are never compressed again.
        let r = c
            .send(req(
                "GET",
                "/image.png",
                &[("accept-encoding", "gzip, br, zstd")],
            ))
            .await
            .unwrap();
        assert_eq!(r.header("content-encoding"), "");
        assert_eq!(r.header("vary"), "");
        assert_eq!(&r.body[..], &png[..]);
    }
}

#[tokio::test]
async fn large_file_streams_intact() {
    let data = noise(12 << 20);
    let gw = start_with(&[("video.mp4", &data)], "").await;
    let want = sha(&data);
    for h2 in [false, true] {
        let addr = gw.addr("main");
        let mut c = if h2 {
            http2c(addr).await
        } else {
            http1(addr).await
        };
        let r = c.get("/video.mp4").await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.header("content-length"), data.len().to_string());
        assert_eq!(r.header("content-type"), "video/mp4");
        assert_eq!(sha(&r.body), want);
        // A range across chunk boundaries.
        let r = c
            .send(req(
                "GET",
                "/video.mp4",
                &[("range", "bytes=262000-786999")],
            ))
            .await
            .unwrap();
        assert_eq!(r.status(), 206);
        assert_eq!(&r.body[..], &data[262_000..787_000]);
    }
}

/// Reads one HTTP/1.1 response to `path` and counts its body bytes without keeping them.
async fn count_body(addr: std::net::SocketAddr, path: &str) -> (String, u64) {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut head = Vec::new();
    let mut in_body = false;
    let mut body = 0u64;
    loop {
        let n = tcp.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        if in_body {
            body += n as u64;
            continue;
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            in_body = true;
            body = (head.len() - end - 4) as u64;
            head.truncate(end);
        }
    }
    (String::from_utf8_lossy(&head).into_owned(), body)
}

#[tokio::test]
async fn gib_file_streams_with_bounded_memory() {
    let dir = temp_dir();
    std::fs::create_dir_all(dir.path().join("public")).unwrap();
    // Sparse: a GiB to serve without a GiB of disk.
    let f = std::fs::File::create(dir.path().join("public/huge.bin")).unwrap();
    f.set_len(1 << 30).unwrap();
    drop(f);
    let gw = TestGateway::start_in(dir, &config("")).await;
    let (rss_before, _) = rss_kib();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(rss_before));
    let sampler = tokio::spawn({
        let peak = peak.clone();
        async move {
            loop {
                peak.fetch_max(rss_kib().0, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    let (head, n) = count_body(gw.addr("main"), "/huge.bin").await;
    sampler.abort();
    let rss_peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-length: 1073741824"),
        "{head}"
    );
    assert_eq!(n, 1 << 30);
    // Other tests run in this process too, so only a gross leak (the file held in memory)
    // is a failure: the body itself would be 1 GiB.
    let grown = rss_peak.saturating_sub(rss_before);
    assert!(grown < 256 * 1024, "RSS grew by {grown} KiB");
}

#[tokio::test]
async fn traversal_never_escapes_the_root() {
    let dir = temp_dir();
    let root = dir.path().join("public");
    write_file(&root, "hello.txt", "hello");
    write_file(&root, "sub/inner.txt", "inner");
    write_file(&root, ".env", "TOP-SECRET-ENV");
    write_file(&root, ".git/config", "TOP-SECRET-GIT");
    write_file(&root, ".well-known/security.txt", "contact: me");
    write_file(dir.path(), "secret.txt", "TOP-SECRET-OUTSIDE");
    std::os::unix::fs::symlink("../secret.txt", root.join("leak")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("secret.txt"), root.join("leak_abs")).unwrap();
    std::os::unix::fs::symlink(dir.path(), root.join("updir")).unwrap();
    std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
    // Symlinks that stay inside the root are served.
    std::os::unix::fs::symlink("hello.txt", root.join("alias.txt")).unwrap();
    std::os::unix::fs::symlink("sub", root.join("subalias")).unwrap();
    let gw = TestGateway::start_in(dir, &config("")).await;
    let addr = gw.addr("main");

    let attempts = [
        "/../secret.txt",
        "/../../../../../../etc/passwd",
        "/sub/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/%2E%2E/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/.%2e/secret.txt",
        "/sub/%2e%2e/%2e%2e/secret.txt",
        "/sub%2f..%2f..%2fsecret.txt",
        "/a%2f..%2f..%2f..%2fetc%2fpasswd",
        "/..%2fsecret.txt",
        "/..%5csecret.txt",
        "/..%5c..%5c..%5cetc%5cpasswd",
        "/..\\secret.txt",
        "/%00",
        "/hello.txt%00.png",
        "/%2500",
        "/%c0%ae%c0%ae/secret.txt",
        "/%ff",
        "/%",
        "/leak",
        "/leak_abs",
        "/updir/secret.txt",
        "/etc/passwd",
        "//etc/passwd",
        "/.env",
        "/.git/config",
        "/%2egit/config",
        "/sub/./../.env",
        "http://x/../secret.txt",
    ];
    for path in attempts {
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        let out = raw(addr, request.as_bytes()).await;
        let status = raw_status(&out);
        assert!(status == 400 || status == 404, "{path}: {status} {out}");
        assert!(!out.contains("TOP-SECRET"), "{path}: {out}");
        assert!(!out.contains("root:"), "{path}: {out}");
    }
    let mut c = http1(addr).await;
    assert_eq!(c.get("/alias.txt").await.text(), "hello");
    assert_eq!(c.get("/subalias/inner.txt").await.text(), "inner");
    assert_eq!(
        c.get("/.well-known/security.txt").await.text(),
        "contact: me"
    );
    assert_eq!(c.get("/hello.txt").await.text(), "hello");
}

#[tokio::test]
async fn changed_files_are_picked_up_after_revalidate_after() {
    let gw = start_with(
        &[("news.txt", b"version one"), ("gone.txt", b"here")],
        "      cache: { revalidate_after: 1s }",
    )
    .await;
    let path = gw.dir().join("public/news.txt");
    let t0 = Instant::now();
    assert_eq!(
        send(&gw, "GET", "/news.txt", &[]).await.text(),
        "version one"
    );
    assert_eq!(send(&gw, "GET", "/gone.txt", &[]).await.text(), "here");
    let etag1 = send(&gw, "HEAD", "/news.txt", &[])
        .await
        .header("etag")
        .to_owned();
    // Same length, different bytes: only the mtime tells them apart. File systems stamp
    // times from a coarse clock (a few ms), so let it tick first.
    tokio::time::sleep(Duration::from_millis(20)).await;
    std::fs::write(&path, "version two").unwrap();
    std::fs::remove_file(gw.dir().join("public/gone.txt")).unwrap();
    let r = send(&gw, "GET", "/news.txt", &[]).await;
    if t0.elapsed() < Duration::from_millis(800) {
        // Within the window the cache is trusted: no file-system access at all.
        assert_eq!(r.text(), "version one");
        assert_eq!(send(&gw, "GET", "/gone.txt", &[]).await.text(), "here");
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let r = send(&gw, "GET", "/news.txt", &[]).await;
    assert_eq!(r.text(), "version two");
    assert_ne!(r.header("etag"), etag1);
    assert_eq!(send(&gw, "GET", "/gone.txt", &[]).await.status(), 404);

    // A file that grows past the cache limit is streamed from then on.
    let big = noise(600 * 1024);
    std::fs::write(&path, &big).unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let r = send(&gw, "GET", "/news.txt", &[]).await;
    assert_eq!(sha(&r.body), sha(&big));
    // And a new file appears without any wait (misses are never cached).
    write_file(&gw.dir().join("public"), "fresh.txt", "new");
    assert_eq!(send(&gw, "GET", "/fresh.txt", &[]).await.text(), "new");
}

#[tokio::test]
async fn cache_control_and_cache_off() {
    let gw = start_with(
        &[("a.txt", b"aaa")],
        "      cache_control: \"public, max-age=60\"\n      cache: { max_file_size: 0 }",
    )
    .await;
    let r = send(&gw, "GET", "/a.txt", &[]).await;
    assert_eq!((r.status(), r.text().as_str()), (200, "aaa"));
    assert_eq!(r.header("cache-control"), "public, max-age=60");
    // Without the cache every request reads the disk.
    std::fs::write(gw.dir().join("public/a.txt"), "bbbb").unwrap();
    assert_eq!(send(&gw, "GET", "/a.txt", &[]).await.text(), "bbbb");
}
