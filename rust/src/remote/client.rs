//! The bucket client: any `Arc<dyn ObjectStore>` (S3 from `s3.rs`, `InMemory` in unit tests) on a small tokio
//! runtime owned here; every call blocks on it (the core's API is sync, Python releases the GIL). Keys are
//! relative to the store's prefix. The one mapping from object_store's errors to `RemoteError`.
//!
//! CONTRACT: NotFound reads are None; conditional puts: `put_create` (If-None-Match: *, false if the key
//! exists) and `put_if_match` (If-Match: etag, None when another writer got there first); permission errors
//! are `Denied`; every other failure (connection, timeout, 5xx after retries) is `Unavailable`.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{GetOptions, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use super::error::RemoteError;
use super::url::BucketUrl;

/// Requests in flight for a batch of uploads, downloads or deletes (`Bucket::run_all`'s usual limit).
pub const PARALLEL: usize = 16;
/// The least bytes one ranged GET of a restore asks for, unless set otherwise (`KVSTORE_S3_RANGE_MIB`). Why 8
/// MiB: AWS's S3 performance guidelines name 8 or 16 MB as typical byte-range sizes, and SeaweedFS, measured
/// here (a 13.6 MB pack on loopback), serves 2 ranges of ~8 MiB in 8.5-11 ms and 11 ranges of ~1.3 MB in
/// 18-19 ms (a whole GET: 10 ms): it reads whole chunks for a range, so small ones cost it several times
/// their bytes. A client far from its bucket with small states may want smaller ones, for more in flight.
pub const RANGE_BYTES: u64 = 8 << 20;

/// What a listing or a head tells about one key.
#[derive(Debug, Clone)]
pub struct Meta {
    /// Key relative to the store's prefix.
    pub rel: String,
    pub size: u64,
    /// The bucket's LastModified (the bucket's clock, not ours).
    pub modified: SystemTime,
    pub etag: Option<String>,
}

pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    url: String,
    rt: tokio::runtime::Runtime,
    requests: Requests,
    range_bytes: u64,
    /// A restore writes each object as it arrives (`store/streamed.rs`) rather than after all arrived
    /// (`KVSTORE_S3_STREAM`, `s3.rs`).
    streams_restores: bool,
}

/// Requests sent so far, by kind (a listing counts once, however many pages it reads): what a restore or a
/// save costs in round trips is a count, steadier than its time on a shared machine.
#[derive(Default)]
struct Requests {
    get: AtomicU64,
    get_range: AtomicU64,
    head: AtomicU64,
    list: AtomicU64,
    put: AtomicU64,
    delete: AtomicU64,
}

fn count(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Bucket {
    /// A bucket over any object store (S3 from `s3::client`, `InMemory` in tests).
    pub fn new(store: Arc<dyn ObjectStore>, url: &BucketUrl) -> Result<Bucket, RemoteError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kvstore-s3")
            .enable_all()
            .build()
            .map_err(|e| RemoteError::Invalid { url: url.display(), detail: format!("starting the I/O runtime: {e}") })?;
        Ok(Bucket { store, prefix: url.prefix.clone(), url: url.display(), rt, requests: Requests::default(), range_bytes: RANGE_BYTES, streams_restores: false })
    }

    /// The least bytes a restore's ranged GET asks for (`RANGE_BYTES` unless set).
    pub fn with_range_bytes(mut self, bytes: u64) -> Bucket {
        self.range_bytes = bytes.max(1);
        self
    }

    pub fn range_bytes(&self) -> u64 {
        self.range_bytes
    }

    /// Whether a restore is written as its objects arrive (false unless set).
    pub fn with_streamed_restores(mut self, on: bool) -> Bucket {
        self.streams_restores = on;
        self
    }

    pub fn streams_restores(&self) -> bool {
        self.streams_restores
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Requests sent since this bucket was opened, by kind.
    pub fn requests(&self) -> Vec<(&'static str, u64)> {
        let r = &self.requests;
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![("get", n(&r.get)), ("get_range", n(&r.get_range)), ("head", n(&r.head)), ("list", n(&r.list)),
             ("put", n(&r.put)), ("delete", n(&r.delete))]
    }

    pub fn path(&self, rel: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(rel)
        } else {
            Path::from(format!("{}/{rel}", self.prefix))
        }
    }

    fn rel(&self, p: &Path) -> String {
        let s = p.as_ref();
        match self.prefix.is_empty() {
            true => s.to_string(),
            false => s.strip_prefix(&self.prefix).map(|r| r.trim_start_matches('/')).unwrap_or(s).to_string(),
        }
    }

    fn meta(&self, m: ObjectMeta) -> Meta {
        let ms = m.last_modified.timestamp_millis().max(0) as u64;
        Meta { rel: self.rel(&m.location), size: m.size, modified: SystemTime::UNIX_EPOCH + Duration::from_millis(ms), etag: m.e_tag }
    }

    /// The one mapping of object_store errors (NotFound / AlreadyExists / Precondition are handled by callers).
    pub fn err(&self, e: object_store::Error) -> RemoteError {
        match e {
            object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
                RemoteError::Denied { url: self.url.clone(), detail: e.to_string() }
            }
            object_store::Error::NotFound { .. } => RemoteError::Invalid {
                url: self.url.clone(),
                detail: format!("not found ({e}); does the bucket exist?"),
            },
            e => RemoteError::Unavailable { url: self.url.clone(), detail: e.to_string() },
        }
    }

    /// Run a future on the bucket's runtime (from any thread outside it).
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    pub async fn get_async(&self, rel: &str) -> Result<Option<(Bytes, Meta)>, RemoteError> {
        count(&self.requests.get);
        match self.store.get(&self.path(rel)).await {
            Ok(r) => {
                let meta = self.meta(r.meta.clone());
                let bytes = r.bytes().await.map_err(|e| self.err(e))?;
                Ok(Some((bytes, meta)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    pub fn get(&self, rel: &str) -> Result<Option<(Bytes, Meta)>, RemoteError> {
        self.block_on(self.get_async(rel))
    }

    /// Bytes `range` of `rel` (one ranged GET); None if `rel` does not exist.
    pub async fn get_range_async(&self, rel: &str, range: std::ops::Range<u64>) -> Result<Option<Bytes>, RemoteError> {
        count(&self.requests.get_range);
        match self.store.get_range(&self.path(rel), range).await {
            Ok(b) => Ok(Some(b)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    /// [`get_range_async`](Self::get_range_async), each chunk of the body handed to `each` as it arrives;
    /// Some(bytes received), None if `rel` does not exist.
    pub async fn get_range_each(
        &self,
        rel: &str,
        range: std::ops::Range<u64>,
        mut each: impl FnMut(Bytes),
    ) -> Result<Option<u64>, RemoteError> {
        count(&self.requests.get_range);
        let got = match self.store.get_opts(&self.path(rel), GetOptions::new().with_range(Some(range))).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.err(e)),
        };
        let mut body = got.into_stream();
        let mut received = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| self.err(e))?;
            received += chunk.len() as u64;
            each(chunk);
        }
        Ok(Some(received))
    }

    pub async fn head_async(&self, rel: &str) -> Result<Option<Meta>, RemoteError> {
        count(&self.requests.head);
        match self.store.head(&self.path(rel)).await {
            Ok(m) => Ok(Some(self.meta(m))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    pub fn head(&self, rel: &str) -> Result<Option<Meta>, RemoteError> {
        self.block_on(self.head_async(rel))
    }

    /// Create `rel` unless it exists (If-None-Match: *). True if this call created it.
    pub async fn put_create_async(&self, rel: &str, bytes: Bytes) -> Result<bool, RemoteError> {
        let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
        count(&self.requests.put);
        match self.store.put_opts(&self.path(rel), PutPayload::from_bytes(bytes), opts).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => Ok(false),
            Err(e) => Err(self.err(e)),
        }
    }

    pub fn put_create(&self, rel: &str, bytes: Bytes) -> Result<bool, RemoteError> {
        self.block_on(self.put_create_async(rel, bytes))
    }

    /// Compare-and-swap: create (`etag` None) or replace the version with this ETag. Ok(None) when another
    /// writer got there first (the caller re-reads); Ok(Some(new etag)) on success.
    pub fn put_if_match(&self, rel: &str, bytes: Bytes, etag: Option<&str>) -> Result<Option<String>, RemoteError> {
        let mode = match etag {
            None => PutMode::Create,
            Some(t) => PutMode::Update(UpdateVersion { e_tag: Some(t.to_string()), version: None }),
        };
        let opts = PutOptions { mode, ..Default::default() };
        count(&self.requests.put);
        match self.block_on(self.store.put_opts(&self.path(rel), PutPayload::from_bytes(bytes), opts)) {
            Ok(r) => Ok(Some(r.e_tag.unwrap_or_default())),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Rewrite `rel` with `body` every `every` (a held lock's LastModified stays fresh) until aborted.
    pub fn refresh_every(&self, rel: &str, body: Bytes, every: Duration) -> tokio::task::JoinHandle<()> {
        let (store, path) = (self.store.clone(), self.path(rel));
        self.rt.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let _ = store.put(&path, PutPayload::from_bytes(body.clone())).await;
            }
        })
    }

    /// Unconditional write (lock files, whose keys are unique).
    pub fn put(&self, rel: &str, bytes: Bytes) -> Result<(), RemoteError> {
        count(&self.requests.put);
        self.block_on(self.store.put(&self.path(rel), PutPayload::from_bytes(bytes))).map(|_| ()).map_err(|e| self.err(e))
    }

    /// Delete; absent is fine.
    pub async fn delete_async(&self, rel: &str) -> Result<(), RemoteError> {
        count(&self.requests.delete);
        match self.store.delete(&self.path(rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }

    pub fn delete(&self, rel: &str) -> Result<(), RemoteError> {
        self.block_on(self.delete_async(rel))
    }

    /// Every key under `rel_dir/` (recursive), with its metadata.
    pub fn list(&self, rel_dir: &str) -> Result<Vec<Meta>, RemoteError> {
        count(&self.requests.list);
        let p = self.path(rel_dir);
        let metas: Vec<ObjectMeta> =
            self.block_on(self.store.list(Some(&p)).try_collect()).map_err(|e| self.err(e))?;
        Ok(metas.into_iter().map(|m| self.meta(m)).collect())
    }

    /// Run `f(item)` for every item with at most `limit` requests in flight; results in input order.
    pub fn run_all<'a, T, R, F, Fut>(&'a self, items: Vec<T>, limit: usize, f: F) -> Result<Vec<R>, RemoteError>
    where
        F: Fn(T) -> Fut,
        Fut: Future<Output = Result<R, RemoteError>> + 'a,
    {
        self.block_on(futures::stream::iter(items.into_iter().map(f)).buffered(limit.max(1)).try_collect())
    }
}
