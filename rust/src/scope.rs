//! `Scope`: the key an object id is computed under, so that dedup never crosses a namespace.
//!
//! CONTRACT (docs/design.md "Objects"): the skeleton and blocks of a state saved in namespace `ns != ""` are
//! addressed by blake3's keyed mode under `blake3::derive_key(SCOPE_CONTEXT, ns)`; the default namespace `""`
//! (and every manifest, whose JSON names its scope) is unkeyed: `ObjectId::of`, plain blake3, as before scopes
//! existed. The key is derived, not kept: every machine sharing a bucket computes the same one and there is
//! nothing to distribute. It scopes dedup (two tenants storing the same bytes store them twice, so neither can
//! learn from its own save that the other holds them); it is not a secret and hides nothing by itself. The
//! manifest records the namespace (`Manifest::scope`, absent = unkeyed), and every read that checks an id asks
//! the manifest's `Scope` (`Scope::id_of`, the one place that decides how an id is computed).

use crate::id::ObjectId;

/// blake3 `derive_key` context of a namespace's object key. Changing it re-addresses every scoped object.
pub const SCOPE_CONTEXT: &str = "kvstore object scope v1";

#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Plain blake3: the default namespace, manifests, and every state saved before scopes existed.
    Unkeyed,
    /// Keyed blake3 under the namespace's derived key.
    Namespace { namespace: String, key: [u8; 32] },
}

impl Scope {
    /// The scope a state saved in `namespace` is addressed in: unkeyed for `""`, else the namespace's key.
    pub fn of_namespace(namespace: &str) -> Scope {
        if namespace.is_empty() {
            return Scope::Unkeyed;
        }
        let key = blake3::derive_key(SCOPE_CONTEXT, namespace.as_bytes());
        Scope::Namespace { namespace: namespace.to_string(), key }
    }

    /// The scope a manifest records (`None`: unkeyed; a manifest never records `""`).
    pub fn recorded(recorded: Option<&str>) -> Scope {
        recorded.map_or(Scope::Unkeyed, Scope::of_namespace)
    }

    /// The id of `bytes` in this scope.
    pub fn id_of(&self, bytes: &[u8]) -> ObjectId {
        match self {
            Scope::Unkeyed => ObjectId::of(bytes),
            Scope::Namespace { key, .. } => ObjectId(*blake3::keyed_hash(key, bytes).as_bytes()),
        }
    }

    /// What a manifest records for this scope: the namespace, or nothing for unkeyed.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Scope::Unkeyed => None,
            Scope::Namespace { namespace, .. } => Some(namespace),
        }
    }
}

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Unkeyed => f.write_str("Scope::Unkeyed"),
            Scope::Namespace { namespace, .. } => write!(f, "Scope::Namespace({namespace:?})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_bytes_two_namespaces_two_ids() {
        let bytes = b"the same block in two tenants";
        let (a, b) = (Scope::of_namespace("a"), Scope::of_namespace("b"));
        assert_ne!(a.id_of(bytes), b.id_of(bytes));
        assert_eq!(a.id_of(bytes), Scope::of_namespace("a").id_of(bytes)); // deterministic: any machine agrees
        assert_ne!(a.id_of(bytes), ObjectId::of(bytes));
        // The default namespace is unkeyed: ids (and so dedup) of stores made before scopes are unchanged.
        assert_eq!(Scope::of_namespace(""), Scope::Unkeyed);
        assert_eq!(Scope::Unkeyed.id_of(bytes), ObjectId::of(bytes));
        assert_eq!(Scope::recorded(None), Scope::Unkeyed);
        assert_eq!(Scope::recorded(Some("a")), a);
        assert_eq!(a.namespace(), Some("a"));
        // Pinned: changing the derivation re-addresses every scoped object of every store.
        let key = blake3::derive_key("kvstore object scope v1", b"a");
        assert_eq!(a.id_of(bytes).0, *blake3::keyed_hash(&key, bytes).as_bytes());
    }
}
