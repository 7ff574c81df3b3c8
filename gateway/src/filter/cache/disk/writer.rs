//! The disk tier's writer thread and its jobs, run in the order they were queued: whole
//! objects to write, objects streamed in as their answers arrive (begun, fed piece by piece,
//! ended or abandoned), files to delete, evictions. Ordering is what keeps a purge from being
//! undone by a write queued before it.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

use bytes::Bytes;

use super::super::store::{Object, Payload};
use super::file::{self, Id, Partial, Source};
use super::{Files, QUEUE_BYTES, held, lock};

/// Dropped once its job is done: a coalescing lead held until the object can be found on disk.
pub type Guard = Box<dyn Send>;

/// Which request paths a purge removes.
pub type PathMatch = Arc<dyn Fn(&str) -> bool + Send + Sync>;

pub(super) enum Job {
    Write {
        id: Id,
        primary: String,
        variant: String,
        object: Arc<Object>,
        done: Option<Guard>,
    },
    Begin {
        fill: u64,
        id: Id,
        primary: String,
        variant: String,
        object: Arc<Object>,
    },
    Piece {
        fill: u64,
        bytes: Bytes,
    },
    End {
        fill: u64,
        done: Option<Guard>,
    },
    Abort {
        fill: u64,
    },
    Delete(Vec<Id>),
    /// The objects under a primary key, indexed or to be by a write queued before.
    Forget(String),
    /// The objects whose request path matches, likewise.
    Purge(PathMatch),
    Evict,
}

/// Queues a job that must not be lost (a deletion, the end of a fill): when the queue is full,
/// a blocking-pool thread waits for room, not the caller.
pub(super) fn send(jobs: &SyncSender<Job>, job: Job) {
    if let Err(TrySendError::Full(job)) = jobs.try_send(job) {
        let jobs = jobs.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(move || jobs.send(job))),
            Err(_) => drop(jobs.send(job)),
        }
    }
}

/// An object being streamed to disk as its answer arrives. Dropped before
/// [`DiskFill::finish`], it is abandoned and its temporary file removed.
pub struct DiskFill {
    pub(super) tier: Arc<Files>,
    pub(super) jobs: SyncSender<Job>,
    pub(super) fill: u64,
    pub primary: String,
    pub variant: String,
    pub(super) ended: bool,
}

impl DiskFill {
    /// Queues a piece of the body; false when the writer is behind (the fill is to be
    /// abandoned: the tier does not hold bodies in memory for it).
    pub fn push(&mut self, bytes: Bytes) -> bool {
        let len = bytes.len() as u64;
        let queued = self.tier.queued.fetch_add(len, Ordering::AcqRel);
        let busy = queued != 0 && queued + len > QUEUE_BYTES;
        let fill = self.fill;
        if busy || self.jobs.try_send(Job::Piece { fill, bytes }).is_err() {
            self.tier.queued.fetch_sub(len, Ordering::AcqRel);
            self.tier.metrics.failed_busy.inc();
            return false;
        }
        true
    }

    /// The body is whole: the file goes into place, then `done` is dropped.
    pub fn finish(mut self, done: Option<Guard>) {
        self.ended = true;
        let fill = self.fill;
        send(&self.jobs, Job::End { fill, done });
    }
}

impl Drop for DiskFill {
    fn drop(&mut self) {
        if !self.ended {
            send(&self.jobs, Job::Abort { fill: self.fill });
        }
    }
}

/// A fill under way in the writer.
struct Open {
    id: Id,
    primary: String,
    variant: String,
    object: Arc<Object>,
    partial: io::Result<Partial>,
}

/// Runs the jobs in order until the tier is dropped.
pub(super) fn run(tier: &Files, jobs: &Receiver<Job>) {
    let mut open: HashMap<u64, Open> = HashMap::new();
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Write {
                id,
                primary,
                variant,
                object,
                done,
            } => {
                tier.queued.fetch_sub(held(&object), Ordering::AcqRel);
                let head = file::encode_head(&primary, &variant, &object);
                let source = match &object.body {
                    Payload::Memory(b) => Source::Bytes(b),
                    Payload::File(s) => Source::File(&s.opened),
                };
                let tag = format!("{}0", tier.run);
                let written = file::write(&tier.root, id, &tag, &head, source);
                stored(tier, id, primary, variant, &object, written);
                tier.writing.fetch_sub(1, Ordering::AcqRel);
                drop(done);
            }
            Job::Begin {
                fill,
                id,
                primary,
                variant,
                object,
            } => {
                let head = file::encode_head(&primary, &variant, &object);
                let tag = format!("{}{fill}", tier.run);
                let partial = Partial::begin(&tier.root, id, &tag, &head);
                let o = Open {
                    id,
                    primary,
                    variant,
                    object,
                    partial,
                };
                open.insert(fill, o);
            }
            Job::Piece { fill, bytes } => {
                tier.queued.fetch_sub(bytes.len() as u64, Ordering::AcqRel);
                if let Some(o) = open.get_mut(&fill)
                    && let Ok(p) = &mut o.partial
                    && let Err(e) = p.push(&bytes)
                {
                    o.partial = Err(e);
                }
            }
            Job::End { fill, done } => {
                if let Some(o) = open.remove(&fill) {
                    let written = o.partial.and_then(Partial::finish);
                    stored(tier, o.id, o.primary, o.variant, &o.object, written);
                }
                tier.writing.fetch_sub(1, Ordering::AcqRel);
                drop(done);
            }
            Job::Abort { fill } => {
                drop(open.remove(&fill));
                tier.writing.fetch_sub(1, Ordering::AcqRel);
            }
            Job::Delete(ids) => {
                let mut index = lock(&tier.index);
                for id in &ids {
                    index.remove(*id);
                }
                delete(tier, index, ids);
            }
            Job::Forget(primary) => {
                let mut index = lock(&tier.index);
                let gone = index.remove_primary(&primary);
                delete(tier, index, gone.into_iter().map(|(id, _)| id).collect());
            }
            Job::Purge(matches) => {
                let mut index = lock(&tier.index);
                let gone = index.remove_matching(|p| matches(p));
                delete(tier, index, gone.into_iter().map(|(id, ..)| id).collect());
            }
            Job::Evict => tier.evict(),
        }
    }
}

/// Deletes the files of `ids`, already out of the index.
fn delete(tier: &Files, index: std::sync::MutexGuard<'_, super::Index>, ids: Vec<Id>) {
    tier.publish(&index);
    drop(index);
    for id in ids {
        let _ = std::fs::remove_file(id.path(&tier.root));
    }
}

/// Indexes a file written (evicting past the bound), or counts the failure.
fn stored(
    tier: &Files,
    id: Id,
    primary: String,
    variant: String,
    object: &Object,
    written: io::Result<u64>,
) {
    let size = match written {
        Ok(size) => size,
        Err(e) => return tier.failed(id, &e),
    };
    if tier.failing.swap(false, Ordering::Relaxed) {
        tracing::info!(dir = %tier.root.display(), "cache disk writes succeed again");
    }
    if size > tier.capacity.load(Ordering::Relaxed) {
        // Larger than the whole tier: it would only evict everything, then itself.
        let _ = std::fs::remove_file(id.path(&tier.root));
        return;
    }
    tier.metrics.tier.writes.inc();
    let unreachable = lock(&tier.index).insert(id, primary, variant, object, size, None);
    for id in unreachable {
        let _ = std::fs::remove_file(id.path(&tier.root));
    }
    tier.evict();
}
