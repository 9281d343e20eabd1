//! Runnable examples of Flotilla.
