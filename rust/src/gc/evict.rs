//! Eviction: keep the store within a size, planned then executed like gc (restic's prune).
//!
//! CONTRACT (docs/design.md "Bounded store"): `plan_eviction` changes nothing: it counts, per object, the kept
//! names that reference it (manifest, skeleton, blocks; displaced manifests too) and its stored bytes (the
//! backend's own listing: a bucket's, not only this machine's saves), and picks victims in three passes:
//! 1. **ttl**: every unpinned, unprotected name whose `last_used + ttl_s` has passed, store full or not;
//! 2. **quota**: a namespace over its quota loses its own names until it is at `low_water` × its quota;
//! 3. **cap**: while the live bytes pass `low_water` × the cap, the namespace furthest over its share (its
//!    quota, else the cap split evenly between the namespaces that hold names) loses one name.
//!
//! Within a namespace the victim is the least recently used name that *owns* at least a quarter of its bytes
//! (no other kept name references them); when every name left shares most of its bytes, the one owning the
//! largest part of them goes first, so children go before the parent they share (which frees little while
//! they are kept). Pinned names and `protect`ed ones
//! (being restored or saved) are never victims. Each pick updates the counts, so a parent's bytes become its
//! own once its children are gone. `evict` takes the catalog's gc lock (no save between its plan and its
//! sweep), syncs, plans, forgets each victim where names live and in the index, then sweeps (gc's sweep,
//! no grace: the lock excludes saves) within the cap: a bucket copies a pack's survivors out only below it, and
//! while the dead objects it left pass the cap, up to two more rounds evict as if the cap were smaller by them.
//! A kill at any point leaves kept names whole (objects go only after the names are forgotten, and only those
//! no kept name marks); a re-run finishes. `owned_bytes` reports each
//! kept name's owned bytes as the plan counts them (`kvstore ls`).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Serialize;

use super::{execute, plan};
use crate::catalog::GcLock;
use crate::error::{Error, Result};
use crate::id::ObjectId;
use crate::index::HeedExt;
use crate::manifest::now_f64;
use crate::store::Store;

/// What an eviction keeps the store within.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    /// Stored bytes allowed (None: no cap; ttl and quotas still apply).
    pub max_bytes: Option<u64>,
    /// Stored bytes the store may hold while the sweep runs (a bucket's copies out of the packs it rewrites):
    /// the cap itself where `max_bytes` leaves room for saves to come, which wait for the sweep. None:
    /// `max_bytes`.
    pub ceiling: Option<u64>,
    /// Evict down to this fraction of a cap or quota once it is passed (hysteresis), in (0, 1].
    pub low_water: f64,
    /// Bytes allowed per namespace.
    pub quotas: HashMap<String, u64>,
    /// (namespace, name) pairs never to evict now (being restored or saved).
    pub protect: HashSet<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reason {
    Ttl,
    Quota,
    Cap,
}

#[derive(Debug, Clone, Serialize)]
pub struct Victim {
    pub namespace: String,
    pub name: String,
    pub reason: Reason,
    /// Stored bytes its removal frees, counted when it was picked (after the victims before it).
    pub frees_bytes: u64,
    pub last_used: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct NamespaceUse {
    pub namespace: String,
    pub names: usize,
    /// Stored bytes of the objects its names reference, before the plan and once its victims are gone.
    pub bytes: u64,
    pub after_bytes: u64,
    pub quota: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct EvictPlan {
    /// Stored bytes of every object (live and garbage), before.
    pub used_bytes: u64,
    /// Of which referenced by no name (the sweep frees them whatever the plan).
    pub garbage_bytes: u64,
    /// Stored bytes of the live objects once the victims are gone.
    pub after_bytes: u64,
    pub max_bytes: Option<u64>,
    /// The live bytes the cap pass evicts down to (low_water × cap).
    pub target_bytes: Option<u64>,
    /// Stored bytes the pinned names reference.
    pub pinned_bytes: u64,
    pub victims: Vec<Victim>,
    /// True if the cap or a quota could not be met (everything left is pinned or protected).
    pub unmet: bool,
    pub namespaces: Vec<NamespaceUse>,
}

#[derive(Debug, Clone, Serialize)]
pub struct EvictReport {
    pub plan: EvictPlan,
    /// Names forgotten (all the plan's victims unless one was saved or removed meanwhile).
    pub evicted: usize,
    /// What the sweep deleted (victims' objects and older garbage).
    pub freed_bytes: u64,
    pub dead_objects: usize,
    /// Dead bytes a bucket left in its packs for now (`GcReport::kept_packed_bytes`): still stored.
    pub kept_packed_bytes: u64,
    pub dry_run: bool,
}

/// One kept name in the counting.
struct Held {
    ns: usize,
    name: String,
    last_used: f64,
    pinned: bool,
    expired: bool,
    protected: bool,
    objects: Vec<usize>,
    total: u64,
    /// Stored bytes of its objects no other kept name references.
    owned: u64,
    gone: bool,
}

struct Counts {
    namespaces: Vec<String>,
    held: Vec<Held>,
    size: Vec<u64>,
    /// Per object: the kept names that reference it.
    holders: Vec<Vec<usize>>,
    refs: Vec<u32>,
    /// Per (namespace, object): kept names of that namespace referencing it.
    ns_refs: HashMap<(usize, usize), u32>,
    ns_bytes: Vec<u64>,
    live: u64,
}

impl Counts {
    fn remove(&mut self, v: usize) -> u64 {
        let h = &mut self.held[v];
        h.gone = true;
        let (ns, objects) = (h.ns, std::mem::take(&mut h.objects));
        let mut freed = 0;
        for &o in &objects {
            self.refs[o] -= 1;
            let nr = self.ns_refs.get_mut(&(ns, o)).expect("counted");
            *nr -= 1;
            if *nr == 0 {
                self.ns_bytes[ns] -= self.size[o];
            }
            match self.refs[o] {
                0 => {
                    freed += self.size[o];
                    self.live -= self.size[o];
                }
                1 => {
                    // Its last holder now owns it.
                    if let Some(&k) = self.holders[o].iter().find(|&&k| !self.held[k].gone) {
                        self.held[k].owned += self.size[o];
                    }
                }
                _ => {}
            }
        }
        self.held[v].objects = objects;
        freed
    }

    fn evictable(&self, k: usize) -> bool {
        let h = &self.held[k];
        !h.gone && !h.pinned && !h.protected
    }

    /// The victim in namespace `ns`: the least recently used owner of a quarter of its bytes; else (every name
    /// left shares most of its bytes) the one that owns the largest part of its bytes, the least recently used
    /// of equals: children go before the parent they share.
    fn pick(&self, ns: usize) -> Option<usize> {
        let candidates = || (0..self.held.len()).filter(move |&k| self.held[k].ns == ns && self.evictable(k));
        let lru = |a: &usize, b: &usize| self.held[*a].last_used.total_cmp(&self.held[*b].last_used);
        let owner = candidates().filter(|&k| self.held[k].owned * 4 >= self.held[k].total).min_by(lru);
        owner.or_else(|| {
            let part = |k: usize| self.held[k].owned as f64 / self.held[k].total.max(1) as f64;
            candidates().min_by(|a, b| part(*b).total_cmp(&part(*a)).then_with(|| lru(a, b)))
        })
    }
}

impl Counts {
    /// What the kept names hold: every object sized by the backend's own listing (also returned: its sum, the
    /// store's stored bytes), each kept name's objects (manifest, skeleton, blocks; displaced manifests too).
    fn of(store: &Store, protect: &HashSet<(String, String)>, now: f64) -> Result<(Counts, u64)> {
        let mut sizes: HashMap<ObjectId, u64> = HashMap::new();
        for (id, _, len) in store.objects().backend().list_stamped()? {
            sizes.insert(id, len);
        }
        let used: u64 = sizes.values().sum();
        let ix = store.index();
        let r = ix.read_txn()?;
        let (_, manifests, _unreadable) = store.live_set(&r)?;
        let mut obj_index: HashMap<ObjectId, usize> = HashMap::new();
        let mut c = Counts {
            namespaces: Vec::new(),
            held: Vec::new(),
            size: Vec::new(),
            holders: Vec::new(),
            refs: Vec::new(),
            ns_refs: HashMap::new(),
            ns_bytes: Vec::new(),
            live: 0,
        };
        let mut ns_index: HashMap<String, usize> = HashMap::new();
        for (namespace, name, rec) in ix.names_in(&r, None)? {
            let ns = *ns_index.entry(namespace.clone()).or_insert_with(|| {
                c.namespaces.push(namespace.clone());
                c.ns_bytes.push(0);
                c.namespaces.len() - 1
            });
            let mut ids: Vec<ObjectId> = Vec::new();
            for m in std::iter::once(&rec.manifest).chain(&rec.displaced) {
                ids.push(*m);
                ids.extend(manifests.get(m).into_iter().flatten().copied());
            }
            ids.sort_unstable();
            ids.dedup();
            let k = c.held.len();
            let mut objects = Vec::with_capacity(ids.len());
            let mut total = 0;
            for id in ids {
                let o = *obj_index.entry(id).or_insert_with(|| {
                    c.size.push(sizes.get(&id).copied().unwrap_or(0));
                    c.holders.push(Vec::new());
                    c.refs.push(0);
                    c.size.len() - 1
                });
                c.holders[o].push(k);
                c.refs[o] += 1;
                if c.refs[o] == 1 {
                    c.live += c.size[o];
                }
                let nr = c.ns_refs.entry((ns, o)).or_insert(0);
                *nr += 1;
                if *nr == 1 {
                    c.ns_bytes[ns] += c.size[o];
                }
                total += c.size[o];
                objects.push(o);
            }
            let ret = rec.retention;
            let protected = protect.contains(&(namespace, name.clone()));
            c.held.push(Held {
                ns,
                name,
                last_used: rec.last_used,
                pinned: ret.pinned,
                expired: ret.expires(rec.last_used).is_some_and(|t| t <= now),
                protected,
                objects,
                total,
                owned: 0,
                gone: false,
            });
        }
        for k in 0..c.held.len() {
            c.held[k].owned = c.held[k].objects.iter().filter(|&&o| c.refs[o] == 1).map(|&o| c.size[o]).sum();
        }
        Ok((c, used))
    }

    /// Stored bytes of the distinct objects the pinned names reference, with name `also` counted as pinned.
    fn pinned_bytes(&self, also: Option<usize>) -> u64 {
        let mut seen = HashSet::new();
        (0..self.held.len())
            .filter(|&k| self.held[k].pinned || Some(k) == also)
            .flat_map(|k| self.held[k].objects.iter())
            .filter(|o| seen.insert(**o))
            .map(|&o| self.size[o])
            .sum()
    }
}

/// Count what the kept names hold and plan the victims. Changes nothing.
pub fn plan_eviction(store: &Store, limits: &Limits) -> Result<EvictPlan> {
    let low = limits.low_water;
    if !(low > 0.0 && low <= 1.0) {
        return Err(Error::Invalid(format!("low water must be in (0, 1], got {low}")));
    }
    let (mut c, used) = Counts::of(store, &limits.protect, now_f64())?;
    let live_before = c.live;
    let pinned_bytes = c.pinned_bytes(None);
    let mut namespaces: Vec<NamespaceUse> = (0..c.namespaces.len())
        .map(|ns| NamespaceUse {
            namespace: c.namespaces[ns].clone(),
            names: c.held.iter().filter(|h| h.ns == ns).count(),
            bytes: c.ns_bytes[ns],
            after_bytes: 0,
            quota: limits.quotas.get(&c.namespaces[ns]).copied(),
        })
        .collect();

    let mut victims = Vec::new();
    let mut take = |c: &mut Counts, k: usize, reason: Reason| {
        let last_used = c.held[k].last_used;
        let frees = c.remove(k);
        victims.push(Victim {
            namespace: c.namespaces[c.held[k].ns].clone(),
            name: c.held[k].name.clone(),
            reason,
            frees_bytes: frees,
            last_used,
        });
    };
    // 1. Expired names.
    for k in 0..c.held.len() {
        if c.held[k].expired && c.evictable(k) {
            take(&mut c, k, Reason::Ttl);
        }
    }
    // 2. Quotas: each namespace pays for itself.
    let mut unmet = false;
    for ns in 0..c.namespaces.len() {
        let Some(&quota) = limits.quotas.get(&c.namespaces[ns]) else { continue };
        if c.ns_bytes[ns] <= quota {
            continue;
        }
        let goal = (quota as f64 * low) as u64;
        while c.ns_bytes[ns] > goal {
            match c.pick(ns) {
                Some(k) => take(&mut c, k, Reason::Quota),
                None => {
                    unmet |= c.ns_bytes[ns] > quota;
                    break;
                }
            }
        }
    }
    // 3. The cap: the namespace furthest over its share loses a name, until the live bytes are at the target.
    let target = limits.max_bytes.map(|m| (m as f64 * low) as u64);
    if let (Some(max), Some(goal)) = (limits.max_bytes, target) {
        if c.live > max {
            while c.live > goal {
                let holding: Vec<usize> =
                    (0..c.namespaces.len()).filter(|&ns| c.held.iter().any(|h| h.ns == ns && !h.gone)).collect();
                let even = max / holding.len().max(1) as u64;
                let share = |ns: usize| limits.quotas.get(&c.namespaces[ns]).copied().unwrap_or(even).min(max);
                let mut order: Vec<usize> = holding.clone();
                order.sort_by_key(|&ns| std::cmp::Reverse(c.ns_bytes[ns] as i128 - share(ns) as i128));
                match order.iter().find_map(|&ns| c.pick(ns)) {
                    Some(k) => take(&mut c, k, Reason::Cap),
                    None => {
                        unmet |= c.live > max;
                        break;
                    }
                }
            }
        }
    }
    for (ns, u) in namespaces.iter_mut().enumerate() {
        u.after_bytes = c.ns_bytes[ns];
    }
    Ok(EvictPlan {
        used_bytes: used,
        garbage_bytes: used.saturating_sub(live_before),
        after_bytes: c.live,
        max_bytes: limits.max_bytes,
        target_bytes: target,
        pinned_bytes,
        victims,
        unmet,
        namespaces,
    })
}

/// Plan and (unless `dry_run`) execute under the gc lock: forget the victims, then sweep.
pub fn evict(store: &Store, limits: &Limits, dry_run: bool) -> Result<EvictReport> {
    let catalog = store.catalog();
    if dry_run {
        catalog.sync(None)?;
        let plan = plan_eviction(store, limits)?;
        let (evicted, freed_bytes, dead_objects, kept_packed_bytes) = (0, 0, 0, 0);
        return Ok(EvictReport { plan, evicted, freed_bytes, dead_objects, kept_packed_bytes, dry_run: true });
    }
    let lock = catalog.lock_gc()?;
    catalog.sync(None)?;
    let mut report = evict_round(store, limits, &lock)?;
    // A bucket copies a pack's live objects out before it deletes the pack, and does so only within the cap; what
    // it could not move stays stored. While that passes the cap, evict more as if the cap were smaller by it:
    // the new victims' packs go whole, which makes room to move the rest.
    for _ in 0..2 {
        let Some(max) = limits.max_bytes else { break };
        let kept = report.kept_packed_bytes;
        if kept == 0 || report.plan.after_bytes + kept <= max {
            break;
        }
        let smaller = Limits {
            max_bytes: Some(max.saturating_sub(kept).max(1)),
            ceiling: limits.ceiling.or(limits.max_bytes),
            ..limits.clone()
        };
        let more = evict_round(store, &smaller, &lock)?;
        report.plan.victims.extend(more.plan.victims);
        report.plan.after_bytes = more.plan.after_bytes;
        report.plan.unmet = more.plan.unmet;
        report.plan.namespaces = more.plan.namespaces;
        report.evicted += more.evicted;
        report.freed_bytes += more.freed_bytes;
        report.dead_objects += more.dead_objects;
        report.kept_packed_bytes = more.kept_packed_bytes;
    }
    Ok(report)
}

/// One plan and its execution under `lock`: forget the victims, then sweep within the cap.
fn evict_round(store: &Store, limits: &Limits, lock: &GcLock) -> Result<EvictReport> {
    let catalog = store.catalog();
    let plan = plan_eviction(store, limits)?;
    let ix = store.index();
    let mut evicted = 0;
    for v in &plan.victims {
        catalog.remove_name(&v.namespace, &v.name)?;
        let mut w = ix.write_txn()?;
        evicted += ix.names.delete(&mut w, &(v.namespace.as_str(), v.name.as_str())).ix(ix)? as usize;
        w.commit().ix(ix)?;
    }
    let gc_plan = plan::plan_at(store, Duration::ZERO, lock.now)?;
    let swept = execute::sweep(store, gc_plan, lock, false, limits.ceiling.or(limits.max_bytes))?;
    Ok(EvictReport {
        plan,
        evicted,
        freed_bytes: swept.freed_bytes,
        dead_objects: swept.dead_objects,
        kept_packed_bytes: swept.kept_packed_bytes,
        dry_run: false,
    })
}

/// What each kept name alone holds: the stored bytes of its objects no other kept name references (what evicting
/// it now would free), counted as the cap counts them: (namespace, name, bytes), in (namespace, name) order.
pub fn owned_bytes(store: &Store) -> Result<Vec<(String, String, u64)>> {
    store.catalog().sync(None)?;
    let (c, _) = Counts::of(store, &HashSet::new(), now_f64())?;
    Ok(c.held.iter().map(|h| (c.namespaces[h.ns].clone(), h.name.clone(), h.owned)).collect())
}

/// Refuse a pin that would put the pinned names' bytes over `max_bytes`, counted as the cap counts them.
pub fn check_pin(store: &Store, namespace: &str, name: &str, max_bytes: u64) -> Result<()> {
    let (c, _) = Counts::of(store, &HashSet::new(), now_f64())?;
    let k = (0..c.held.len())
        .find(|&k| c.namespaces[c.held[k].ns] == namespace && c.held[k].name == name)
        .ok_or_else(|| Error::NameNotFound { namespace: namespace.into(), name: name.into() })?;
    let bytes = c.pinned_bytes(Some(k));
    if bytes > max_bytes {
        return Err(Error::PinOverCap { name: name.into(), pinned_bytes: bytes, max_bytes });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::Retention;
    use crate::store::Target;
    use crate::format::{Block, Decomposed};
    use crate::manifest::Fingerprint;
    use crate::store::IngestReport;
    use crate::testutil::{fp, open, TempDir};

    /// A state whose blocks, like real KV rows, are incompressible and outweigh its skeleton: block k is a
    /// function of tokens [kB, (k+1)B) (children share their parent's blocks below the fork).
    fn put_synthetic(s: &Store, name: &str, ns: &str, tokens: &[i32], f: &Fingerprint) -> IngestReport {
        let b = s.block_size() as usize;
        let blocks: Vec<Block> = tokens
            .chunks(b)
            .map(|c| {
                let mut h = blake3::Hasher::new();
                c.iter().for_each(|t| {
                    h.update(&t.to_le_bytes());
                });
                let mut bytes = vec![0u8; 256 * c.len()];
                h.finalize_xof().fill(&mut bytes);
                Block { bytes, elem_size: 2 }
            })
            .collect();
        let skeleton: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        let len = (skeleton.len() + blocks.iter().map(|b| b.bytes.len()).sum::<usize>()) as u64;
        let d = Decomposed { skeleton, blocks, tokens: tokens.to_vec(), layout: "kv[test]".into(), n_stream: 1, n_checkpoints: 0,
                         shape: crate::format::Shape { kv_layers: vec![Some(1)], recurrent: false } };
        let h = crate::store::FileSums::of(name.as_bytes()); // distinct per name; these states are never restored
        s.ingest_decomposed(name, ns, len, h, d, f, None, false, std::time::Instant::now()).unwrap()
    }

    /// Tokens of a state no other shares a block with (block bytes depend on `t & 0xff`).
    fn own(i: i32, n: i32) -> Vec<i32> {
        (0..n).map(|k| (i * 7 + k * 3) % 251 + i * 100_000).collect()
    }

    fn names(s: &Store) -> Vec<String> {
        s.list(None).unwrap().into_iter().map(|i| i.name).collect()
    }

    fn limits(max: u64) -> Limits {
        Limits { max_bytes: Some(max), low_water: 0.9, ..Default::default() }
    }

    #[test]
    fn the_cap_evicts_least_recently_used_owners_first_and_keeps_the_rest_whole() {
        let d = TempDir::new("evict-cap");
        let s = open(&d, 16);
        let f = fp(&[("model", "m")]);
        for i in 0..10 {
            put_synthetic(&s, &format!("n{i}"), "", &own(i, 64), &f);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        s.touch("n0", "").unwrap(); // n0 is now the most recent
        let used = s.stats().unwrap().stored_bytes;
        let cap = used / 2;
        let dry = evict(&s, &limits(cap), true).unwrap();
        assert!(dry.dry_run && dry.evicted == 0);
        assert_eq!(names(&s).len(), 10, "a dry run changes nothing");
        let planned: Vec<String> = dry.plan.victims.iter().map(|v| v.name.clone()).collect();
        assert_eq!(planned[0], "n1", "{planned:?}");
        assert!(!planned.contains(&"n0".to_string()), "{planned:?}");
        assert!(dry.plan.after_bytes <= (cap as f64 * 0.9) as u64, "{:?}", dry.plan);
        assert!(dry.plan.victims.iter().all(|v| v.reason == Reason::Cap && v.frees_bytes > 0));

        let r = evict(&s, &limits(cap), false).unwrap();
        assert_eq!(r.evicted, planned.len());
        let st = s.stats().unwrap();
        assert!(st.stored_bytes <= (cap as f64 * 0.9) as u64, "{} > {cap}", st.stored_bytes);
        assert_eq!(st.stored_bytes, r.plan.after_bytes);
        for n in names(&s) {
            s.load(&Target::Name { namespace: "", name: &n }, None).unwrap();
        }
        assert!(names(&s).contains(&"n0".to_string()));
        let v = s.verify(&mut |_, _| Ok(())).unwrap();
        assert!(v.corrupt.is_empty() && v.missing.is_empty(), "{v:?}");
        // Within the cap: nothing more goes.
        assert!(evict(&s, &limits(cap), false).unwrap().plan.victims.is_empty());
    }

    #[test]
    fn a_parent_under_kept_children_is_not_the_first_to_go() {
        let d = TempDir::new("evict-parent");
        let s = open(&d, 16);
        let f = fp(&[("model", "m")]);
        let article = own(1, 160);
        put_synthetic(&s, "article", "", &article, &f); // the oldest
        for q in 0..3 {
            let mut t = article.clone();
            t.extend(own(50 + q, 16));
            put_synthetic(&s, &format!("q{q}"), "", &t, &f);
        }
        put_synthetic(&s, "other", "", &own(9, 64), &f);
        let used = s.stats().unwrap().stored_bytes;
        let p = plan_eviction(&s, &limits(used * 3 / 4)).unwrap();
        assert!(!p.victims.is_empty());
        assert_ne!(p.victims[0].name, "article", "{:?}", p.victims);
        // Once every child is gone the article owns its blocks and goes like any other name.
        let p = plan_eviction(&s, &limits(1)).unwrap();
        assert_eq!(p.victims.len(), 5);
        assert_eq!(p.after_bytes, 0);
        let article_pos = p.victims.iter().position(|v| v.name == "article").unwrap();
        assert_eq!(article_pos, 4, "{:?}", p.victims);
        assert!(p.victims[article_pos].frees_bytes > p.victims[0].frees_bytes);
    }

    #[test]
    fn pinned_and_protected_names_stay_and_an_unmeetable_cap_says_so() {
        let d = TempDir::new("evict-pin");
        let s = open(&d, 16);
        let f = fp(&[]);
        for i in 0..4 {
            put_synthetic(&s, &format!("n{i}"), "", &own(i, 64), &f);
        }
        s.set_retention("n0", "", Retention { ttl_s: None, pinned: true }).unwrap();
        let mut l = limits(1);
        l.protect.insert(("".into(), "n1".into()));
        let r = evict(&s, &l, false).unwrap();
        assert!(r.plan.unmet);
        assert_eq!(names(&s), ["n0", "n1"]);
        assert!(r.plan.pinned_bytes > 0);
        let info = s.get("n0", "").unwrap().unwrap();
        assert!(info.pinned && info.expires.is_none());
        // A pin that would pass the cap is refused and changes nothing.
        let e = check_pin(&s, "", "n1", r.plan.pinned_bytes).unwrap_err();
        assert!(e.to_string().contains("over the store's cap"), "{e}");
        assert_eq!(e.kind(), crate::error::ErrorKind::StoreFull);
        assert!(!s.get("n1", "").unwrap().unwrap().pinned);
        check_pin(&s, "", "n1", r.plan.used_bytes).unwrap();
    }

    #[test]
    fn expired_names_go_with_no_cap_and_a_new_save_keeps_the_ttl() {
        let d = TempDir::new("evict-ttl");
        let s = open(&d, 16);
        let f = fp(&[]);
        put_synthetic(&s, "short", "", &own(1, 32), &f);
        put_synthetic(&s, "long", "", &own(2, 32), &f);
        s.set_retention("short", "", Retention { ttl_s: Some(0.05), pinned: false }).unwrap();
        s.set_retention("long", "", Retention { ttl_s: Some(3600.0), pinned: false }).unwrap();
        let again = put_synthetic(&s, "short", "", &own(3, 32), &f); // a new state of the name
        assert_eq!(again.ttl_s, Some(0.05));
        let info = s.get("short", "").unwrap().unwrap();
        assert!((info.expires.unwrap() - info.last_used - 0.05).abs() < 1e-6);
        std::thread::sleep(std::time::Duration::from_millis(80));
        let l = Limits { low_water: 0.9, ..Default::default() };
        let r = evict(&s, &l, false).unwrap();
        assert_eq!(r.plan.victims.iter().map(|v| (v.name.as_str(), v.reason)).collect::<Vec<_>>(), [("short", Reason::Ttl)]);
        assert_eq!(names(&s), ["long"]);
        assert!(r.freed_bytes > 0);
        let e = s.set_retention("long", "", Retention { ttl_s: Some(-1.0), pinned: false }).unwrap_err();
        assert!(e.to_string().contains("positive"), "{e}");
        assert!(matches!(s.set_retention("gone", "", Retention::default()), Err(Error::NameNotFound { .. })));
    }

    #[test]
    fn a_tenant_pays_for_its_own_quota_and_cannot_make_another_tenant_lose_names() {
        let d = TempDir::new("evict-tenants");
        let s = open(&d, 16);
        let f = fp(&[]);
        for i in 0..3 {
            put_synthetic(&s, &format!("a{i}"), "a", &own(i, 64), &f);
        }
        let a_bytes = s.stats().unwrap().stored_bytes;
        // b fills the store with three times a's bytes, all more recent than a's names.
        for i in 0..9 {
            put_synthetic(&s, &format!("b{i}"), "b", &own(10 + i, 64), &f);
        }
        let used = s.stats().unwrap().stored_bytes;
        // The cap: a is under its even share, b is far over it: only b's names go.
        let r = plan_eviction(&s, &limits(used * 2 / 3)).unwrap();
        assert!(!r.victims.is_empty());
        assert!(r.victims.iter().all(|v| v.namespace == "b"), "{:?}", r.victims);
        // A quota: b over its own quota loses its own names, a is untouched.
        let mut l = Limits { low_water: 0.9, ..Default::default() };
        l.quotas.insert("b".into(), a_bytes);
        let r = evict(&s, &l, false).unwrap();
        assert!(r.plan.victims.iter().all(|v| v.namespace == "b" && v.reason == Reason::Quota));
        assert_eq!(s.list(Some("a")).unwrap().len(), 3);
        let b = r.plan.namespaces.iter().find(|n| n.namespace == "b").unwrap();
        assert!(b.after_bytes <= (a_bytes as f64 * 0.9) as u64, "{b:?}");
        assert!(evict(&s, &Limits { low_water: 1.5, ..Default::default() }, true).is_err());
    }
}
