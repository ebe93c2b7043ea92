//! Lock files in the bucket (restic's model): `<prefix>/locks/<kind>-<random>`, and the gc generation
//! counter `<prefix>/gc-generation`.
//!
//! CONTRACT: a save holds a *shared* lock from its first upload to its name commit; gc holds the *exclusive*
//! lock while it marks and deletes. Taking a lock = write it, then list `locks/`: a saver that sees a live
//! exclusive lock removes its own, backs off and retries until `wait` is spent (then `Locked`); a gc that
//! sees another live exclusive lock removes its own and refuses at once (`Locked`: two gcs never run; in a
//! true tie both refuse), and one that sees live shared locks keeps its own (new saves back off) and waits
//! up to `wait` for them to go. Age is measured against the bucket's LastModified of the lock just written,
//! so machine clocks do not matter; a lock older than `stale` is ignored (a crashed holder), and gc removes it;
//! so is, at once, a lock written on this machine (same host name and boot id) by a process that is gone.
//! A held lock is rewritten every `stale / 3` (a long save stays live), and removed when its guard drops. The generation is bumped (CAS) by every gc before it deletes.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;

use super::client::{Bucket, Meta};
use super::error::RemoteError;
use super::keys::unique_suffix;

pub const GENERATION_KEY: &str = "gc-generation";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Shared,
    Exclusive,
}

impl Kind {
    fn tag(self) -> &'static str {
        match self {
            Kind::Shared => "shared",
            Kind::Exclusive => "exclusive",
        }
    }
}

/// A held lock; removed from the bucket on drop.
pub struct LockGuard {
    bucket: Arc<Bucket>,
    key: String,
    refresh: Option<tokio::task::JoinHandle<()>>,
    /// The bucket's clock when the lock was written.
    pub written: SystemTime,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(task) = self.refresh.take() {
            task.abort();
            let _ = self.bucket.block_on(task); // no rewrite after the delete below
        }
        let _ = self.bucket.delete(&self.key);
    }
}

fn age(now: SystemTime, m: &Meta) -> Duration {
    now.duration_since(m.modified).unwrap_or(Duration::ZERO)
}

/// Another lock seen: its metadata, kind, and whether it is live (younger than the stale age).
type Seen = (Meta, Kind, bool);

/// Write a lock of `kind` and return it with the other locks.
fn write_and_list(bucket: &Arc<Bucket>, kind: Kind, stale: Duration) -> Result<(LockGuard, Vec<Seen>), RemoteError> {
    let key = format!("locks/{}-{}", kind.tag(), unique_suffix());
    let body = serde_json::json!({"kind": kind.tag(), "pid": std::process::id(), "host": this_machine()});
    let body = Bytes::from(body.to_string());
    bucket.put(&key, body.clone())?;
    let refresh = Some(bucket.refresh_every(&key, body, (stale / 3).max(Duration::from_millis(100))));
    let mut guard = LockGuard { bucket: bucket.clone(), key: key.clone(), refresh, written: SystemTime::now() };
    let mut others = Vec::new();
    for m in bucket.list("locks")? {
        if m.rel == key {
            guard.written = m.modified;
            continue;
        }
        let name = m.rel.rsplit('/').next().unwrap_or("");
        let k = if name.starts_with("exclusive-") { Kind::Exclusive } else { Kind::Shared };
        others.push((m, k, true));
    }
    for o in &mut others {
        o.2 = age(guard.written, &o.0) <= stale && !holder_gone(bucket, &o.0.rel);
    }
    Ok((guard, others))
}

/// This machine: host name and kernel boot id (a host name alone may repeat across containers or reboots).
pub(super) fn this_machine() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let host = if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        String::new()
    };
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{host}/{}", boot.trim())
}

/// Restic's rule for a crashed holder on this machine: the lock names this machine and a process that no longer
/// exists. Any doubt (unreadable lock, another machine, a live or unknown pid) leaves the lock live.
fn holder_gone(bucket: &Bucket, rel: &str) -> bool {
    let Ok(Some((body, _))) = bucket.get(rel) else { return false };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else { return false };
    let (Some(host), Some(pid)) = (v["host"].as_str(), v["pid"].as_u64()) else { return false };
    let me = this_machine();
    if host != me || me.ends_with('/') || pid == 0 || pid > i32::MAX as u64 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// A save's shared lock: waits (backing off) while a gc holds the exclusive one, at most `wait`.
pub fn shared(bucket: &Arc<Bucket>, stale: Duration, wait: Duration) -> Result<LockGuard, RemoteError> {
    let t0 = Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        let (guard, others) = write_and_list(bucket, Kind::Shared, stale)?;
        if !others.iter().any(|(_, k, live)| *k == Kind::Exclusive && *live) {
            return Ok(guard);
        }
        drop(guard);
        if t0.elapsed() + pause > wait {
            return Err(RemoteError::Locked {
                url: bucket.url().into(),
                detail: format!(
                    "a gc holds the store's exclusive lock for more than {:.0} s; nothing was saved, try again later",
                    wait.as_secs_f64()
                ),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// gc's exclusive lock: refuses if another gc holds one; waits at most `wait` for saves in flight.
pub fn exclusive(bucket: &Arc<Bucket>, stale: Duration, wait: Duration) -> Result<LockGuard, RemoteError> {
    let t0 = Instant::now();
    let (guard, others) = write_and_list(bucket, Kind::Exclusive, stale)?;
    let locked = |detail: String| RemoteError::Locked { url: bucket.url().into(), detail };
    for (m, k, live) in &others {
        if !live {
            let _ = bucket.delete(&m.rel); // a crashed holder's
        } else if *k == Kind::Exclusive {
            let a = age(guard.written, m).as_secs();
            drop(guard);
            return Err(locked(format!("another gc is running (lock {}, taken {a} s ago); this gc refused", m.rel)));
        }
    }
    let mut pending: Vec<String> =
        others.iter().filter(|(_, k, live)| *k == Kind::Shared && *live).map(|(m, _, _)| m.rel.clone()).collect();
    while !pending.is_empty() {
        if t0.elapsed() > wait {
            drop(guard);
            return Err(locked(format!(
                "{} save(s) in flight held the lock for more than {:.0} s; gc refused, try again",
                pending.len(),
                wait.as_secs_f64()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
        let keys: Vec<String> = bucket.list("locks")?.into_iter().map(|m| m.rel).collect();
        pending.retain(|k| keys.contains(k));
    }
    Ok(guard)
}

/// The gc generation (0 before the first gc).
pub fn generation(bucket: &Bucket) -> Result<(u64, Option<String>), RemoteError> {
    match bucket.get(GENERATION_KEY)? {
        None => Ok((0, None)),
        Some((b, m)) => {
            let n = std::str::from_utf8(&b).ok().and_then(|s| s.trim().parse().ok()).ok_or_else(|| {
                RemoteError::Invalid { url: bucket.url().into(), detail: format!("{GENERATION_KEY} is not a number") }
            })?;
            Ok((n, m.etag))
        }
    }
}

/// Bump the generation (CAS); returns the new value.
pub fn bump_generation(bucket: &Bucket) -> Result<u64, RemoteError> {
    for _ in 0..16 {
        let (n, etag) = generation(bucket)?;
        if bucket.put_if_match(GENERATION_KEY, Bytes::from((n + 1).to_string()), etag.as_deref())?.is_some() {
            return Ok(n + 1);
        }
    }
    Err(RemoteError::Invalid { url: bucket.url().into(), detail: format!("{GENERATION_KEY} kept changing") })
}
