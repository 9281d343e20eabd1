//! The root README's Quick start, compiled as a doc test with only
//! `flotilla-pool` and `tokio` as dependencies (`cargo test -p
//! flotilla-quickstart --doc`), and the checks of a build of
//! `flotilla-pool` without its `tls` feature (`tests/without_tls.rs`).
//!
//! Run on its own (`cargo test -p flotilla-quickstart`) this crate builds
//! fred without any TLS feature; in a workspace build the test support
//! crate turns TLS on, and the tests check that case instead.
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

/// Whether this build of fred can speak TLS (`rediss://`).
pub fn tls_built_in() -> bool {
    flotilla_pool::fred::prelude::Config::from_url("rediss://127.0.0.1:1")
        .is_ok_and(|c| c.uses_tls())
}

/// The root README, so that its Quick start is compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct RootReadme;
