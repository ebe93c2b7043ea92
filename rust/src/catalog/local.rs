//! `LocalCatalog`: a store whose names are the rows of its own LMDB index, and whose locks are `flock`s.
//!
//! CONTRACT: `name` reads the index row; `commit_name` only builds the row (the caller's one index commit
//! writes it); `remove_name` has nothing elsewhere to remove. `lock_save` is a shared flock on
//! `<store>/lock`, `lock_gc` the exclusive one (so no save is between its first object write and its commit
//! while gc sweeps), with the local clock. Nothing is kept elsewhere: no sync, lookups never wait for one.
//! `LockFile` is the flock itself, also held by catalogs that keep names elsewhere (one machine's saves).

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use super::{Catalog, Committed, Freshness, GcLock, Held, SyncReport};
use crate::error::{Error, Result};
use crate::index::{Index, NameRecord, Retention};

/// `<dir>/lock`, flocked shared by saves and exclusively by gc.
pub struct LockFile {
    path: PathBuf,
}

impl LockFile {
    /// The lock file at `path` (created if absent).
    pub fn new(path: PathBuf) -> Result<LockFile> {
        File::options().create(true).append(true).open(&path).map_err(|e| Error::io(&path, e))?;
        Ok(LockFile { path })
    }

    fn open(&self) -> Result<File> {
        File::options().create(true).append(true).open(&self.path).map_err(|e| Error::io(&self.path, e))
    }

    /// Shared flock; released when the file is dropped.
    pub fn shared(&self) -> Result<File> {
        let f = self.open()?;
        f.lock_shared().map_err(|e| Error::io(&self.path, e))?;
        Ok(f)
    }

    /// Exclusive flock; released when the file is dropped.
    pub fn exclusive(&self) -> Result<File> {
        let f = self.open()?;
        f.lock().map_err(|e| Error::io(&self.path, e))?;
        Ok(f)
    }
}

pub struct LocalCatalog {
    index: Arc<Index>,
    lock: LockFile,
}

impl LocalCatalog {
    pub fn new(index: Arc<Index>, lock: LockFile) -> LocalCatalog {
        LocalCatalog { index, lock }
    }
}

impl Catalog for LocalCatalog {
    fn location(&self) -> Option<&str> {
        None
    }

    fn name(&self, namespace: &str, name: &str) -> Result<Option<NameRecord>> {
        Ok(self.index.name_row(namespace, name)?)
    }

    fn commit_name(&self, _namespace: &str, _name: &str, state: &Committed, now: f64) -> Result<NameRecord> {
        let (displaced, retention) = (Vec::new(), Default::default());
        Ok(NameRecord { manifest: state.id, created: now, last_used: now, etag: None, displaced, retention })
    }

    fn remove_name(&self, _namespace: &str, _name: &str) -> Result<bool> {
        Ok(false)
    }

    fn set_retention(&self, _namespace: &str, _name: &str, _retention: Retention) -> Result<bool> {
        Ok(false)
    }

    fn lock_save(&self) -> Result<Held> {
        Ok(Box::new(self.lock.shared()?))
    }

    fn lock_gc(&self) -> Result<GcLock> {
        let held = Box::new(self.lock.exclusive()?);
        Ok(GcLock { held, now: SystemTime::now() })
    }

    fn freshness(&self, _namespace: &str) -> Freshness {
        Freshness::Authoritative
    }

    fn sync(&self, _namespace: Option<&str>) -> Result<Option<SyncReport>> {
        Ok(None)
    }

    fn reindex(&self) -> Result<Option<SyncReport>> {
        Ok(None)
    }
}
