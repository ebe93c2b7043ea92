//! Lookup: the live state with the longest common token prefix (at least one block) with a query; or, `whole`,
//! the longest live state that the query extends all of (a state with a recurrent section serves a prompt only
//! so: llama-server cannot roll back into it).
//!
//! CONTRACT: only states of the same namespace and fingerprint id match (the prefix-key chain includes both);
//! the deepest prefix key with a live manifest gives the candidates; the longest common prefix, then the
//! newest, wins. `whole` walks the chain from its deepest key up until a level holds a state the query extends,
//! reading each manifest once and at most `WHOLE_READS` of them (a bound on the request path: the shallow keys
//! of a namespace whose states share a long prefix hold all of them). Names removed since are skipped. Where
//! names live elsewhere the catalog says when to sync the namespace first (`Freshness`: at most once per its
//! interval) and a miss syncs once more, so a state saved on another machine is found.

use std::collections::{HashMap, HashSet};

use heed::RoTxn;
use serde::Serialize;

use super::Store;
use crate::catalog::Freshness;
use crate::error::{Error, Result};
use crate::id::ObjectId;
use crate::index::validate_name;
use crate::manifest::{fingerprint_id, Fingerprint};
use crate::prefix_keys::{common_prefix, prefix_chain};

/// Manifests a `whole` lookup reads at most.
const WHOLE_READS: usize = 256;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LookupHit {
    pub manifest_id: String,
    pub name: String,
    pub n_tokens: u64,
    pub n_common: u64,
}

impl Store {
    /// Names of one namespace by manifest id (most recently used name per manifest).
    pub(super) fn live_names(&self, r: &RoTxn<'_>, namespace: &str) -> Result<HashMap<ObjectId, (String, f64)>> {
        let mut out: HashMap<ObjectId, (String, f64)> = HashMap::new();
        for (_, name, rec) in self.index.names_in(r, Some(namespace))? {
            let e = out.entry(rec.manifest).or_insert_with(|| (name.clone(), f64::MIN));
            if rec.last_used > e.1 {
                *e = (name, rec.last_used);
            }
        }
        Ok(out)
    }

    /// The live state with the longest common token prefix (at least one block) with `tokens`.
    pub fn lookup(&self, tokens: &[i32], namespace: &str, fingerprint: &Fingerprint) -> Result<Option<LookupHit>> {
        self.lookup_as(tokens, namespace, fingerprint, false)
    }

    /// The longest live state (at least one block) that `tokens` extends all of: `n_common == n_tokens`.
    pub fn lookup_whole(&self, tokens: &[i32], namespace: &str, fingerprint: &Fingerprint) -> Result<Option<LookupHit>> {
        self.lookup_as(tokens, namespace, fingerprint, true)
    }

    fn lookup_as(&self, tokens: &[i32], namespace: &str, fingerprint: &Fingerprint, whole: bool) -> Result<Option<LookupHit>> {
        validate_name(namespace, "namespace")?;
        match self.catalog.freshness(namespace) {
            Freshness::Authoritative => self.lookup_local(tokens, namespace, fingerprint, whole),
            Freshness::Due => {
                self.sync_quietly(Some(namespace))?;
                self.lookup_local(tokens, namespace, fingerprint, whole)
            }
            Freshness::Recent => match self.lookup_local(tokens, namespace, fingerprint, whole)? {
                Some(hit) => Ok(Some(hit)),
                None => {
                    self.sync_quietly(Some(namespace))?;
                    self.lookup_local(tokens, namespace, fingerprint, whole)
                }
            },
        }
    }

    /// `lookup` (or `lookup_whole`) over the index as it is.
    fn lookup_local(&self, tokens: &[i32], namespace: &str, fingerprint: &Fingerprint, whole: bool) -> Result<Option<LookupHit>> {
        let chain = prefix_chain(namespace, &fingerprint_id(fingerprint), tokens, self.block_size);
        if chain.is_empty() {
            return Ok(None);
        }
        let ix = &*self.index;
        let r = ix.read_txn()?;
        let live = self.live_names(&r, namespace)?;
        if live.is_empty() {
            return Ok(None);
        }
        let mut seen: HashSet<ObjectId> = HashSet::new();
        let mut best: Option<(u64, u64, ObjectId, u64)> = None; // (lcp, created, id, n_tokens)
        for h in chain.iter().rev() {
            for id in ix.manifests_at_prefix(&r, h)? {
                if !live.contains_key(&id) || whole && seen.len() >= WHOLE_READS || !seen.insert(id) {
                    continue;
                }
                let m = match self.read_manifest(&r, id) {
                    Ok(m) => m,
                    Err(Error::ManifestNotFound { .. }) => continue,
                    Err(e) => return Err(e),
                };
                let lcp = common_prefix(tokens, &m.tokens) as u64;
                if whole && lcp < m.n_tokens {
                    continue;
                }
                let key = (lcp, m.created, id, m.n_tokens);
                if best.as_ref().is_none_or(|b| (key.0, key.1) > (b.0, b.1)) {
                    best = Some(key);
                }
            }
            // The deepest level with a candidate holds the longest one: a state the query extends past this
            // level's block would be recorded one level deeper as well.
            if best.is_some() || !whole && !seen.is_empty() || whole && seen.len() >= WHOLE_READS {
                break;
            }
        }
        Ok(best.map(|(lcp, _, id, n_tokens)| LookupHit {
            manifest_id: id.hex(),
            name: live[&id].0.clone(),
            n_tokens,
            n_common: lcp,
        }))
    }
}

#[cfg(test)]
mod tests {
    use crate::testutil::{fp, open, put_synthetic, TempDir};
    #[test]
    fn lookup_finds_longest_live_prefix() {
        let d = TempDir::new("lookup");
        let s = open(&d, 16);
        let f = fp(&[("model", "m1"), ("n_ctx_slot", "4096")]);
        let base: Vec<i32> = (0..64).collect();
        let mut long = base.clone();
        long.extend(500..540);
        put_synthetic(&s, "short", "", &base, &f);
        let lr = put_synthetic(&s, "long", "", &long, &f);

        // n_ctx_slot does not take part in the fingerprint id.
        let q_f = fp(&[("model", "m1")]);
        let mut q = long[..90].to_vec();
        q.extend([7, 7, 7]);
        let hit = s.lookup(&q, "", &q_f).unwrap().unwrap();
        assert_eq!(hit.name, "long");
        assert_eq!(hit.manifest_id, lr.manifest_id);
        assert_eq!(hit.n_common, 90);
        assert_eq!(hit.n_tokens, 104);

        // Another fingerprint or namespace: miss. Shorter than a block: miss.
        assert!(s.lookup(&q, "", &fp(&[("model", "m2")])).unwrap().is_none());
        assert!(s.lookup(&q, "tenant", &q_f).unwrap().is_none());
        assert!(s.lookup(&q[..10], "", &q_f).unwrap().is_none());

        // Query diverging inside block 4: deepest hit is block 4 for both; LCP decides, "long" wins at 70.
        let mut q2 = base.clone();
        q2.extend(500..506);
        q2.extend([9; 20]);
        let hit = s.lookup(&q2, "", &q_f).unwrap().unwrap();
        assert_eq!((hit.name.as_str(), hit.n_common), ("long", 70));

        // Removed names are skipped: falls back to the shorter live state.
        s.remove("long", "").unwrap();
        let hit = s.lookup(&q, "", &q_f).unwrap().unwrap();
        assert_eq!((hit.name.as_str(), hit.n_common), ("short", 64));
        s.remove("short", "").unwrap();
        assert!(s.lookup(&q, "", &q_f).unwrap().is_none());
    }

    #[test]
    fn lookup_whole_finds_the_longest_state_the_query_extends() {
        let d = TempDir::new("lookup-whole");
        let s = open(&d, 16);
        let f = fp(&[("model", "m1")]);
        // An article (40 tokens), a state forked from it deeper (article + question 0 + answer), and a short
        // state the query extends, one level up.
        let article: Vec<i32> = (0..40).collect();
        let mut q0 = article.clone();
        q0.extend(100..130);
        let short: Vec<i32> = (0..20).collect();
        put_synthetic(&s, "short", "", &short, &f);
        put_synthetic(&s, "q0", "", &q0, &f);
        let mut q1 = article.clone();
        q1.extend(100..103); // shares 3 tokens of question 0's, then leaves it
        q1.extend(200..220);
        // The longest common prefix is question 0's state, which q1 leaves; the whole one is the short state.
        assert_eq!(s.lookup(&q1, "", &f).unwrap().unwrap().name, "q0");
        let hit = s.lookup_whole(&q1, "", &f).unwrap().unwrap();
        assert_eq!((hit.name.as_str(), hit.n_common, hit.n_tokens), ("short", 20, 20));
        // A state at the fork (the article) is found though it ends inside a level that q0 passes.
        let ar = put_synthetic(&s, "article", "", &article, &f);
        let hit = s.lookup_whole(&q1, "", &f).unwrap().unwrap();
        assert_eq!((hit.manifest_id.as_str(), hit.n_common, hit.n_tokens), (ar.manifest_id.as_str(), 40, 40));
        // A query the deeper state is a whole prefix of finds it; a query shorter than a state never does.
        let mut q0_more = q0.clone();
        q0_more.extend([5, 6]);
        assert_eq!(s.lookup_whole(&q0_more, "", &f).unwrap().unwrap().name, "q0");
        assert_eq!(s.lookup_whole(&q0[..50], "", &f).unwrap().unwrap().name, "article");
        assert!(s.lookup_whole(&short[..17], "", &f).unwrap().is_none());
        assert!(s.lookup_whole(&q1, "tenant", &f).unwrap().is_none());
    }
}
