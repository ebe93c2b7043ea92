//! Verify: re-hash every object file; report corrupt ones, objects live states need but lack, and the names
//! they hit.
//!
//! CONTRACT: read-only apart from quarantine (a corrupt object found is moved aside, like any read does).
//! Each object is re-hashed in the scope of the manifests that reference it (`crate::scope`; manifests are
//! unkeyed); one no manifest the index knows references must match some known scope (unkeyed, or a namespace
//! of a name or manifest here), else it is counted in `unscoped` and left in place: it may be a save in a
//! namespace not committed yet, or garbage for gc, and its content cannot be checked without its scope.
//! Names are synced first. A layered backend (`Backend::layers`: a cache in front of where objects live) is
//! checked in its primary copy, its cache, or both (`Where`); objects a cache lacks are not missing. A
//! single copy takes `Where::Both` only.

use std::collections::{HashMap, HashSet};

use rayon::prelude::*;
use serde::Serialize;

use super::{NameRef, Store};
use crate::error::{Error, Result};
use crate::id::ObjectId;
use crate::index::HeedExt;
use crate::manifest::Manifest;
use crate::objects::{Checked, ObjectError, ObjectStore};
use crate::scope::Scope;

/// An object read by verify that is not corrupt: checked, or of no known scope.
enum Fine {
    Ok,
    Unscoped,
}

/// Which copies `verify` checks (a local store has one: `Both`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Where {
    Bucket,
    Cache,
    Both,
}

impl std::str::FromStr for Where {
    type Err = Error;
    fn from_str(s: &str) -> Result<Where> {
        match s {
            "bucket" => Ok(Where::Bucket),
            "cache" => Ok(Where::Cache),
            "both" => Ok(Where::Both),
            _ => Err(Error::Invalid(format!("where={s:?}: expected 'bucket', 'cache' or 'both'"))),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub objects_checked: usize,
    /// Objects no known manifest references whose bytes match their id in no known scope (left for gc).
    pub unscoped: usize,
    pub corrupt: Vec<String>,
    pub missing: Vec<String>,
    pub names_affected: Vec<NameRef>,
}

impl Store {
    /// Re-hash every object file; report corrupt ones, objects live states need but lack, and the names hit.
    /// `progress(done, total)` is called from this thread after each batch; an error from it aborts.
    pub fn verify(&self, progress: &mut dyn FnMut(usize, usize) -> Result<()>) -> Result<VerifyReport> {
        self.verify_where(Where::Both, progress)
    }

    /// `verify` of the bucket's copies, the cache's, or both (bucket stores; a local store takes `Both` only).
    pub fn verify_where(&self, place: Where, progress: &mut dyn FnMut(usize, usize) -> Result<()>) -> Result<VerifyReport> {
        let Some(layers) = self.objects.backend().layers() else {
            if place != Where::Both {
                return Err(Error::Invalid("a local store has no bucket or cache to choose: verify checks its objects".into()));
            }
            self.catalog.sync(None)?;
            return self.verify_objects(&self.objects, true, progress);
        };
        self.catalog.sync(None)?;
        let (cache, primary) = (ObjectStore::new(layers.cache), ObjectStore::new(layers.primary));
        match place {
            Where::Cache => self.verify_objects(&cache, false, progress),
            Where::Bucket => self.verify_objects(&primary, true, progress),
            Where::Both => {
                let c = self.verify_objects(&cache, false, progress)?;
                let mut b = self.verify_objects(&primary, true, progress)?;
                b.objects_checked += c.objects_checked;
                b.unscoped += c.unscoped;
                for id in c.corrupt {
                    if !b.corrupt.contains(&id) {
                        b.corrupt.push(id);
                    }
                }
                for n in c.names_affected {
                    if !b.names_affected.contains(&n) {
                        b.names_affected.push(n);
                    }
                }
                b.corrupt.sort();
                b.names_affected.sort();
                Ok(b)
            }
        }
    }

    /// Verify the objects of one backend; `check_missing`: report objects live states need but it lacks.
    fn verify_objects(
        &self,
        objects: &ObjectStore,
        check_missing: bool,
        progress: &mut dyn FnMut(usize, usize) -> Result<()>,
    ) -> Result<VerifyReport> {
        let all = objects.backend().list()?;
        let total = all.len();
        let (scope_of, known) = {
            let r = self.index.read_txn()?;
            self.object_scopes(&r)?
        };
        let mut unscoped = 0usize;
        let mut corrupt: Vec<ObjectId> = Vec::new();
        let mut present: HashSet<ObjectId> = HashSet::with_capacity(total);
        let mut done = 0;
        progress(0, total)?;
        for chunk in all.chunks(64) {
            let read = |id: &ObjectId| match scope_of.get(id) {
                Some(scope) => objects.get(id, scope).map(|_| Fine::Ok),
                None => objects.probe(id, &known).map(|c| match c {
                    Checked::Matched(_) => Fine::Ok,
                    Checked::InNoScope => Fine::Unscoped,
                }),
            };
            let bad: Vec<Option<Result<ObjectId, ()>>> = chunk
                .par_iter()
                .map(|id| match read(id) {
                    Ok(Fine::Ok) => Ok(None),
                    Ok(Fine::Unscoped) => Ok(Some(Err(()))),
                    Err(ObjectError::Corrupt { .. }) => Ok(Some(Ok(*id))),
                    Err(ObjectError::Missing { .. }) => Ok(None), // deleted meanwhile (gc)
                    Err(e) => Err(e),
                })
                .collect::<std::result::Result<_, ObjectError>>()?;
            for b in bad.into_iter().flatten() {
                match b {
                    Ok(id) => corrupt.push(id),
                    Err(()) => unscoped += 1,
                }
            }
            present.extend(chunk.iter().copied());
            done += chunk.len();
            progress(done, total)?;
        }
        let r = self.index.read_txn()?;
        let (names, manifests, bad) = self.live_set(&r)?;
        drop(r);
        let mut corrupt_set: HashSet<ObjectId> = corrupt.iter().copied().collect();
        let mut missing: HashSet<ObjectId> = HashSet::new();
        for id in bad {
            if present.contains(&id) {
                corrupt_set.insert(id);
            } else if check_missing {
                missing.insert(id);
            }
        }
        let mut hit: HashSet<ObjectId> = HashSet::new(); // manifests affected
        for (mid, refs) in &manifests {
            let mut affected = false;
            for id in refs.iter().chain(std::iter::once(mid)) {
                if corrupt_set.contains(id) {
                    affected = true;
                } else if check_missing && !present.contains(id) && !objects.exists(id)? {
                    missing.insert(*id);
                    affected = true;
                }
            }
            if affected {
                hit.insert(*mid);
            }
        }
        let mut names_affected: Vec<NameRef> =
            names.into_iter().filter(|(_, mid)| hit.contains(mid)).map(|(n, _)| n).collect();
        names_affected.sort();
        let mut corrupt: Vec<String> = corrupt_set.iter().map(ObjectId::hex).collect();
        corrupt.sort();
        let mut missing: Vec<String> = missing.iter().map(ObjectId::hex).collect();
        missing.sort();
        Ok(VerifyReport { objects_checked: total, unscoped, corrupt, missing, names_affected })
    }

    /// The scope each object is addressed in, from every manifest the index holds and every live name's
    /// (manifests themselves unkeyed), and every scope known here (unkeyed, each namespace of a name).
    fn object_scopes(&self, r: &heed::RoTxn) -> Result<(HashMap<ObjectId, Scope>, Vec<Scope>)> {
        let ix = &*self.index;
        let mut scope_of: HashMap<ObjectId, Scope> = HashMap::new();
        let mut known: HashSet<Scope> = HashSet::from([Scope::Unkeyed]);
        fn add(mid: ObjectId, m: &Manifest, scope_of: &mut HashMap<ObjectId, Scope>, known: &mut HashSet<Scope>) {
            let scope = m.object_scope();
            for id in m.referenced() {
                scope_of.insert(id, scope.clone());
            }
            scope_of.insert(mid, Scope::Unkeyed);
            known.insert(scope);
        }
        for kv in ix.manifests.iter(r).ix(ix)? {
            let (mid, json) = kv.ix(ix)?;
            if let Ok(m) = Manifest::from_json(mid, json) {
                add(mid, &m, &mut scope_of, &mut known);
            }
        }
        // Live manifests the index lacks (read from their objects; unreadable ones are live_set's to report).
        for (namespace, _, rec) in ix.names_in(r, None)? {
            for mid in std::iter::once(rec.manifest).chain(rec.displaced) {
                if !scope_of.contains_key(&mid) {
                    if let Ok(m) = self.read_manifest(r, mid) {
                        add(mid, &m, &mut scope_of, &mut known);
                    }
                }
            }
            known.insert(Scope::of_namespace(&namespace));
        }
        Ok((scope_of, known.into_iter().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::manifest::Fingerprint;
    use crate::store::Target;
    use crate::testutil::{open, put_synthetic, TempDir};
    #[test]
    fn verify_reports_corrupt_and_missing() {
        let d = TempDir::new("verify");
        let s = open(&d, 16);
        let f = Fingerprint::new();
        let r = put_synthetic(&s, "a", "", &(0..40).collect::<Vec<_>>(), &f);
        put_synthetic(&s, "b", "ns", &(100..140).collect::<Vec<_>>(), &f);
        let mut calls = 0;
        let ok = s.verify(&mut |_, _| { calls += 1; Ok(()) }).unwrap();
        assert!(ok.corrupt.is_empty() && ok.missing.is_empty() && ok.names_affected.is_empty());
        assert_eq!(ok.objects_checked, 2 * (3 + 2));
        assert!(calls >= 2);

        let r_txn = s.index.read_txn().unwrap();
        let m = s.read_manifest(&r_txn, r.manifest_id.parse::<ObjectId>().unwrap()).unwrap();
        drop(r_txn);
        let local = crate::objects::LocalDir::new(d.0.join("objects")).unwrap();
        let b0 = m.blocks[0];
        let b1 = m.blocks[1];
        std::fs::write(local.path_of(&b0), b"garbage").unwrap();
        std::fs::remove_file(local.path_of(&b1)).unwrap();
        let rep = s.verify(&mut |_, _| Ok(())).unwrap();
        assert_eq!(rep.corrupt, vec![b0.hex()]);
        assert_eq!(rep.missing, vec![b1.hex()]);
        assert_eq!(rep.names_affected, vec![NameRef { namespace: "".into(), name: "a".into() }]);
        let e = s.load(&Target::Name { namespace: "", name: "a" }, None).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        assert!(e.to_string().contains("run `kvstore verify`"), "{e}");
    }
}
