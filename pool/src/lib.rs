#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod admission;
mod batch;
mod cleaned;
mod cleanup;
mod client;
mod codec;
pub mod connect;
mod custody;
mod dispatch;
mod drain;
mod error;
mod freshness;
mod handler;
mod handoffs;
mod identity;
mod keys;
mod lanes;
mod lease;
mod lifecycle;
mod liveness;
mod membership;
mod metrics;
mod node;
mod options;
mod owner_requests;
mod pool_view;
mod primary_check;
mod reader_follow;
mod reassert;
mod rebalance;
mod recorder;
mod rewind;
mod rollback;
mod routing;
mod server_clock;
mod silent_link;
mod standing_stops;
mod start;
mod stop_request;
mod store;
mod sweeper;
mod tasks;
#[cfg(test)]
mod tests;
mod tombstones;
mod worker;

pub mod history;
pub mod inspect;
pub mod leader;
pub mod lock;
pub mod multihome;
pub mod scheduler;
pub mod ticker;

/// The attribute [`Handler`] implementations use (re-exported so that they
/// need no version-matched `async-trait` dependency).
pub use async_trait::async_trait;
pub use client::{TLS_FEATURE, client_builder, reconnect_policy};
pub use drain::WorkerRemoval;
pub use error::{Error, Result};
/// The fred crate this library is built on, so that callers need no
/// version-matched dependency of their own (`flotilla_pool::fred::prelude::*`).
pub use fred;
pub use handler::{AtCapacity, Handler, HandlerError, Job, TaskHandler};
pub use leader::{LeaderLease, LeaderOptions};
pub use lifecycle::{JobOutcome, JobStatus, RestartPolicy};
pub use lock::{ClusterLock, LockGuard, LockInfo, LockOptions};
pub use node::Node;
pub use options::{DispatchOptions, LeasePolicy, NodeOptions, ScheduleOptions};
pub use pool_view::WorkerInfo;
pub use routing::Ring;
pub use scheduler::{Schedule, ScheduleRun, ScheduledJobs};
pub use ticker::{Tick, Ticker, TickerOptions};
pub use worker::Worker;
