//! The manifest record (one saved state), fingerprint canonicalization and checks, the empty-layout rule.
//!
//! CONTRACT (docs/design.md "Manifest JSON", "Fingerprint"): a manifest's id is the blake3 of its JSON
//! (`to_json`, which `from_json` reads back, refusing another version; unkeyed: the JSON names its `scope`,
//! the key its skeleton and blocks are addressed under, `crate::scope`); `fingerprint_id` hashes the
//! canonical JSON of the caller's fingerprint without `n_ctx_slot` and `n_layer`; `model_shape` reads what it
//! says of the model's sections (`format::Shape` checks a file against it); `check_expect` passes only if every key on
//! both sides is equal (`layout` against the manifest's own; `n_ctx_slot` must hold the state's tokens);
//! `layout_is_empty` is the one empty-slot rule. The prefix-key chain is `prefix_keys.rs`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::id::{hex, ObjectId};
use crate::scope::Scope;

pub const MANIFEST_VERSION: u32 = 1;
/// Fingerprint key compared as "server context >= state tokens", and left out of `fingerprint_id`.
pub const N_CTX_SLOT: &str = "n_ctx_slot";
/// Pseudo-key of `expect` compared against the manifest's layout (derived from the file).
pub const LAYOUT: &str = "layout";
/// The model's layer count (`<arch>.block_count`), for the completeness check at ingest (`format::Shape`);
/// left out of `fingerprint_id` (the model key already names the model, and ids stay those of older stores).
pub const N_LAYER: &str = "n_layer";
/// The model's sliding window, also read by the hooks' prefix cuts.
pub const N_SWA: &str = "n_swa";
/// The LoRA adapters the server applied (kvstore/fingerprint.py `lora_fingerprint`), present only when some do:
/// compared even when one side lacks it, since a state computed with adapters is no state of the bare model.
pub const LORA: &str = "lora";
/// How `check_expect` shows the absence of `LORA` on one side.
const NO_LORA: &str = "none";

pub type Fingerprint = BTreeMap<String, String>;

/// Layout entry of a KV section with no cells (format/layout.rs).
const EMPTY_SECTION: &str = "kv[-]";

/// Whether a layout is that of an empty slot: it carries no layers, so it matches any server and tells
/// nothing about one (never compare it, never learn it).
pub fn layout_is_empty(layout: &str) -> bool {
    layout.contains(EMPTY_SECTION)
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("state '{state}' was saved with {key}={stored}, this server has {key}={server}; restore it into a matching server, or evaluate the prompt again")]
    FingerprintMismatch { state: String, key: String, stored: String, server: String },
    #[error("state '{state}' holds {n_tokens} tokens but this server's slot context is n_ctx_slot={server}; raise the context (-c / --parallel) or evaluate the prompt again")]
    ContextTooSmall { state: String, n_tokens: u64, server: String },
    #[error("the slot file for '{state}' has layout {file}, but the states stored under the same fingerprint in this namespace have {stored}: it was cut short, or saved by another model or cache configuration; give that model's fingerprint (--fingerprint model=...), or --force to store it anyway")]
    LayoutDiffers { state: String, stored: String, file: String },
    #[error("manifest {id}: {detail}; run `kvstore verify`")]
    Invalid { id: ObjectId, detail: String },
}

/// One saved state (docs/design.md "Manifest JSON"). Field order is the JSON order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub version: u32,
    /// The caller's fingerprint as given (including `n_ctx_slot` if present).
    pub fingerprint: Fingerprint,
    /// Hex blake3 of the canonical fingerprint without `n_ctx_slot`.
    pub fingerprint_id: String,
    pub layout: String,
    pub n_tokens: u64,
    pub tokens: Vec<i32>,
    pub file_bytes: u64,
    /// Hex blake3 of the original slot file.
    pub file_hash: String,
    /// Skeleton object id (hex in JSON).
    pub skeleton: ObjectId,
    /// Block object ids (hex in JSON), in the order the skeleton references them (repeats allowed).
    pub blocks: Vec<ObjectId>,
    pub block_size: u32,
    /// Parent manifest id (hex in JSON).
    pub parent: Option<ObjectId>,
    /// Unix seconds.
    pub created: u64,
    /// `n_stream` of the saved file (addition to design.md: decides whether a re-emit is byte-exact).
    #[serde(default)]
    pub n_stream: u32,
    /// The namespace whose key addresses the skeleton and blocks (`crate::scope`); absent: unkeyed (the
    /// default namespace, and every manifest written before scopes). Omitted from the JSON when absent, so an
    /// unkeyed manifest's bytes (and id) are those it always had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Hex xxh3-128 of the original slot file: the check of a restore from this machine's own files
    /// (`store/file_check.rs`). Absent in manifests written before it (their restores check `file_hash`);
    /// readers that predate it ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_xxh3: Option<String>,
}

impl Manifest {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("manifest serializes")
    }
    pub fn from_json(id: ObjectId, bytes: &[u8]) -> Result<Self, ManifestError> {
        let m: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| ManifestError::Invalid { id, detail: format!("not a manifest: {e}") })?;
        if m.version != MANIFEST_VERSION {
            return Err(ManifestError::Invalid { id, detail: format!("manifest version {} is not supported", m.version) });
        }
        Ok(m)
    }
    /// The scope its skeleton and blocks are addressed in.
    pub fn object_scope(&self) -> Scope {
        Scope::recorded(self.scope.as_deref())
    }
    /// Skeleton and distinct blocks: every object this manifest needs besides itself.
    pub fn referenced(&self) -> Vec<ObjectId> {
        let mut v = self.blocks.clone();
        v.push(self.skeleton);
        v.sort_unstable();
        v.dedup();
        v
    }
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub fn now_f64() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Canonical JSON of a fingerprint: sorted keys, no whitespace, serde_json escaping.
pub fn canonical_json(fp: &Fingerprint) -> String {
    serde_json::to_string(fp).expect("string map serializes")
}

/// blake3 of the canonical JSON of the fingerprint without `n_ctx_slot` and `n_layer`.
pub fn fingerprint_id(fp: &Fingerprint) -> [u8; 32] {
    let mut f = fp.clone();
    f.remove(N_CTX_SLOT);
    f.remove(N_LAYER);
    *blake3::hash(canonical_json(&f).as_bytes()).as_bytes()
}

/// What a fingerprint says about the model's sections: `n_layer` and `n_swa` as the hooks read them from the
/// GGUF (`kvstore/fingerprint.py`); `n_swa` is written only when non-zero, so with `n_layer` known (the GGUF was
/// read) its absence means no window. Unparsable values count as unknown.
pub fn model_shape(fp: &Fingerprint) -> crate::format::ModelShape {
    let num = |k: &str| fp.get(k).and_then(|v| v.trim().parse::<u32>().ok());
    let n_layer = num(N_LAYER);
    let n_swa = num(N_SWA).or(n_layer.map(|_| 0));
    crate::format::ModelShape { n_layer, n_swa }
}

pub fn fingerprint_id_hex(fp: &Fingerprint) -> String {
    hex(&fingerprint_id(fp))
}

/// Check that a state (`m`, shown as `state`) can be restored into a server described by `expect`.
/// Every key present on both sides must be equal (`layout` is compared with the manifest's layout), except
/// `n_ctx_slot`, which must be >= the state's token count; `lora` must be equal, or absent, on both sides.
pub fn check_expect(state: &str, m: &Manifest, expect: &Fingerprint) -> Result<(), ManifestError> {
    let mismatch = |key: &str, stored: &str, server: &str| ManifestError::FingerprintMismatch {
        state: state.into(),
        key: key.into(),
        stored: stored.into(),
        server: server.into(),
    };
    let stored_lora = m.fingerprint.get(LORA).map_or(NO_LORA, String::as_str);
    let server_lora = expect.get(LORA).map_or(NO_LORA, String::as_str);
    if stored_lora != server_lora {
        return Err(mismatch(LORA, stored_lora, server_lora));
    }
    for (key, server) in expect {
        if key == N_CTX_SLOT {
            let ok = server.trim().parse::<u64>().map(|n| n >= m.n_tokens).unwrap_or(false);
            if !ok {
                return Err(ManifestError::ContextTooSmall {
                    state: state.into(),
                    n_tokens: m.n_tokens,
                    server: server.clone(),
                });
            }
            continue;
        }
        let stored = if key == LAYOUT && !m.fingerprint.contains_key(LAYOUT) {
            Some(&m.layout)
        } else {
            m.fingerprint.get(key)
        };
        if let Some(stored) = stored {
            if stored != server {
                return Err(mismatch(key, stored, server));
            }
        }
    }
    Ok(())
}

/// A manifest of made-up ids, for tests of what reads one.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    pub fn manifest(n_tokens: u64, f: Fingerprint) -> Manifest {
        Manifest {
            version: 1,
            fingerprint_id: fingerprint_id_hex(&f),
            fingerprint: f,
            layout: "kv[1:f16/64,f16/64;vt0;rot0,0]".into(),
            n_tokens,
            tokens: (0..n_tokens as i32).collect(),
            file_bytes: 10,
            file_hash: "00".repeat(32),
            skeleton: ObjectId([0x11; 32]),
            blocks: vec![ObjectId([0x22; 32])],
            block_size: 64,
            parent: None,
            created: 1,
            n_stream: 1,
            scope: None,
            file_xxh3: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::manifest;
    use super::*;
    use crate::testutil::fp;

    #[test]
    fn fingerprint_id_ignores_n_ctx_slot_and_order() {
        let a = fp(&[("model", "abc"), ("flash_attn", "on"), ("n_ctx_slot", "4096")]);
        let b = fp(&[("flash_attn", "on"), ("model", "abc")]);
        assert_eq!(fingerprint_id(&a), fingerprint_id(&b));
        assert_ne!(fingerprint_id(&b), fingerprint_id(&fp(&[("flash_attn", "off"), ("model", "abc")])));
        assert_eq!(canonical_json(&b), r#"{"flash_attn":"on","model":"abc"}"#);
        // Pinned: changing the canonical form breaks every stored prefix key.
        assert_eq!(fingerprint_id_hex(&Fingerprint::new()), hex(blake3::hash(b"{}").as_bytes()));
    }

    #[test]
    fn empty_layouts() {
        assert!(layout_is_empty("kv[-]") && layout_is_empty("kv[-]+kv[-]"));
        assert!(!layout_is_empty("kv[1:f16/64,f16/64;vt0;rot0,0]"));
    }

    #[test]
    fn expect_checks() {
        let m = manifest(100, fp(&[("model", "abc"), ("flash_attn", "on"), ("n_ctx_slot", "4096")]));
        check_expect("x", &m, &fp(&[("model", "abc"), ("flash_attn", "on"), ("n_ctx_slot", "100")])).unwrap();
        check_expect("x", &m, &fp(&[("other", "1")])).unwrap();
        let e = check_expect("x", &m, &fp(&[("flash_attn", "off")])).unwrap_err().to_string();
        assert!(e.starts_with("state 'x' was saved with flash_attn=on, this server has flash_attn=off"), "{e}");
        let e = check_expect("x", &m, &fp(&[("n_ctx_slot", "99")])).unwrap_err().to_string();
        assert!(e.contains("100 tokens") && e.contains("n_ctx_slot=99"), "{e}");
        assert!(check_expect("x", &m, &fp(&[("n_ctx_slot", "lots")])).is_err());
        let e = check_expect("x", &m, &fp(&[("layout", "other")])).unwrap_err().to_string();
        assert!(e.contains("layout=kv[1:"), "{e}");
        check_expect("x", &m, &fp(&[("layout", &m.layout.clone())])).unwrap();
    }

    #[test]
    fn lora_must_match_when_either_side_has_it() {
        let bare = manifest(10, fp(&[("model", "abc")]));
        let adapted = manifest(10, fp(&[("model", "abc"), ("lora", "sha256:1")]));
        check_expect("x", &bare, &fp(&[("model", "abc")])).unwrap();
        check_expect("x", &adapted, &fp(&[("model", "abc"), ("lora", "sha256:1")])).unwrap();
        let e = check_expect("x", &adapted, &fp(&[("model", "abc")])).unwrap_err().to_string();
        assert!(e.contains("lora=sha256:1") && e.contains("lora=none"), "{e}");
        let e = check_expect("x", &bare, &fp(&[("model", "abc"), ("lora", "sha256:1")])).unwrap_err().to_string();
        assert!(e.contains("lora=none") && e.contains("lora=sha256:1"), "{e}");
        assert!(check_expect("x", &adapted, &fp(&[("model", "abc"), ("lora", "sha256:2")])).is_err());
    }

    #[test]
    fn manifest_ids_are_hex_in_json_and_checked() {
        let m = manifest(3, fp(&[]));
        let s = String::from_utf8(m.to_json()).unwrap();
        assert!(s.contains(&format!(r#""skeleton":"{}","blocks":["{}"]"#, "11".repeat(32), "22".repeat(32))), "{s}");
        let bad = s.replace(&"22".repeat(32), "zz");
        let e = Manifest::from_json(ObjectId::of(b"x"), bad.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("not a manifest") && e.contains("not an object id"), "{e}");
    }

    #[test]
    fn manifest_json_round_trip() {
        let m = manifest(3, fp(&[("a", "b")]));
        let j = m.to_json();
        let s = String::from_utf8(j.clone()).unwrap();
        assert!(s.starts_with(r#"{"version":1,"fingerprint":{"a":"b"},"fingerprint_id":""#), "{s}");
        assert_eq!(Manifest::from_json(ObjectId::of(&j), &j).unwrap(), m);
        // An unkeyed manifest has no scope field (its JSON is what it was before scopes); a keyed one names it.
        assert!(!s.contains("scope"), "{s}");
        let keyed = Manifest { scope: Some("a".into()), ..m.clone() };
        let kj = keyed.to_json();
        assert!(String::from_utf8(kj.clone()).unwrap().ends_with(r#","n_stream":1,"scope":"a"}"#));
        assert_eq!(Manifest::from_json(ObjectId::of(&kj), &kj).unwrap().object_scope(), Scope::of_namespace("a"));
        assert_eq!(m.object_scope(), Scope::Unkeyed);
    }
}
