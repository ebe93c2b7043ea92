//! kvstore core: a content-addressed, deduplicating store of llama.cpp slot states.
pub mod format;
