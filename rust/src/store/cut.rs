//! Prefix states from the store: the first P tokens of a stored state, as a slot file that llama-server
//! resumes at exactly P (format/cut.rs), for any P.
//!
//! CONTRACT: `materialize_prefix(target, n_tokens, out_path, expect, opts)` loads the state (checking `expect`
//! like `materialize`), and emits its prefix. The SWA window rows before P come from the state itself (body or
//! checkpoints) or, when those lack some, from other live states of the same namespace and fingerprint that
//! share the state's first token blocks (prefix keys) and whose non-SWA rows at those positions have the same
//! content address (format checks byte equality). `n_swa` is the manifest fingerprint's `n_swa` (0 when absent).
//! Returns `PrefixReport::Written` (file at `out_path`, temp + rename) or `PrefixReport::Unavailable` with the
//! window positions no stored row covers, or the reason no prefix can be cut (a recurrent or hybrid state: its
//! layout has a `rec[` section; an SWA state without `n_swa`); nothing is written then.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::format::{self, Prefix, PrefixSpec, StateRef};
use crate::id::ObjectId;
use crate::manifest::{fingerprint_id, Fingerprint};
use crate::objects::atomic::{atomic_write, FILE_TEMP};
use crate::prefix_keys::prefix_chain;

use super::{Loaded, Store, Target};

/// At most this many other states are read to find missing window rows.
pub const MAX_LENDERS: usize = 8;

#[derive(Debug, Clone, Copy, Default)]
pub struct PrefixOptions {
    /// Emit for a server with this many slots (streams); None keeps the saved layout.
    pub n_stream: Option<u32>,
    /// The server's SWA cache size in cells per slot, to keep a fresh evaluation's cell layout (0 = off).
    pub fill_masked: u32,
}

#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum PrefixReport {
    Written {
        manifest_id: String,
        n_tokens: u32,
        file_bytes: u64,
        window: (i32, i32),
        /// (manifest id, checkpoint index or None for the body, first position, end) of the window rows.
        origins: Vec<(String, Option<usize>, i32, i32)>,
        objects_read: usize,
        elapsed_s: f64,
    },
    Unavailable {
        manifest_id: String,
        n_tokens: u32,
        /// Window positions no stored row covers ([start, end) ranges); empty when `reason` says why instead.
        missing: Vec<(i32, i32)>,
        reason: String,
    },
}

fn blocks_of(l: &Loaded) -> Result<Vec<&[u8]>> {
    l.manifest
        .blocks
        .iter()
        .map(|id| l.blocks.get(id).map(|b| &**b).ok_or_else(|| Error::Invalid(format!("block {} not loaded", id.hex()))))
        .collect()
}

impl Store {
    /// Live manifests other than `base` that share the first `depth` token blocks of `tokens`, newest first.
    fn lenders(&self, namespace: &str, fp_id: &[u8; 32], tokens: &[i32], depth: usize, base: ObjectId) -> Result<Vec<ObjectId>> {
        let chain = prefix_chain(namespace, fp_id, tokens, self.block_size());
        let Some(h) = chain.get(depth.max(1).min(chain.len()).saturating_sub(1)) else { return Ok(Vec::new()) };
        let ix = &*self.index;
        let r = ix.read_txn()?;
        let live = self.live_names(&r, namespace)?;
        let mut found: Vec<(u64, ObjectId)> = Vec::new();
        for id in ix.manifests_at_prefix(&r, h)? {
            if id != base && live.contains_key(&id) {
                if let Ok(m) = self.read_manifest(&r, id) {
                    found.push((m.created, id));
                }
            }
        }
        found.sort_by(|a, b| b.cmp(a));
        Ok(found.into_iter().take(MAX_LENDERS).map(|(_, id)| id).collect())
    }

    pub fn materialize_prefix(
        &self,
        target: &Target,
        namespace: &str,
        n_tokens: u32,
        out_path: &Path,
        expect: Option<&Fingerprint>,
        opts: PrefixOptions,
    ) -> Result<PrefixReport> {
        let t0 = Instant::now();
        let base = self.load(target, expect)?;
        let mid = base.manifest_id.hex();
        let n_swa = match base.manifest.fingerprint.get("n_swa") {
            Some(v) => v.trim().parse::<u32>().map_err(|_| Error::Invalid(format!("state {mid}: n_swa {v:?} is not a number")))?,
            None => 0,
        };
        let unavailable = |missing: Vec<(i32, i32)>, reason: String| PrefixReport::Unavailable {
            manifest_id: mid.clone(), n_tokens, missing, reason,
        };
        if base.manifest.layout.contains("rec[") {
            // docs/design.md "Recurrent and hybrid models": no stored part of it is the state after P tokens.
            return Ok(unavailable(Vec::new(), "a recurrent or hybrid state is never cut".into()));
        }
        if base.manifest.layout.matches("kv[").count() > 1 && n_swa == 0 {
            return Ok(unavailable(Vec::new(), "the state has SWA layers but its fingerprint has no n_swa".into()));
        }
        let spec = PrefixSpec { n_tokens, n_swa, n_stream: opts.n_stream, fill_masked: opts.fill_masked };
        let bb = blocks_of(&base)?;
        let me = StateRef { skeleton: &base.skeleton, blocks: &bb };
        let mut objects_read = base.objects_read;
        let mut lenders: Vec<Loaded> = Vec::new();
        let mut result = format::emit_prefix(me, &[], &spec)?;
        if let Prefix::Missing { missing } = &result {
            let end = missing.iter().map(|r| r.end).max().unwrap_or(0).max(0) as usize;
            let fp_id = fingerprint_id(&base.manifest.fingerprint);
            let depth = end / self.block_size() as usize;
            for id in self.lenders(namespace, &fp_id, &base.manifest.tokens, depth, base.manifest_id)? {
                let l = self.load(&Target::Manifest(&id.hex()), None)?;
                objects_read += l.objects_read;
                lenders.push(l);
            }
            if !lenders.is_empty() {
                let lb: Vec<Vec<&[u8]>> = lenders.iter().map(blocks_of).collect::<Result<_>>()?;
                let refs: Vec<StateRef<'_>> =
                    lenders.iter().zip(&lb).map(|(l, b)| StateRef { skeleton: &l.skeleton, blocks: b }).collect();
                result = format::emit_prefix(me, &refs, &spec)?;
            }
        }
        let (bytes, window, origins) = match result {
            Prefix::Missing { missing } => {
                return Ok(unavailable(missing.into_iter().map(|r| (r.start, r.end)).collect(), "window rows are not stored".into()))
            }
            Prefix::File { bytes, window, origins } => (bytes, window, origins),
        };
        let who = |state: usize| if state == 0 { mid.clone() } else { lenders[state - 1].manifest_id.hex() };
        let origins = origins.into_iter().map(|o| (who(o.state), o.checkpoint, o.positions.start, o.positions.end)).collect();
        // Not durable: the file is handed to llama-server and removed, like a non-durable materialize.
        atomic_write(out_path, FILE_TEMP, &bytes, false, || Ok::<(), Error>(()))?;
        Ok(PrefixReport::Written {
            manifest_id: mid.clone(),
            n_tokens,
            file_bytes: bytes.len() as u64,
            window: (window.start, window.end),
            origins,
            objects_read,
            elapsed_s: t0.elapsed().as_secs_f64(),
        })
    }
}
