//! The catalog seam: what a store keeps besides objects (restic keeps its repository's index and locks beside
//! its backend the same way). Name records, the locks a save and a gc hold, and bringing this machine's index
//! up to date with names kept elsewhere. `Store` is written once against this trait and `objects::Backend`.
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | the `Catalog` trait, what it is given (`Committed`), what it returns (`SyncReport`, `GcLock`, ...) |
//! | `local.rs` | `LocalCatalog`: the names are the LMDB index's own rows; locks are `flock`s on `<store>/lock` |
//!
//! CONTRACT for every catalog: a name is committed only after every object it needs is stored (the caller
//! holds `lock_save` from its first object write through its index commit); `commit_name` returns the index
//! row to write in that commit; `lock_gc` excludes every save and every other gc until the guard drops, and
//! tells the time (the catalog's clock) that gc's grace period is measured against; `sync` and `reindex`
//! return None when the index is the catalog itself (nothing is kept elsewhere). A catalog that cannot reach
//! where it keeps names reports `Unavailable` (see `crate::unavailable`). Another implementation:
//! `crate::remote` (names in a bucket, mirrored into the index).

use std::time::SystemTime;

use serde::Serialize;

use crate::error::Result;
use crate::id::ObjectId;
use crate::index::{NameRecord, Retention};
use crate::manifest::Manifest;

mod local;

pub use local::{LocalCatalog, LockFile};

/// A held lock: released when dropped.
pub type Held = Box<dyn Send>;

/// gc's lock and the time to measure the grace period against (the catalog's clock).
pub struct GcLock {
    pub held: Held,
    pub now: SystemTime,
}

/// Whether a lookup should sync first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// The index is the catalog: nothing to sync, ever.
    Authoritative,
    /// Synced less than the catalog's interval ago: look up first, sync only on a miss.
    Recent,
    /// Sync, then look up.
    Due,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SyncReport {
    /// Names kept elsewhere (in the scope synced).
    pub names: usize,
    /// Name rows written (new or changed elsewhere).
    pub updated: usize,
    /// Name rows dropped (gone elsewhere).
    pub removed: usize,
    /// Manifests read (through the objects) into the index.
    pub manifests_fetched: usize,
    pub elapsed_s: f64,
}

/// The state a name is about to point at: its manifest's id, the manifest and its JSON (the stored bytes).
pub struct Committed<'a> {
    pub id: ObjectId,
    pub manifest: &'a Manifest,
    pub json: &'a [u8],
}

pub trait Catalog: Send + Sync {
    /// Where the names live when it is not this directory (a bucket store's `s3://bucket/prefix`); None: here.
    fn location(&self) -> Option<&str>;
    /// Requests sent to where the names live since the store was opened, by kind (empty: nowhere else).
    fn requests(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    /// A name's record, read where names live (mirrored into the index when that is elsewhere); None: no
    /// such name.
    fn name(&self, namespace: &str, name: &str) -> Result<Option<NameRecord>>;
    /// Point a name at `state`, whose objects are all stored; returns the index row to commit with it.
    fn commit_name(&self, namespace: &str, name: &str, state: &Committed, now: f64) -> Result<NameRecord>;
    /// Forget a name where names live, before the caller drops its index row. True if it was there (always
    /// false when the index is the catalog: the row is the name).
    fn remove_name(&self, namespace: &str, name: &str) -> Result<bool>;
    /// Set a name's retention where names live, before the caller updates its index row. True if it was
    /// there (always false when the index is the catalog).
    fn set_retention(&self, namespace: &str, name: &str, retention: Retention) -> Result<bool>;
    /// What a save holds from its first object write to its index commit.
    fn lock_save(&self) -> Result<Held>;
    /// What gc holds while it marks and sweeps.
    fn lock_gc(&self) -> Result<GcLock>;
    /// Whether a lookup in `namespace` should sync first.
    fn freshness(&self, namespace: &str) -> Freshness;
    /// Bring the index up to date with the names kept elsewhere (of one namespace, or all).
    fn sync(&self, namespace: Option<&str>) -> Result<Option<SyncReport>>;
    /// Rebuild the index's names, manifests, prefix keys and object rows from what is kept elsewhere.
    fn reindex(&self) -> Result<Option<SyncReport>>;
}
