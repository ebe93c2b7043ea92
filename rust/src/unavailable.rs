//! `Unavailable`: a place that keeps objects or names did not serve a request (unreachable, locked, refused).
//!
//! CONTRACT: backend-neutral. The backend or catalog that failed fills it in: `why` (what the caller may do
//! about it: an unreachable place may come back, a lock is held, a refusal needs the user), `location` (the
//! store as the user wrote it, e.g. `s3://bucket/prefix`) and `message` (what happened and what to do next,
//! shown as it is). Objects, the store and gc pass it on without knowing which backend wrote it.

/// What kind of failure, for callers that decide on it (and the Python exception it becomes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The place did not answer (down, unreachable, timed out): reads may serve what is held locally.
    Unreachable,
    /// A lock of the store is held (a gc, or saves in flight) for longer than the caller waits.
    Locked,
    /// Anything else the place refused or returned malformed (denied, a bad location, a bad record).
    Refused,
}

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Unavailable {
    pub why: Why,
    /// The store's location as the user wrote it.
    pub location: String,
    /// What happened and what to do next.
    pub message: String,
}
