//! Compiled modules on disk, so a restart (or a reload in a fresh process) of an unchanged
//! module skips compiling it.
//!
//! A file is named by the sha256 of the module's bytes and the engine's compatibility hash
//! (wasmtime's version and every setting that shapes the code, the target included), so a
//! file from another build or configuration is never even opened. It holds a magic, the
//! sha256 of the artifact and the artifact; the artifact is handed to wasmtime only when the
//! sha256 matches. A file that fails any check is removed and counted, and the module is
//! compiled again. Files are written to a temporary name and renamed, so a reader never sees
//! half a file; after each write the least recently used files go until the total is under
//! `max_size`.

use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::SystemTime;

use sha2::{Digest, Sha256};
use wasmtime::{Engine, Module};

use crate::engine::Digest32;

/// The first bytes of every cache file (the format's version is its last digit).
const MAGIC: &[u8; 8] = b"GWWASM01";
const HEADER: usize = MAGIC.len() + 32;
const EXTENSION: &str = "cwasm";

/// What the cache did, for `/metrics`.
#[derive(Debug, Default)]
pub struct DiskCacheStats {
    /// Modules loaded from a file instead of compiled.
    pub hits: AtomicU64,
    /// Modules with no file yet.
    pub misses: AtomicU64,
    /// Files that failed a check (short, foreign, altered, refused by wasmtime) and were removed.
    pub rejected: AtomicU64,
    /// Files written.
    pub written: AtomicU64,
    /// Files removed to stay under `max_size`.
    pub evicted: AtomicU64,
    /// Reads and writes that failed (a full disk, a directory that cannot be written).
    pub io_errors: AtomicU64,
}

impl DiskCacheStats {
    /// Appends `gateway_plugin_cache_total{result}` in Prometheus' text format.
    pub fn render_prometheus(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = writeln!(
            out,
            "# HELP gateway_plugin_cache_total Compiled plugin modules looked up in the on-disk cache, by result."
        );
        let _ = writeln!(out, "# TYPE gateway_plugin_cache_total counter");
        for (result, n) in [
            ("hit", &self.hits),
            ("miss", &self.misses),
            ("rejected", &self.rejected),
            ("written", &self.written),
            ("evicted", &self.evicted),
            ("io_error", &self.io_errors),
        ] {
            let _ = writeln!(
                out,
                "gateway_plugin_cache_total{{result=\"{result}\"}} {}",
                n.load(Relaxed)
            );
        }
    }
}

/// One cache directory.
#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
    max_size: u64,
}

impl DiskCache {
    /// A cache in `dir` (created if missing) holding at most `max_size` bytes.
    pub fn new(dir: PathBuf, max_size: u64) -> Self {
        Self { dir, max_size }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn file(&self, engine: &Engine, digest: &Digest32) -> PathBuf {
        let mut h = Sha256::new();
        h.update(digest);
        let mut compat = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut compat);
        h.update(compat.finish().to_le_bytes());
        h.update(std::env::consts::ARCH);
        h.update(std::env::consts::OS);
        let name: String = h.finalize()[..20]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        self.dir.join(format!("{name}.{EXTENSION}"))
    }

    /// The module compiled from the bytes with `digest`, if a sound file has it.
    pub fn load(
        &self,
        engine: &Engine,
        digest: &Digest32,
        stats: &DiskCacheStats,
    ) -> Option<Module> {
        let path = self.file(engine, digest);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                stats.misses.fetch_add(1, Relaxed);
                return None;
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the plugin cache file");
                stats.io_errors.fetch_add(1, Relaxed);
                return None;
            }
        };
        match checked_artifact(&bytes).map(|artifact| deserialize(engine, artifact)) {
            Some(Ok(module)) => {
                stats.hits.fetch_add(1, Relaxed);
                // Used now: the last to go when the cache is over its size.
                if let Ok(f) = fs::File::options().append(true).open(&path) {
                    let _ = f.set_modified(SystemTime::now());
                }
                Some(module)
            }
            failed => {
                let why = match failed {
                    Some(Err(e)) => format!("wasmtime refused it: {e:#}"),
                    _ => "not a cache file of this format, or altered".into(),
                };
                tracing::warn!(path = %path.display(), reason = %why, "plugin cache file rejected and removed; compiling");
                stats.rejected.fetch_add(1, Relaxed);
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    /// Keeps `artifact` (what the engine's compiler produced for the bytes with `digest`).
    /// Failures are logged and counted: the cache only ever saves work.
    pub fn store(
        &self,
        engine: &Engine,
        digest: &Digest32,
        artifact: &[u8],
        stats: &DiskCacheStats,
    ) {
        let path = self.file(engine, digest);
        match self.write(&path, artifact) {
            Ok(()) => {
                stats.written.fetch_add(1, Relaxed);
                self.trim(stats);
            }
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot write the plugin cache");
                stats.io_errors.fetch_add(1, Relaxed);
            }
        }
    }

    fn write(&self, path: &Path, artifact: &[u8]) -> std::io::Result<()> {
        fs::create_dir_all(&self.dir)?;
        // Unique per process and call, so writers never share a temporary file.
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let tmp = self.dir.join(format!(
            ".tmp-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Relaxed)
        ));
        let written = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(MAGIC)?;
            f.write_all(&Sha256::digest(artifact))?;
            f.write_all(artifact)?;
            f.sync_all()?;
            fs::rename(&tmp, path)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written
    }

    /// Removes the least recently used files until the total is at most `max_size`.
    fn trim(&self, stats: &DiskCacheStats) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut files: Vec<(SystemTime, u64, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == EXTENSION))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, path) in files {
            if total <= self.max_size {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total -= len;
                stats.evicted.fetch_add(1, Relaxed);
            }
        }
    }
}

/// The artifact in a cache file, if the file is whole and unaltered.
fn checked_artifact(file: &[u8]) -> Option<&[u8]> {
    if file.len() <= HEADER || &file[..MAGIC.len()] != MAGIC {
        return None;
    }
    let (sum, artifact) = file[MAGIC.len()..].split_at(32);
    (Sha256::digest(artifact).as_slice() == sum).then_some(artifact)
}

#[allow(
    unsafe_code,
    reason = "wasmtime's deserialize trusts its input to be its own compiler's output"
)]
fn deserialize(engine: &Engine, artifact: &[u8]) -> wasmtime::Result<Module> {
    // SAFETY: `artifact` passed `checked_artifact`: its sha256 is the one this gateway wrote
    // beside it when its engine's compiler produced it, under a name that includes the
    // engine's compatibility hash (wasmtime's version and code-shaping settings). A file
    // truncated, corrupted or swapped for another cache file's contents fails that check.
    // wasmtime still checks its own header (version, target, settings) and refuses a
    // mismatch. What this cannot catch is someone able to write the cache directory forging
    // a file with a matching sum; that person could equally replace the plugin itself, so the
    // directory must be as protected as the plugin files (docs/plugins.md says so).
    unsafe { Module::deserialize(engine, artifact) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> Engine {
        let mut cfg = wasmtime::Config::new();
        cfg.epoch_interruption(true);
        Engine::new(&cfg).unwrap()
    }

    const WAT: &str = r#"(module (func (export "answer") (result i32) i32.const 42))"#;

    fn call(engine: &Engine, module: &Module) -> i32 {
        let mut store = wasmtime::Store::new(engine, ());
        store.set_epoch_deadline(1 << 40);
        let i = wasmtime::Instance::new(&mut store, module, &[]).unwrap();
        let f = i.get_typed_func::<(), i32>(&mut store, "answer").unwrap();
        f.call(&mut store, ()).unwrap()
    }

    #[test]
    fn a_stored_module_loads_and_an_altered_file_is_rejected_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::new(dir.path().join("c"), 1 << 30);
        let stats = DiskCacheStats::default();
        let e = engine();
        let digest = [7u8; 32];
        assert!(cache.load(&e, &digest, &stats).is_none());
        assert_eq!(stats.misses.load(Relaxed), 1);

        let artifact = e.precompile_module(WAT.as_bytes()).unwrap();
        cache.store(&e, &digest, &artifact, &stats);
        let m = cache.load(&e, &digest, &stats).expect("a hit");
        assert_eq!(call(&e, &m), 42);
        assert_eq!(stats.hits.load(Relaxed), 1);

        // One flipped byte in the artifact: the sum no longer matches.
        let path = cache.file(&e, &digest);
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&path, &bytes).unwrap();
        assert!(cache.load(&e, &digest, &stats).is_none());
        assert_eq!(stats.rejected.load(Relaxed), 1);
        assert!(!path.exists(), "the rejected file is removed");

        // Garbage, short files and an empty one.
        for junk in [&b""[..], b"GWWASM01", b"\x7fELF not ours at all"] {
            fs::write(&path, junk).unwrap();
            assert!(cache.load(&e, &digest, &stats).is_none());
        }
        assert_eq!(stats.rejected.load(Relaxed), 4);
    }

    #[test]
    fn a_file_with_a_good_sum_that_wasmtime_refuses_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::new(dir.path().to_owned(), 1 << 30);
        let stats = DiskCacheStats::default();
        let e = engine();
        let digest = [9u8; 32];
        cache.store(&e, &digest, b"not an artifact at all", &stats);
        assert!(cache.load(&e, &digest, &stats).is_none());
        assert_eq!(stats.rejected.load(Relaxed), 1);
    }

    #[test]
    fn the_least_recently_used_files_go_first_past_max_size() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine();
        let artifact = e.precompile_module(WAT.as_bytes()).unwrap();
        let one = (artifact.len() + HEADER) as u64;
        let cache = DiskCache::new(dir.path().to_owned(), one * 2);
        let stats = DiskCacheStats::default();
        for d in 0..3u8 {
            cache.store(&e, &[d; 32], &artifact, &stats);
            // Distinct modification times, whatever the file system's resolution.
            let old = SystemTime::now() - std::time::Duration::from_secs(100 - u64::from(d));
            let f = fs::File::options()
                .append(true)
                .open(cache.file(&e, &[d; 32]))
                .unwrap();
            f.set_modified(old).unwrap();
        }
        // The third write pushed the total over: the oldest (0) went.
        assert_eq!(stats.evicted.load(Relaxed), 1);
        assert!(!cache.file(&e, &[0; 32]).exists());
        assert!(cache.file(&e, &[1; 32]).exists());
        assert!(cache.file(&e, &[2; 32]).exists());
    }
}
