//! One module per benchmark section.

pub mod dispatch;
pub mod failover;
pub mod fleet;
pub mod floor;
pub mod idle;
pub mod rebalance;
pub mod rmap;
pub mod scale;
pub mod stream;
