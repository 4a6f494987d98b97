//! The profiler's userspace. The data path, in module order:
//! collect (BPF ring buffer) → symbolize (blazesym) → store (time-bucketed segments) →
//! query (windows, filters, folding) → flamegraph (folded text, inferno SVG), exports, and ship
//! (the store pushed to a collector).
//! `pipeline` is the per-sample path (parse a record → symbolize → detect → store); `daemon` feeds
//! it from the ring buffer and flushes it; `main.rs` is the CLI over all of them.
//! `identity` says which container, pod or systemd unit a pid belongs to; `context` whether a
//! sample ran for its task or in a softirq. `interpreter` holds each language runtime whose
//! frames are walked and named (CPython); `gpu` the rooms that read the GPUs, `gpu_readings`
//! what they read, below the detectors.

pub mod budget;
pub mod collect;
pub mod config;
pub mod daemon;
pub mod detect;
pub mod exec_context;
pub mod export;
pub mod fleet;
pub mod flight;
pub mod gpu;
pub mod gpu_readings;
pub mod identity;
pub mod interpreter;
pub mod logs;
pub mod memory;
pub mod model;
pub mod offcpu;
pub mod outfile;
pub mod pipeline;
pub mod prefetch;
pub mod query;
pub mod serve;
pub mod ship;
pub mod store;
pub mod symbolize;
pub mod threads;
pub mod timespec;
pub mod untrusted;
pub mod unwind;
