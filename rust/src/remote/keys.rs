//! Keys of the bucket layout that more than one file writes: an object's key, and the unique suffix of a
//! lock or a quarantined copy.
//!
//! CONTRACT: `object_key(id)` is `objects/<2 hex>/<64 hex>` (the same sharding as a local store's files), a loose
//! object; `pack_key` / `index_key` are a pack and its index under `packs/`; `id_in_key` reads the id back;
//! `unique_suffix()` (objects' one home of it) is 16 random hex digits, so keys written by different processes
//! and machines do not collide.

use crate::id::ObjectId;
pub use crate::objects::atomic::unique_suffix;

pub fn object_key(id: &ObjectId) -> String {
    let h = id.hex();
    format!("objects/{}/{h}", &h[..2])
}

/// The id a loose object's or a pack's key ends with (None: another key, an index's `.idx` among them).
pub fn id_in_key(rel: &str) -> Option<ObjectId> {
    rel.rsplit('/').next()?.parse().ok()
}

/// Where packs and their indexes live (`pack.rs`).
pub const PACKS: &str = "packs";

/// `packs/<2 hex>/<64 hex>`: a pack, named by the hash of its bytes.
pub fn pack_key(id: &ObjectId) -> String {
    let h = id.hex();
    format!("{PACKS}/{}/{h}", &h[..2])
}

/// `packs/<2 hex>/<64 hex>.idx`: the pack's index alone (the same bytes as in the pack).
pub fn index_key(id: &ObjectId) -> String {
    format!("{}.idx", pack_key(id))
}
