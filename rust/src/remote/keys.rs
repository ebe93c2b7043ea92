//! Keys of the bucket layout that more than one file writes: an object's key, and the unique suffix of a
//! lock or a quarantined copy.
//!
//! CONTRACT: `object_key(id)` is `objects/<2 hex>/<64 hex>` (the same sharding as a local store's files);
//! `unique_suffix()` (objects' one home of it) is 16 random hex digits, so keys written by different processes
//! and machines do not collide.

use crate::id::ObjectId;
pub use crate::objects::atomic::unique_suffix;

pub fn object_key(id: &ObjectId) -> String {
    let h = id.hex();
    format!("objects/{}/{h}", &h[..2])
}
