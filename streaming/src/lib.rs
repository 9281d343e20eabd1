#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

mod claim;
mod conn;
mod error;
mod event;
mod fanout;
mod filter;
mod keys;
pub mod lua;
mod members;
mod options;
mod reader;
mod rewind;
mod sink;
mod stale;
mod stream;

pub use error::Error;
pub use event::Event;
pub use filter::{TopicFilter, TopicPredicate};
pub use options::{
    AddOptions, ReaderOptions, SinkOptions, StartPosition, StreamOptions, StreamTtl,
};
pub use reader::{Reader, ReaderEvents};
pub use sink::{Sink, SinkEvents};
pub use stream::Stream;
