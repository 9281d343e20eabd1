//! Tests of every script against a real Redis, through PoolStore alone.
