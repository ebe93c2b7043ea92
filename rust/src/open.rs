//! Opening a store at a location: a directory (objects in files, names in its own index) or `s3://...` (both
//! seams over a bucket, with a local cache directory). The one place that chooses a backend by location.
//!
//! CONTRACT: `open_location` refuses `cache`/`cache_size` for a local store and requires `cache` for a
//! bucket store; block size and zstd level are checked before anything is written; a bucket store's block
//! size is the bucket's (fixed by the first store opened on it).

use std::path::Path;

use crate::error::{Error, Result};
use crate::store::{check_params, Store};

/// Open a local store (a path) or a bucket store (`s3://...`, which needs `cache`).
pub fn open_location(
    location: &str,
    cache: Option<&Path>,
    cache_size: Option<u64>,
    block_size: u32,
    level: i32,
    map_size: usize,
) -> Result<Store> {
    if crate::remote::is_remote(location) {
        let cache = cache.ok_or_else(|| {
            Error::Invalid(format!("a bucket store ({location}) needs cache=: the local cache directory"))
        })?;
        check_params(block_size, level)?;
        let p = crate::remote::open(location, cache, cache_size, block_size, map_size)?;
        Store::from_parts(p.root, p.index, p.objects, p.catalog, level)
    } else if cache.is_some() || cache_size.is_some() {
        Err(Error::Invalid(format!("cache= and cache_size= are for a bucket store (s3://...); {location} is a local store")))
    } else {
        Store::open(Path::new(location), block_size, level, map_size)
    }
}
