//! Name records in the bucket: `<prefix>/names/h<hex(namespace)>/h<hex(name)>`, JSON
//! `{"manifest": hex, "created": unix s, "displaced": [hex, ..], "retention": {"ttl_s", "pinned"},
//! "manifest_json": "...", "packs": [hex, ..], "placed": [[pack, hex, offset, length], ..]}` (hex keeps any
//! name a safe key; `retention` absent = none, and every later save carries it over). `manifest_json` is the
//! manifest itself when it is at most `INLINE_MANIFEST_MAX` bytes: a machine restoring the name for the first
//! time then reads it with the record instead of by one more request (a ranged GET inside its pack, 9-15 ms of
//! a 50 ms cold restore on a local SeaweedFS). It is used only when it hashes to `manifest` (manifests are
//! unkeyed); a record without it (older, or a larger manifest) is read as before. `packs` names the packs that
//! held the state's objects when it was committed (at most `MAX_PACKS_CARRIED`): a machine whose pack map lacks
//! them reads their indexes instead of listing every pack of the bucket (`BucketObjects::hint`); a hint is only
//! a hint (a prune may have moved the objects since, and then the listing finds them). `placed` says where in those packs (`pack` indexes `packs`) each of the
//! state's objects lay (at most `MAX_PLACES_CARRIED`): a machine restoring the name for the first time reads
//! those ranges straight away, without the packs' indexes, so a cold restore is the record and the ranges. A
//! pack is immutable (keyed by its hash), so a place is right until a prune deletes its pack; a wrong one
//! (a damaged record) reads bytes that fail their id's check and are read again the usual way. Older readers
//! ignore these fields.
//!
//! CONTRACT: a record changes only by a conditional write — create-if-absent for a new name, If-Match on the
//! ETag read for an update. Policy on a race (decided in docs/design.md "Remote store"): the later save wins,
//! and a manifest that the saver did not know it replaced (another machine committed it since this machine
//! last saw the name) is kept in `displaced` (newest first, at most `MAX_DISPLACED`), so gc keeps its objects
//! and `get` shows it: nothing is lost silently. A lost CAS re-reads and retries (bounded).

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::client::{Bucket, Meta};
use super::error::RemoteError;
use super::pack::Entry;
use crate::id::ObjectId;
use crate::index::{NameRecord, Retention};

pub const MAX_DISPLACED: usize = 8;
/// The largest manifest carried in its name's record (~8,000 tokens of state): every read of the name, a warm
/// restore's included, reads the record, so a larger one keeps its own request.
pub const INLINE_MANIFEST_MAX: usize = 64 << 10;
/// A record names at most this many packs (a state saved turn by turn spreads over one pack per save); more,
/// and it names none (a read that misses lists the packs, as before).
pub const MAX_PACKS_CARRIED: usize = 64;
/// A record places at most this many objects (~90 bytes of JSON each); more, and it places none.
pub const MAX_PLACES_CARRIED: usize = 1024;
const MAX_ATTEMPTS: usize = 16;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RemoteName {
    pub manifest: ObjectId,
    pub created: f64,
    #[serde(default)]
    pub displaced: Vec<ObjectId>,
    #[serde(default, skip_serializing_if = "Retention::is_default")]
    pub retention: Retention,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_json: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packs: Vec<ObjectId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placed: Vec<Place>,
}

/// Where one object lay: (index into the record's `packs`, object id, offset in the pack, length).
pub type Place = (u16, ObjectId, u64, u32);

impl RemoteName {
    /// The manifest carried in the record, if it is `manifest`'s (its bytes hash to the id).
    pub fn inline_manifest(&self) -> Option<&[u8]> {
        let json = self.manifest_json.as_deref()?.as_bytes();
        (ObjectId::of(json) == self.manifest).then_some(json)
    }

    /// The objects' places as (pack, entry); one naming no pack of the record is left out.
    pub fn places(&self) -> Vec<(ObjectId, Entry)> {
        let pack = |k: u16| self.packs.get(k as usize).copied();
        self.placed.iter().filter_map(|&(k, id, offset, len)| Some((pack(k)?, Entry { id, offset, len }))).collect()
    }
}

/// What a record carries of where a state's objects lie: the packs (at most `MAX_PACKS_CARRIED`, else none)
/// and the objects' places in them (at most `MAX_PLACES_CARRIED`, else none).
fn carried(places: &[(ObjectId, Entry)]) -> (Vec<ObjectId>, Vec<Place>) {
    let mut packs: Vec<ObjectId> = Vec::new();
    let mut placed = Vec::with_capacity(places.len());
    for (pack, e) in places {
        let k = match packs.iter().position(|p| p == pack) {
            Some(k) => k,
            None => {
                packs.push(*pack);
                packs.len() - 1
            }
        };
        placed.push((k as u16, e.id, e.offset, e.len));
    }
    if packs.len() > MAX_PACKS_CARRIED {
        return (Vec::new(), Vec::new());
    }
    if placed.len() > MAX_PLACES_CARRIED {
        placed.clear();
    }
    (packs, placed)
}

/// What a record carries of a manifest: its JSON when small enough and text (manifests are serde_json's).
fn inline(manifest_json: &[u8]) -> Option<String> {
    (manifest_json.len() <= INLINE_MANIFEST_MAX).then(|| std::str::from_utf8(manifest_json).ok().map(str::to_owned))?
}

/// A name's record as a store sees it: the index row, and the manifest's JSON when the record carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct RowRead {
    pub row: NameRecord,
    pub manifest_json: Option<Vec<u8>>,
    pub packs: Vec<ObjectId>,
    /// Where the state's objects lay: (pack, entry).
    pub places: Vec<(ObjectId, Entry)>,
}

fn seg(s: &str) -> String {
    format!("h{}", hex::encode(s.as_bytes()))
}

fn unseg(s: &str) -> Option<String> {
    String::from_utf8(hex::decode(s.strip_prefix('h')?).ok()?).ok()
}

pub fn name_key(namespace: &str, name: &str) -> String {
    format!("names/{}/{}", seg(namespace), seg(name))
}

/// A listed name: (namespace, name, etag of its record).
pub type Listed = (String, String, Option<String>);

/// Names in the bucket (of one namespace, or all), from one listing (no record reads).
pub fn list(bucket: &Bucket, namespace: Option<&str>) -> Result<Vec<Listed>, RemoteError> {
    let dir = match namespace {
        Some(ns) => format!("names/{}", seg(ns)),
        None => "names".to_string(),
    };
    let mut out = Vec::new();
    for Meta { rel, etag, .. } in bucket.list(&dir)? {
        let mut parts = rel.split('/').skip(1);
        if let (Some(ns), Some(name), None) = (parts.next(), parts.next(), parts.next()) {
            if let (Some(ns), Some(name)) = (unseg(ns), unseg(name)) {
                out.push((ns, name, etag));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn parse(bucket: &Bucket, key: &str, bytes: &[u8]) -> Result<RemoteName, RemoteError> {
    serde_json::from_slice(bytes)
        .map_err(|e| RemoteError::Invalid { url: bucket.url().into(), detail: format!("name record {key}: {e}") })
}

/// The record and its ETag, or None.
pub fn read(bucket: &Bucket, namespace: &str, name: &str) -> Result<Option<(RemoteName, String)>, RemoteError> {
    let key = name_key(namespace, name);
    match bucket.get(&key)? {
        None => Ok(None),
        Some((bytes, meta)) => Ok(Some((parse(bucket, &key, &bytes)?, meta.etag.unwrap_or_default()))),
    }
}

pub async fn read_async(bucket: &Bucket, namespace: &str, name: &str) -> Result<Option<(RemoteName, String)>, RemoteError> {
    let key = name_key(namespace, name);
    match bucket.get_async(&key).await? {
        None => Ok(None),
        Some((bytes, meta)) => Ok(Some((parse(bucket, &key, &bytes)?, meta.etag.unwrap_or_default()))),
    }
}

/// A store's view of a name: the bucket's record as an index row (keeping this machine's `last_used` when
/// the manifest is the one it knows), with the manifest it carries. Some(None): no such name. None: the bucket
/// is unreachable and `local` (what this machine knows) serves; a name it never saw is an error then, not
/// "not found".
pub fn row(
    bucket: &Bucket,
    namespace: &str,
    name: &str,
    local: Option<&NameRecord>,
) -> Result<Option<Option<RowRead>>, RemoteError> {
    match read(bucket, namespace, name) {
        Ok(None) => Ok(Some(None)),
        Ok(Some((rec, etag))) => {
            let last_used = local.filter(|l| l.manifest == rec.manifest).map_or(rec.created, |l| l.last_used);
            let manifest_json = rec.inline_manifest().map(<[u8]>::to_vec);
            let places = rec.places();
            let (manifest, created, displaced, retention) = (rec.manifest, rec.created, rec.displaced, rec.retention);
            let row = NameRecord { manifest, created, last_used, etag: Some(etag), displaced, retention };
            Ok(Some(Some(RowRead { row, manifest_json, packs: rec.packs, places })))
        }
        Err(e @ RemoteError::Unavailable { .. }) if local.is_none() => Err(e),
        Err(RemoteError::Unavailable { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Point (namespace, name) at `manifest` (whose JSON is `manifest_json`, and whose objects lie at `places`:
/// (pack, entry) of each packed one).
/// `known` is the manifest this machine last saw under the name (its index row), None if it knew none.
/// Returns the committed record and its ETag.
#[allow(clippy::too_many_arguments)]
pub fn commit(
    bucket: &Bucket,
    namespace: &str,
    name: &str,
    manifest: ObjectId,
    manifest_json: &[u8],
    places: &[(ObjectId, Entry)],
    created: f64,
    known: Option<ObjectId>,
) -> Result<(RemoteName, String), RemoteError> {
    let (packs, placed) = carried(places);
    let key = name_key(namespace, name);
    for _ in 0..MAX_ATTEMPTS {
        let current = read(bucket, namespace, name)?;
        let mut displaced = current.as_ref().map(|c| c.0.displaced.clone()).unwrap_or_default();
        if let Some((cur, _)) = &current {
            // Another machine's commit this one never saw: keep it reachable.
            if Some(cur.manifest) != known && cur.manifest != manifest && !displaced.contains(&cur.manifest) {
                displaced.insert(0, cur.manifest);
            }
        }
        displaced.retain(|m| *m != manifest);
        displaced.truncate(MAX_DISPLACED);
        let retention = current.as_ref().map(|c| c.0.retention).unwrap_or_default();
        let manifest_json = inline(manifest_json);
        let rec =
            RemoteName { manifest, created, displaced, retention, manifest_json, packs: packs.clone(), placed: placed.clone() };
        let body = Bytes::from(serde_json::to_vec(&rec).expect("name record serializes"));
        if let Some(etag) = bucket.put_if_match(&key, body, current.as_ref().map(|c| c.1.as_str()))? {
            return Ok((rec, etag));
        }
    }
    Err(RemoteError::Invalid {
        url: bucket.url().into(),
        detail: format!("name record {key} changed {MAX_ATTEMPTS} times while this save tried to commit; try again"),
    })
}

/// Set a name's retention (a conditional update of its record). False: no such name.
pub fn set_retention(bucket: &Bucket, namespace: &str, name: &str, retention: Retention) -> Result<bool, RemoteError> {
    let key = name_key(namespace, name);
    for _ in 0..MAX_ATTEMPTS {
        let Some((mut rec, etag)) = read(bucket, namespace, name)? else {
            return Ok(false);
        };
        rec.retention = retention;
        let body = Bytes::from(serde_json::to_vec(&rec).expect("name record serializes"));
        if bucket.put_if_match(&key, body, Some(etag.as_str()))?.is_some() {
            return Ok(true);
        }
    }
    Err(RemoteError::Invalid {
        url: bucket.url().into(),
        detail: format!("name record {key} changed {MAX_ATTEMPTS} times while setting its retention; try again"),
    })
}

/// Forget a name in the bucket. True if it existed.
pub fn remove(bucket: &Bucket, namespace: &str, name: &str) -> Result<bool, RemoteError> {
    let key = name_key(namespace, name);
    let existed = bucket.head(&key)?.is_some();
    bucket.delete(&key)?;
    Ok(existed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        for s in ["", "a", "user 42", "日本"] {
            assert_eq!(unseg(&seg(s)).as_deref(), Some(s));
        }
        assert_eq!(name_key("", "ab"), "names/h/h6162");
        assert!(unseg("x00").is_none() && unseg("h0").is_none());
    }

    #[test]
    fn a_record_carries_only_a_small_text_manifest_and_only_its_own() {
        let json = br#"{"version":1}"#;
        let mut rec = RemoteName {
            manifest: ObjectId::of(json),
            created: 1.0,
            displaced: vec![],
            retention: Retention::default(),
            manifest_json: inline(json),
            packs: vec![],
            placed: vec![],
        };
        assert_eq!(rec.inline_manifest(), Some(&json[..]));
        rec.manifest = ObjectId::of(b"another manifest");
        assert_eq!(rec.inline_manifest(), None);
        assert_eq!(inline(&vec![b' '; INLINE_MANIFEST_MAX]).map(|s| s.len()), Some(INLINE_MANIFEST_MAX));
        assert_eq!(inline(&vec![b' '; INLINE_MANIFEST_MAX + 1]), None);
        assert_eq!(inline(&[0xff, 0xfe]), None);
        // Older records, without the field, still parse; a record without it is written without it.
        let old = format!(r#"{{"manifest":"{}","created":1.0}}"#, rec.manifest.hex());
        let old: RemoteName = serde_json::from_str(&old).unwrap();
        assert_eq!(old.manifest_json, None);
        assert!(!String::from_utf8(serde_json::to_vec(&old).unwrap()).unwrap().contains("manifest_json"));
    }

    #[test]
    fn a_record_places_its_objects_within_the_caps_and_drops_places_it_cannot_resolve() {
        let (p, q) = (ObjectId::of(b"pack p"), ObjectId::of(b"pack q"));
        let entry = |k: u64| Entry { id: ObjectId::of(&k.to_le_bytes()), offset: k * 10, len: 10 };
        let places = vec![(p, entry(0)), (q, entry(1)), (p, entry(2))];
        let (packs, placed) = carried(&places);
        assert_eq!(packs, vec![p, q]);
        let mut rec = RemoteName {
            manifest: ObjectId::of(b"m"),
            created: 1.0,
            displaced: vec![],
            retention: Retention::default(),
            manifest_json: None,
            packs,
            placed,
        };
        assert_eq!(rec.places(), places);
        let json = serde_json::to_vec(&rec).unwrap();
        assert_eq!(serde_json::from_slice::<RemoteName>(&json).unwrap(), rec);
        rec.placed.push((7, ObjectId::of(b"x"), 0, 1)); // names no pack of the record
        assert_eq!(rec.places(), places);
        // Past the caps: too many objects keeps the packs only; too many packs keeps neither.
        let many: Vec<_> = (0..=MAX_PLACES_CARRIED as u64).map(|k| (p, entry(k))).collect();
        assert_eq!(carried(&many), (vec![p], vec![]));
        let spread: Vec<_> = (0..=MAX_PACKS_CARRIED as u64).map(|k| (ObjectId::of(&k.to_be_bytes()), entry(k))).collect();
        assert_eq!(carried(&spread), (vec![], vec![]));
    }
}
