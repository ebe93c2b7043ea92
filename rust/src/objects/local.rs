//! `LocalDir`, the local-directory backend.
//!
//! CONTRACT: the `Backend` contract over `<root>/xx/<64 hex>`: temp files `<root>/xx/.tmp-<random>` beside
//! their target (written through `atomic.rs`), corrupt objects moved to `<root>/.quarantine/`, `touch` sets
//! the mtime (gc's grace period). `volatile` (a cache of objects kept elsewhere, each read re-hashed) skips
//! the fsyncs.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rayon::prelude::*;

use super::atomic::{atomic_write, fsync_dir, touch_now, unique_suffix, write_batch, write_new, OBJECT_TEMP};
use super::{Backend, ObjectError, TEMP_PREFIX};
use crate::id::ObjectId;

pub struct LocalDir {
    root: PathBuf,
    durable: bool,
}

impl LocalDir {
    pub fn new(root: impl Into<PathBuf>) -> Result<Self, ObjectError> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(|e| ObjectError::io(&root, e))?;
        Ok(LocalDir { root, durable: true })
    }
    /// A directory whose writes are atomic but not fsynced (a cache of objects kept elsewhere).
    pub fn volatile(root: impl Into<PathBuf>) -> Result<Self, ObjectError> {
        Ok(LocalDir { durable: false, ..Self::new(root)? })
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn path_of(&self, id: &ObjectId) -> PathBuf {
        let h = id.hex();
        self.root.join(&h[..2]).join(h)
    }
    /// Keep `encoded` as `id` unless a file for it is here: true if this call put it there (of writers racing
    /// to keep one object, one says true). Not fsynced: for a cache, whose objects live elsewhere too.
    pub fn put_new(&self, id: &ObjectId, encoded: &[u8]) -> Result<bool, ObjectError> {
        let target = self.path_of(id);
        if target.is_file() {
            return Ok(false);
        }
        self.make_shards(std::slice::from_ref(&target))?;
        write_new(&target, OBJECT_TEMP, encoded)
    }
    /// Call `f` on each temp file older than `grace` (in the shards and the root); count those it accepts.
    fn each_stale_temp(
        &self,
        grace: Duration,
        f: &mut dyn FnMut(&Path) -> Result<bool, ObjectError>,
    ) -> Result<usize, ObjectError> {
        let cutoff = SystemTime::now().checked_sub(grace).unwrap_or(SystemTime::UNIX_EPOCH);
        let mut n = 0;
        let mut dirs = self.shards()?;
        dirs.push(self.root.clone());
        for dir in dirs {
            let rd = fs::read_dir(&dir).map_err(|e| ObjectError::io(&dir, e))?;
            for ent in rd {
                let ent = ent.map_err(|e| ObjectError::io(&dir, e))?;
                if !ent.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                    continue;
                }
                let Ok(m) = ent.metadata() else { continue };
                if m.is_file() && m.modified().map(|t| t < cutoff).unwrap_or(false) && f(&ent.path())? {
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// The shard directories of `targets`, each new one made durable in the root.
    fn make_shards(&self, targets: &[PathBuf]) -> Result<(), ObjectError> {
        let mut made = false;
        for shard in targets.iter().map(|t| t.parent().expect("object path has a shard dir")) {
            if !shard.is_dir() {
                fs::create_dir_all(shard).map_err(|e| ObjectError::io(shard, e))?;
                made = true;
            }
        }
        if made && self.durable {
            fsync_dir(&self.root).map_err(|e| ObjectError::io(&self.root, e))?;
        }
        Ok(())
    }
    pub(crate) fn shards(&self) -> Result<Vec<PathBuf>, ObjectError> {
        let mut out = Vec::new();
        let rd = match fs::read_dir(&self.root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(ObjectError::io(&self.root, e)),
        };
        for ent in rd {
            let ent = ent.map_err(|e| ObjectError::io(&self.root, e))?;
            let name = ent.file_name();
            let name = name.to_string_lossy();
            if name.len() == 2 && name.bytes().all(|b| b.is_ascii_hexdigit()) && ent.path().is_dir() {
                out.push(ent.path());
            }
        }
        Ok(out)
    }
}

impl Backend for LocalDir {
    fn put_file(&self, id: &ObjectId, encoded: &[u8]) -> Result<(), ObjectError> {
        let target = self.path_of(id);
        self.make_shards(std::slice::from_ref(&target))?;
        atomic_write(&target, OBJECT_TEMP, encoded, self.durable, || Ok::<(), ObjectError>(()))
    }

    /// Batched: every object is encoded, written to its temp file and fsynced on a few I/O threads (an fsync
    /// blocks, so encoding the next object overlaps it); then all are renamed and each touched shard
    /// directory is fsynced once, instead of once per object.
    fn put_files(
        &self,
        ids: &[ObjectId],
        make: &(dyn Fn(usize) -> Result<Option<Vec<u8>>, ObjectError> + Sync),
    ) -> Result<Vec<Option<u64>>, ObjectError> {
        if !self.durable {
            let put = |(i, id): (usize, &ObjectId)| -> Result<Option<u64>, ObjectError> {
                let enc = make(i)?;
                enc.as_ref().map(|e| self.put_file(id, e)).transpose()?;
                Ok(enc.map(|e| e.len() as u64))
            };
            // No fsync to overlap here, but the writes themselves (a cache filled by a cold restore) run side by
            // side on rayon's threads.
            return ids.par_iter().enumerate().map(put).collect();
        }
        let targets: Vec<PathBuf> = ids.iter().map(|id| self.path_of(id)).collect();
        self.make_shards(&targets)?;
        write_batch(&targets, OBJECT_TEMP, make)
    }

    fn get(&self, id: &ObjectId) -> Result<Option<Vec<u8>>, ObjectError> {
        let p = self.path_of(id);
        match fs::read(&p) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ObjectError::io(p, e)),
        }
    }

    fn get_into(&self, id: &ObjectId, buf: &mut Vec<u8>) -> Result<bool, ObjectError> {
        use std::io::Read;
        let p = self.path_of(id);
        let mut f = match File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(ObjectError::io(p, e)),
        };
        buf.clear();
        let len = f.metadata().map(|m| m.len() as usize).unwrap_or(0);
        buf.reserve(len);
        f.read_to_end(buf).map_err(|e| ObjectError::io(&p, e))?;
        Ok(true)
    }

    fn exists(&self, id: &ObjectId) -> Result<bool, ObjectError> {
        Ok(self.mtime(id)?.is_some())
    }

    fn local_file(&self, id: &ObjectId) -> Option<PathBuf> {
        Some(self.path_of(id))
    }

    fn list(&self) -> Result<Vec<ObjectId>, ObjectError> {
        let mut out = Vec::new();
        for shard in self.shards()? {
            let rd = fs::read_dir(&shard).map_err(|e| ObjectError::io(&shard, e))?;
            for ent in rd {
                let ent = ent.map_err(|e| ObjectError::io(&shard, e))?;
                if let Some(Ok(id)) = ent.file_name().to_str().map(str::parse::<ObjectId>) {
                    out.push(id);
                }
            }
        }
        Ok(out)
    }

    fn quarantine(&self, id: &ObjectId) -> Result<(), ObjectError> {
        let dir = self.root.join(".quarantine");
        fs::create_dir_all(&dir).map_err(|e| ObjectError::io(&dir, e))?;
        let src = self.path_of(id);
        let dst = dir.join(format!("{}.{}", id.hex(), unique_suffix()));
        match fs::rename(&src, &dst) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()), // another reader moved it first
            Err(e) => Err(ObjectError::io(src, e)),
        }
    }

    fn delete(&self, id: &ObjectId) -> Result<u64, ObjectError> {
        let p = self.path_of(id);
        let len = match fs::metadata(&p) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(ObjectError::io(p, e)),
        };
        match fs::remove_file(&p) {
            Ok(()) => Ok(len),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(ObjectError::io(p, e)),
        }
    }

    fn mtime(&self, id: &ObjectId) -> Result<Option<(SystemTime, u64)>, ObjectError> {
        let p = self.path_of(id);
        match fs::metadata(&p) {
            Ok(m) if m.is_file() => {
                let t = m.modified().map_err(|e| ObjectError::io(&p, e))?;
                Ok(Some((t, m.len())))
            }
            Ok(_) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ObjectError::io(p, e)),
        }
    }

    fn touch(&self, id: &ObjectId) -> Result<Option<u64>, ObjectError> {
        let p = self.path_of(id);
        let m = match fs::metadata(&p) {
            Ok(m) if m.is_file() => m,
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ObjectError::io(p, e)),
        };
        touch_now(&p).map_err(|e| ObjectError::io(&p, e))?;
        Ok(Some(m.len()))
    }

    fn stale_temp(&self, grace: Duration) -> Result<usize, ObjectError> {
        self.each_stale_temp(grace, &mut |_| Ok(true))
    }

    fn clean_temp(&self, grace: Duration) -> Result<usize, ObjectError> {
        self.each_stale_temp(grace, &mut |p| match fs::remove_file(p) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(ObjectError::io(p, e)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    #[test]
    fn clean_temp_respects_grace() {
        let d = TempDir::new("tmp");
        let local = LocalDir::new(&d.0).unwrap();
        fs::create_dir_all(d.0.join("ab")).unwrap();
        fs::write(d.0.join("ab").join(".tmp-x"), b"x").unwrap();
        assert_eq!(local.clean_temp(Duration::from_secs(3600)).unwrap(), 0);
        assert_eq!(local.stale_temp(Duration::ZERO).unwrap(), 1);
        assert!(d.0.join("ab").join(".tmp-x").exists());
        assert_eq!(local.clean_temp(Duration::ZERO).unwrap(), 1);
        assert!(!d.0.join("ab").join(".tmp-x").exists());
    }
}
