//! Leader lease (being built).
/// Lease.
#[derive(Debug)]
pub struct LeaderLease;
/// Options.
#[derive(Debug)]
pub struct LeaderOptions;
