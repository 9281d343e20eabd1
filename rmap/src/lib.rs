#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod error;
mod events;
mod keys;
pub mod lua;
mod map;
mod options;
mod replica;
mod snapshot;
mod subscriptions;
mod sync;

pub use error::Error;
pub use events::{MapEvent, MapEventKind, MapEvents};
pub use keys::{MAX_NAME_LEN, MapKeys, check_name};
pub use map::Map;
pub use options::{MapOptions, MapTtl};
pub use subscriptions::{Subscriptions, SubscriptionsOptions};
