//! The profiler's userspace. The data path, in module order:
//! collect (BPF ring buffer) → symbolize (blazesym) → store (time-bucketed segments) →
//! query (windows, filters, folding) → flamegraph (folded text, inferno SVG).
//! `daemon` wires the first three together; `main.rs` is the CLI over all of them.

pub mod collect;
pub mod config;
pub mod daemon;
pub mod detect;
pub mod export;
pub mod logs;
pub mod model;
pub mod query;
pub mod serve;
pub mod store;
pub mod symbolize;
pub mod synth;
pub mod timespec;
