//! Reads a memory.stat file in a loop, pinned to a CPU, like a monitoring agent polling
//! cgroup statistics (kubelet, cadvisor).
//!
//! usage: memstat-reader STAT_FILE CPU SECONDS

use std::{
    io::{Read, Seek},
    time::{Duration, Instant},
};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(path), Some(cpu), Some(secs)) =
        (args.get(1), args.get(2).and_then(|c| c.parse().ok()), args.get(3).and_then(|s| s.parse::<f64>().ok()))
    else {
        eprintln!("usage: memstat-reader STAT_FILE CPU SECONDS");
        std::process::exit(2);
    };
    integration_tests::pin_to_cpu(cpu).expect("pin");
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut f = std::fs::File::open(path).expect("open stat file");
    let mut buf = Vec::with_capacity(8192);
    let mut reads = 0u64;
    while Instant::now() < deadline {
        buf.clear();
        f.rewind().expect("rewind");
        f.read_to_end(&mut buf).expect("read");
        reads += 1;
    }
    println!("{reads}");
}
