//! A fixed CPU-bound workload with a throughput figure, for overhead benchmarks: pinned to a
//! CPU, it mixes a 64 KiB buffer with a multiply-xorshift hash for the given seconds and prints
//! how many passes it completed.
//!
//! usage: hash-work CPU SECONDS

use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(cpu), Some(secs)) =
        (args.get(1).and_then(|a| a.parse().ok()), args.get(2).and_then(|a| a.parse::<f64>().ok()))
    else {
        eprintln!("usage: hash-work CPU SECONDS");
        std::process::exit(2);
    };
    integration_tests::pin_to_cpu(cpu).expect("pin");
    let buf: Vec<u64> = (0..8192u64).map(|i| i.wrapping_mul(0x9e3779b97f4a7c15)).collect();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let (mut passes, mut h) = (0u64, 0u64);
    while Instant::now() < deadline {
        for &w in &buf {
            h = (h ^ w).wrapping_mul(0xff51afd7ed558ccd);
            h ^= h >> 33;
        }
        passes += 1;
    }
    std::hint::black_box(h);
    println!("{passes}");
}
