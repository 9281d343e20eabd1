//! Distributed lock (being built).
/// A distributed lock.
#[derive(Debug)]
pub struct ClusterLock;
/// Guard.
#[derive(Debug)]
pub struct LockGuard;
/// Info.
#[derive(Debug)]
pub struct LockInfo;
/// Options.
#[derive(Debug)]
pub struct LockOptions;
