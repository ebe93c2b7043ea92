//! `BucketObjects`, the `Backend` of objects in a bucket: `<prefix>/objects/<2 hex>/<64 hex>`, the same KVOB
//! bytes as a local store's files.
//!
//! CONTRACT: a put is a create-if-absent (If-None-Match: *), so an object that exists is never rewritten
//! (content addressing makes the existing bytes the same ones); a PUT is atomic on S3, so there are no temp
//! files. `put_files` encodes on rayon's threads and then uploads concurrently (16 requests in flight); all
//! are durable in the bucket when it returns. `touch` cannot refresh a bucket's LastModified: it is a HEAD,
//! and reuse is protected by the lock protocol (`locks.rs`) instead of mtimes. `quarantine` copies a corrupt
//! object to `<prefix>/quarantine/` and deletes it, so the next put of the same content repairs it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use rayon::prelude::*;

use super::client::{Bucket, Meta};
use super::keys::{object_key, unique_suffix};
use crate::id::ObjectId;
use crate::objects::{Backend, ObjectError, Stamped};

/// Requests in flight for a batch of uploads or downloads.
pub const PARALLEL: usize = 16;

#[derive(Clone)]
pub struct BucketObjects {
    pub(crate) bucket: Arc<Bucket>,
}

impl BucketObjects {
    pub fn new(bucket: Arc<Bucket>) -> Self {
        BucketObjects { bucket }
    }

    /// Upload encoded objects concurrently (create-if-absent each).
    pub fn upload(&self, items: Vec<(ObjectId, Bytes)>) -> Result<(), ObjectError> {
        let b = &*self.bucket;
        b.run_all(items, PARALLEL, |(id, bytes)| async move { b.put_create_async(&object_key(&id), bytes).await })?;
        Ok(())
    }

    /// Download these objects concurrently; None for an absent one.
    pub fn download(&self, ids: Vec<ObjectId>) -> Result<Vec<Option<Bytes>>, ObjectError> {
        let b = &*self.bucket;
        let got = b.run_all(ids, PARALLEL, |id| async move {
            Ok(b.get_async(&object_key(&id)).await?.map(|(bytes, _)| bytes))
        })?;
        Ok(got)
    }

    /// Every object in the bucket with its metadata (LastModified is the bucket's clock).
    pub fn list_meta(&self) -> Result<Vec<(ObjectId, Meta)>, ObjectError> {
        let metas = self.bucket.list("objects")?;
        Ok(metas
            .into_iter()
            .filter_map(|m| m.rel.rsplit('/').next().and_then(|n| n.parse::<ObjectId>().ok()).map(|id| (id, m)))
            .collect())
    }
}

impl BucketObjects {
    /// `Backend::put_files`'s work, returning the encoded bytes (None: already present) so that the cache in
    /// front (`Cached`) keeps the same bytes without encoding or uploading twice.
    #[allow(clippy::type_complexity)]
    pub fn encode_and_upload(
        &self,
        ids: &[ObjectId],
        make: &(dyn Fn(usize) -> Result<Option<Vec<u8>>, ObjectError> + Sync),
    ) -> Result<Vec<Option<Bytes>>, ObjectError> {
        // `make` may block on the bucket itself (a HEAD), so it runs here, outside the runtime.
        let encoded: Vec<Option<Bytes>> =
            (0..ids.len()).into_par_iter().map(|i| Ok(make(i)?.map(Bytes::from))).collect::<Result<_, ObjectError>>()?;
        let items = ids.iter().zip(&encoded).filter_map(|(id, e)| e.clone().map(|b| (*id, b))).collect();
        self.upload(items)?;
        Ok(encoded)
    }
}

impl Backend for BucketObjects {
    fn put_file(&self, id: &ObjectId, encoded: &[u8]) -> Result<(), ObjectError> {
        self.bucket.put_create(&object_key(id), Bytes::copy_from_slice(encoded))?;
        Ok(())
    }

    fn put_files(
        &self,
        ids: &[ObjectId],
        make: &(dyn Fn(usize) -> Result<Option<Vec<u8>>, ObjectError> + Sync),
    ) -> Result<Vec<Option<u64>>, ObjectError> {
        Ok(self.encode_and_upload(ids, make)?.iter().map(|e| e.as_ref().map(|b| b.len() as u64)).collect())
    }

    fn get(&self, id: &ObjectId) -> Result<Option<Vec<u8>>, ObjectError> {
        Ok(self.bucket.get(&object_key(id))?.map(|(b, _)| b.to_vec()))
    }

    fn exists(&self, id: &ObjectId) -> Result<bool, ObjectError> {
        Ok(self.bucket.head(&object_key(id))?.is_some())
    }

    fn list(&self) -> Result<Vec<ObjectId>, ObjectError> {
        Ok(self.list_meta()?.into_iter().map(|(id, _)| id).collect())
    }

    fn list_stamped(&self) -> Result<Vec<Stamped>, ObjectError> {
        Ok(self.list_meta()?.into_iter().map(|(id, m)| (id, m.modified, m.size)).collect())
    }

    fn delete_many(&self, ids: &[ObjectId]) -> Result<(), ObjectError> {
        let b = &*self.bucket;
        b.run_all(ids.to_vec(), PARALLEL, |id| async move { b.delete_async(&object_key(&id)).await })?;
        Ok(())
    }

    fn delete(&self, id: &ObjectId) -> Result<u64, ObjectError> {
        let key = object_key(id);
        let Some(m) = self.bucket.head(&key)? else { return Ok(0) };
        self.bucket.delete(&key)?;
        Ok(m.size)
    }

    fn mtime(&self, id: &ObjectId) -> Result<Option<(SystemTime, u64)>, ObjectError> {
        Ok(self.bucket.head(&object_key(id))?.map(|m| (m.modified, m.size)))
    }

    fn touch(&self, id: &ObjectId) -> Result<Option<u64>, ObjectError> {
        Ok(self.bucket.head(&object_key(id))?.map(|m| m.size))
    }

    fn stale_temp(&self, _grace: Duration) -> Result<usize, ObjectError> {
        Ok(0)
    }

    fn clean_temp(&self, _grace: Duration) -> Result<usize, ObjectError> {
        Ok(0)
    }

    fn quarantine(&self, id: &ObjectId) -> Result<(), ObjectError> {
        let key = object_key(id);
        let Some((bytes, _)) = self.bucket.get(&key)? else { return Ok(()) };
        self.bucket.put(&format!("quarantine/{}.{}", id.hex(), unique_suffix()), bytes)?;
        self.bucket.delete(&key)?;
        Ok(())
    }

    fn prefetch(&self, _ids: &[ObjectId]) -> Result<(), ObjectError> {
        Ok(())
    }
}
