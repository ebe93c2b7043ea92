//! The named states: get, tokens, list, remove, touch. Removing a name leaves its objects to gc.
//!
//! CONTRACT: `get` reads the name's record from the catalog (where names live: one read elsewhere, mirrored
//! into the index); `list` syncs first; `remove` forgets the name in the catalog, then its index row;
//! `last_used` (`touch`) is this machine's own (a catalog elsewhere keeps no per-read writes), and a name
//! this index does not know yet is synced first (saved on another machine since the last sync);
//! `set_retention` (ttl, pin) changes the record where names live, then the index row.

use serde::Serialize;

use super::{Store, Target};
use crate::error::{Error, Result};
use crate::index::{validate_name, HeedExt, NameRecord, Retention};
use crate::manifest::{now_f64, Fingerprint};

#[derive(Debug, Clone, Serialize)]
pub struct StateInfo {
    pub name: String,
    pub namespace: String,
    pub manifest_id: String,
    pub n_tokens: u64,
    pub file_bytes: u64,
    /// blake3 hex of the slot file a byte-exact materialize writes (compare with `hash_file`).
    pub file_hash: String,
    pub fingerprint: Fingerprint,
    pub layout: String,
    pub parent: Option<String>,
    pub created: f64,
    pub last_used: f64,
    /// Manifests a concurrent save on another machine committed and this name's save replaced (bucket
    /// stores; gc keeps them). Empty for a local store.
    pub displaced: Vec<String>,
    /// Seconds after its last use the name expires (None: kept until evicted for space).
    pub ttl_s: Option<f64>,
    /// Unix seconds when it expires (last_used + ttl_s; None: never).
    pub expires: Option<f64>,
    /// Never evicted, never expired.
    pub pinned: bool,
}

impl Store {
    fn info(&self, r: &heed::RoTxn, namespace: &str, name: &str, rec: NameRecord) -> Result<StateInfo> {
        let id = rec.manifest;
        let m = self.read_manifest(r, id)?;
        Ok(StateInfo {
            name: name.into(),
            namespace: namespace.into(),
            manifest_id: rec.manifest.hex(),
            n_tokens: m.n_tokens,
            file_bytes: m.file_bytes,
            file_hash: m.file_hash,
            fingerprint: m.fingerprint,
            layout: m.layout,
            parent: m.parent.map(|p| p.hex()),
            created: rec.created,
            last_used: rec.last_used,
            displaced: rec.displaced.iter().map(|d| d.hex()).collect(),
            ttl_s: rec.retention.ttl_s,
            expires: rec.retention.expires(rec.last_used),
            pinned: rec.retention.pinned,
        })
    }

    pub fn get(&self, name: &str, namespace: &str) -> Result<Option<StateInfo>> {
        validate_name(name, "name")?;
        validate_name(namespace, "namespace")?;
        let r = self.index.read_txn()?;
        match self.name_record(namespace, name)? {
            None => Ok(None),
            Some((rec, _)) => self.info(&r, namespace, name, rec).map(Some),
        }
    }

    /// Whether this machine's index names a state under `name`, asking nothing of where names live (a bucket
    /// store's index may be behind another machine's save or removal). For a caller that only needs a likely
    /// answer: a restore of the name confirms it against the record anyway (`materialize.rs`).
    pub fn held(&self, name: &str, namespace: &str) -> Result<bool> {
        validate_name(name, "name")?;
        validate_name(namespace, "namespace")?;
        Ok(self.index.name_row(namespace, name)?.is_some())
    }

    pub fn tokens(&self, name: &str, namespace: &str) -> Result<Vec<i32>> {
        let (_, m) = self.resolve(&Target::Name { namespace, name })?;
        Ok(m.tokens)
    }

    /// Every named state (of one namespace, or all), in (namespace, name) order.
    pub fn list(&self, namespace: Option<&str>) -> Result<Vec<StateInfo>> {
        if let Some(ns) = namespace {
            validate_name(ns, "namespace")?;
        }
        self.sync_quietly(namespace)?;
        let ix = &*self.index;
        let r = ix.read_txn()?;
        let rows = ix.names_in(&r, namespace)?;
        rows.into_iter().map(|(ns, name, rec)| self.info(&r, &ns, &name, rec)).collect()
    }

    /// Forget a name (its objects stay until gc). True if it existed.
    pub fn remove(&self, name: &str, namespace: &str) -> Result<bool> {
        validate_name(name, "name")?;
        validate_name(namespace, "namespace")?;
        let elsewhere = self.catalog.remove_name(namespace, name)?;
        let ix = &*self.index;
        let mut w = ix.write_txn()?;
        let existed = ix.names.delete(&mut w, &(namespace, name)).ix(ix)?;
        w.commit().ix(ix)?;
        Ok(existed || elsewhere)
    }

    /// Set a name's retention (ttl, pin). Raises NameNotFound.
    pub fn set_retention(&self, name: &str, namespace: &str, retention: Retention) -> Result<()> {
        validate_name(name, "name")?;
        validate_name(namespace, "namespace")?;
        if let Some(t) = retention.ttl_s {
            if !(t.is_finite() && t > 0.0) {
                return Err(Error::Invalid(format!("ttl must be a positive number of seconds, got {t}")));
            }
        }
        let _lock = self.catalog.lock_save()?; // not between an eviction's plan and its removals
        let not_found = || Error::NameNotFound { namespace: namespace.into(), name: name.into() };
        if self.catalog.location().is_some() {
            // Names live elsewhere: change the record there, then mirror it.
            if !self.catalog.set_retention(namespace, name, retention)? {
                return Err(not_found());
            }
            self.sync_quietly(Some(namespace))?;
            return Ok(());
        }
        let ix = &*self.index;
        let mut w = ix.write_txn()?;
        let mut rec = ix
            .names
            .get(&w, &(namespace, name))
            .ix(ix)?
            .ok_or_else(not_found)?;
        rec.retention = retention;
        ix.names.put(&mut w, &(namespace, name), &rec).ix(ix)?;
        w.commit().ix(ix)?;
        Ok(())
    }

    /// Set a name's last_used to now.
    pub fn touch(&self, name: &str, namespace: &str) -> Result<()> {
        validate_name(name, "name")?;
        validate_name(namespace, "namespace")?;
        let ix = &*self.index;
        let known = {
            let r = ix.read_txn()?;
            ix.names.get(&r, &(namespace, name)).ix(ix)?.is_some()
        };
        if !known {
            self.sync_quietly(Some(namespace))?; // saved on another machine since the last sync
        }
        let mut w = ix.write_txn()?;
        let mut rec = ix
            .names
            .get(&w, &(namespace, name))
            .ix(ix)?
            .ok_or_else(|| Error::NameNotFound { namespace: namespace.into(), name: name.into() })?;
        rec.last_used = now_f64();
        ix.names.put(&mut w, &(namespace, name), &rec).ix(ix)?;
        w.commit().ix(ix)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;


    use crate::error::{Error, ErrorKind};
    use crate::testutil::{fp, open, put_synthetic, synthetic, TempDir};
    #[test]
    fn ingest_dedups_and_names_work() {
        let d = TempDir::new("store");
        let s = open(&d, 16);
        let f = fp(&[("model", "m1")]);
        let parent: Vec<i32> = (0..100).collect();
        let a = put_synthetic(&s, "article", "", &parent, &f);
        assert_eq!(a.blocks, 7);
        assert_eq!(a.reused_bytes, 0);
        assert_eq!(a.new_objects, 7 + 2);
        let mut child = parent.clone();
        child.extend(1000..1040);
        let (dd, len, h) = synthetic(&child, 16);
        let c = s.ingest_decomposed("q1", "", len, h, dd, &f, Some("article"), false, Instant::now()).unwrap();
        assert_eq!(c.parent_manifest.as_deref(), Some(a.manifest_id.as_str()));
        // blocks 0..6 (96 tokens) are shared; block 6 differs (96..112 now has child tokens)
        assert_eq!(c.new_objects, 3 + 2, "{c:?}"); // blocks 6,7,8 (of 9) + skeleton + manifest
        assert!(c.reused_bytes > 0);

        let info = s.get("q1", "").unwrap().unwrap();
        assert_eq!(info.n_tokens, 140);
        assert_eq!(c.layout, info.layout); // the report says what `get` would, with no second read
        assert_eq!(info.parent.as_deref(), Some(a.manifest_id.as_str()));
        assert_eq!(s.tokens("q1", "").unwrap(), child);
        assert!(s.get("nope", "").unwrap().is_none());
        assert!(matches!(s.tokens("nope", ""), Err(Error::NameNotFound { .. })));
        assert!(matches!(s.get("a/b", ""), Err(e) if e.kind() == ErrorKind::InvalidName));

        put_synthetic(&s, "other", "tenant", &parent, &fp(&[("model", "m2")]));
        assert_eq!(s.list(None).unwrap().len(), 3);
        assert_eq!(s.list(Some("")).unwrap().len(), 2);
        assert_eq!(s.list(Some("tenant")).unwrap()[0].name, "other");

        let before = s.get("article", "").unwrap().unwrap().last_used;
        std::thread::sleep(std::time::Duration::from_millis(5));
        s.touch("article", "").unwrap();
        assert!(s.get("article", "").unwrap().unwrap().last_used > before);
        assert!(matches!(s.touch("nope", ""), Err(Error::NameNotFound { .. })));

        let st = s.stats().unwrap();
        assert_eq!(st.names, 3);
        assert_eq!(st.manifests, 3);
        // The child dedups against its article; "tenant"'s copy of the article shares nothing (its own scope).
        assert!(s.namespace_stats("").unwrap().dedup_ratio > 1.0, "{st:?}");
        assert_eq!(st.block_size, 16);

        assert!(s.remove("q1", "").unwrap());
        assert!(!s.remove("q1", "").unwrap());
        assert!(s.get("q1", "").unwrap().is_none());
    }
}
