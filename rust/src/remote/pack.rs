//! The pack: objects uploaded together as one bucket object, as restic packs blobs. A save's new objects go
//! up as a few packs instead of one request each, and a cold restore reads them back with a few ranged GETs.
//!
//! CONTRACT (little-endian):
//! ```text
//! pack    = object* index trailer           key packs/<2 hex>/<64 hex>, the blake3 of the whole pack
//! index   = "KVPI" version:u8=1 count:u32 data_len:u64 (id:[u8;32] offset:u64 len:u32)*count
//! trailer = index_len:u32 "KVPK"
//! ```
//! The objects are the same encoded (KVOB) bytes as a loose object's, back to back from offset 0; `data_len`
//! is where they end. The index is also stored alone (`packs/<2 hex>/<64 hex>.idx`, same bytes) so that a reader
//! learns where every object is without touching the packs; the trailer lets the index be rebuilt from the
//! pack itself. `decode_index` checks every entry against `data_len`, so a damaged index never slices out of
//! the pack (a wrong offset inside it is caught by the object's own hash, as any corrupt object is).

use bytes::Bytes;

use crate::id::ObjectId;

const INDEX_MAGIC: &[u8; 4] = b"KVPI";
const PACK_MAGIC: &[u8; 4] = b"KVPK";
const VERSION: u8 = 1;
const HEADER: usize = 4 + 1 + 4 + 8;
const ENTRY: usize = 32 + 8 + 4;
/// Bytes at the end of a pack that say how long its index is.
pub const TRAILER: usize = 8;

/// Where one object lies in its pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub id: ObjectId,
    pub offset: u64,
    pub len: u32,
}

/// A pack ready to upload: its id (the hash of `bytes`), its bytes, and where each object lies.
pub struct Built {
    pub id: ObjectId,
    pub bytes: Bytes,
    pub index: Vec<u8>,
    pub entries: Vec<Entry>,
}

/// Lay these encoded objects out as one pack.
pub fn build(items: &[(ObjectId, Bytes)]) -> Built {
    let data_len: usize = items.iter().map(|(_, b)| b.len()).sum();
    let mut entries = Vec::with_capacity(items.len());
    let mut out = Vec::with_capacity(data_len + HEADER + ENTRY * items.len() + TRAILER);
    for (id, b) in items {
        entries.push(Entry { id: *id, offset: out.len() as u64, len: b.len() as u32 });
        out.extend_from_slice(b);
    }
    let index = encode_index(&entries, data_len as u64);
    out.extend_from_slice(&index);
    out.extend_from_slice(&(index.len() as u32).to_le_bytes());
    out.extend_from_slice(PACK_MAGIC);
    Built { id: ObjectId::of(&out), bytes: Bytes::from(out), index, entries }
}

/// Split objects into groups of about `target` bytes each (an object larger than `target` is a group alone),
/// in their order, so that a state's objects stay adjacent and read back as one range.
pub fn group(items: Vec<(ObjectId, Bytes)>, target: usize) -> Vec<Vec<(ObjectId, Bytes)>> {
    let mut groups: Vec<Vec<(ObjectId, Bytes)>> = Vec::new();
    let mut size = 0usize;
    for item in items {
        if groups.is_empty() || (size > 0 && size + item.1.len() > target) {
            groups.push(Vec::new());
            size = 0;
        }
        size += item.1.len();
        groups.last_mut().expect("pushed above").push(item);
    }
    groups
}

pub fn encode_index(entries: &[Entry], data_len: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + ENTRY * entries.len());
    out.extend_from_slice(INDEX_MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    out.extend_from_slice(&data_len.to_le_bytes());
    for e in entries {
        out.extend_from_slice(&e.id.0);
        out.extend_from_slice(&e.offset.to_le_bytes());
        out.extend_from_slice(&e.len.to_le_bytes());
    }
    out
}

/// The entries of an index and the length of the pack's object data; an error says what is wrong.
pub fn decode_index(bytes: &[u8]) -> Result<(Vec<Entry>, u64), String> {
    if bytes.len() < HEADER || &bytes[..4] != INDEX_MAGIC {
        return Err("not a pack index (bad magic)".into());
    }
    if bytes[4] != VERSION {
        return Err(format!("pack index version {} (this kvstore reads {VERSION})", bytes[4]));
    }
    let count = u32::from_le_bytes(bytes[5..9].try_into().expect("4 bytes")) as usize;
    let data_len = u64::from_le_bytes(bytes[9..17].try_into().expect("8 bytes"));
    if bytes.len() != HEADER + count * ENTRY {
        return Err(format!("pack index of {} bytes for {count} entries", bytes.len()));
    }
    let mut entries = Vec::with_capacity(count);
    for raw in bytes[HEADER..].chunks_exact(ENTRY) {
        let id = ObjectId(raw[..32].try_into().expect("32 bytes"));
        let offset = u64::from_le_bytes(raw[32..40].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(raw[40..44].try_into().expect("4 bytes"));
        if offset.checked_add(len as u64).is_none_or(|end| end > data_len) {
            return Err(format!("entry {} at {offset}+{len} past the pack's {data_len} bytes of objects", id.short()));
        }
        entries.push(Entry { id, offset, len });
    }
    Ok((entries, data_len))
}

/// The index length a pack's last `TRAILER` bytes give.
pub fn trailer_index_len(tail: &[u8]) -> Result<u64, String> {
    if tail.len() != TRAILER || &tail[4..] != PACK_MAGIC {
        return Err("not a pack (bad trailer)".into());
    }
    Ok(u32::from_le_bytes(tail[..4].try_into().expect("4 bytes")) as u64)
}

/// The whole pack's length, from its index.
pub fn pack_len(data_len: u64, entries: usize) -> u64 {
    data_len + (HEADER + ENTRY * entries + TRAILER) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(n: u8, len: usize) -> (ObjectId, Bytes) {
        let b = Bytes::from(vec![n; len]);
        (ObjectId::of(&b), b)
    }

    #[test]
    fn a_pack_holds_its_objects_at_the_offsets_its_index_and_trailer_give() {
        let items = vec![obj(1, 10), obj(2, 0), obj(3, 700)];
        let p = build(&items);
        assert_eq!(p.id, ObjectId::of(&p.bytes));
        let tail = &p.bytes[p.bytes.len() - TRAILER..];
        let ilen = trailer_index_len(tail).unwrap() as usize;
        let index = &p.bytes[p.bytes.len() - TRAILER - ilen..p.bytes.len() - TRAILER];
        assert_eq!(index, &p.index[..]);
        let (entries, data_len) = decode_index(index).unwrap();
        assert_eq!(entries, p.entries);
        assert_eq!(data_len, 710);
        assert_eq!(pack_len(data_len, entries.len()), p.bytes.len() as u64);
        for ((id, b), e) in items.iter().zip(&entries) {
            assert_eq!(e.id, *id);
            assert_eq!(&p.bytes[e.offset as usize..(e.offset + e.len as u64) as usize], &b[..]);
        }
    }

    #[test]
    fn a_damaged_index_is_refused_and_never_points_past_the_objects() {
        let p = build(&[obj(1, 10), obj(2, 20)]);
        let mut bad = p.index.clone();
        bad[HEADER + 32] = 200; // the first entry's offset
        assert!(decode_index(&bad).unwrap_err().contains("past the pack"));
        assert!(decode_index(&p.index[..p.index.len() - 1]).unwrap_err().contains("entries"));
        assert!(decode_index(b"nope").unwrap_err().contains("magic"));
        assert!(trailer_index_len(b"12345678").unwrap_err().contains("trailer"));
    }

    #[test]
    fn groups_keep_order_and_stay_near_the_target() {
        let items: Vec<_> = (0..10).map(|i| obj(i, 100)).collect();
        let ids: Vec<_> = items.iter().map(|(id, _)| *id).collect();
        let groups = group(items, 250);
        assert_eq!(groups.iter().map(|g| g.len()).collect::<Vec<_>>(), vec![2, 2, 2, 2, 2]);
        assert_eq!(groups.concat().iter().map(|(id, _)| *id).collect::<Vec<_>>(), ids);
        assert_eq!(group(vec![obj(1, 900), obj(2, 5)], 250).len(), 2);
    }
}
