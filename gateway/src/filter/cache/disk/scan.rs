//! The start-up scan: rebuilds a disk tier's index from its directory, on its own thread, while
//! requests go on (a request for an object not found yet is a miss). Each file's prelude and
//! head are read and checked; one of another version, cut short or altered is removed and
//! counted, as are temporary files a crash left behind. Files that are not the tier's (another
//! name) are left alone.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::UNIX_EPOCH;

use super::file::{self, Id};
use super::{Files, lock};

/// Scans `tier`'s directory; stops early when the tier is dropped.
pub(super) fn run(tier: &Files) {
    let began = std::time::Instant::now();
    let (mut found, mut rejected) = (0u64, 0u64);
    for first in dirs(&tier.root) {
        for second in dirs(&first) {
            let Ok(files) = std::fs::read_dir(&second) else {
                continue;
            };
            for f in files.filter_map(Result::ok) {
                if tier.closed.load(Ordering::Relaxed) {
                    return;
                }
                match one(tier, &f.path()) {
                    Some(true) => found += 1,
                    Some(false) => rejected += 1,
                    None => {}
                }
            }
        }
    }
    tier.evict();
    tracing::info!(
        dir = %tier.root.display(),
        objects = found,
        rejected,
        elapsed_ms = began.elapsed().as_millis() as u64,
        "cache disk index rebuilt"
    );
}

fn dirs(p: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(p) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                !n.is_empty() && n.len() <= 2 && n.bytes().all(|b| b.is_ascii_hexdigit())
            })
        })
        .collect();
    out.sort();
    out
}

/// Indexes one file: `Some(true)` when added, `Some(false)` when removed as unreadable,
/// `None` when not the tier's or already indexed (written since the scan began).
fn one(tier: &Files, path: &Path) -> Option<bool> {
    let name = path.file_name()?.to_str()?;
    if let Some(stem) = name.strip_suffix(".tmp") {
        // Left by a crash mid-write, unless this run's writer, beside the scan, is at it.
        let (hex, tag) = stem.split_once('.')?;
        Id::parse(hex)?;
        if !tag.starts_with(&tier.run) {
            let _ = std::fs::remove_file(path);
        }
        return None;
    }
    let id = Id::parse(name)?;
    if id.path(&tier.root) != path || lock(&tier.index).contains(id) {
        return None;
    }
    let (head, opened) = match file::open(path) {
        Ok(x) => x,
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            tracing::warn!(file = %path.display(), error = %e, "cache file rejected");
            tier.metrics.rejected.inc();
            let _ = std::fs::remove_file(path);
            return Some(false);
        }
        Err(_) => return None,
    };
    if Id::of(&head.primary, &head.variant) != id {
        tier.metrics.rejected.inc();
        let _ = std::fs::remove_file(path);
        return Some(false);
    }
    let size = opened.body_offset + opened.body_len;
    let mtime = opened
        .file
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let mut index = lock(&tier.index);
    if index.contains(id) {
        return None;
    }
    let unreachable = index.insert(
        id,
        head.primary,
        head.variant,
        &head.object,
        size,
        Some(mtime),
    );
    tier.publish(&index);
    drop(index);
    for id in unreachable {
        let _ = std::fs::remove_file(id.path(&tier.root));
    }
    Some(true)
}
