//! A thread that only wants the CPU briefly and often: pins itself to a CPU, then for the given
//! number of seconds sleeps 2 ms and does a few microseconds of work, over and over. A
//! real-time spinner on its CPU keeps it runnable but off the CPU (run-queue starvation).
//!
//! usage: napper CPU SECONDS

use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(cpu), Some(secs)) =
        (args.get(1).and_then(|a| a.parse::<usize>().ok()), args.get(2).and_then(|a| a.parse::<f64>().ok()))
    else {
        eprintln!("usage: napper CPU SECONDS");
        std::process::exit(2);
    };
    integration_tests::pin_to_cpu(cpu).unwrap_or_else(|e| {
        eprintln!("napper: cannot pin to CPU {cpu}: {e}");
        std::process::exit(1);
    });
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let (mut naps, mut x) = (0u64, 0u64);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
        for i in 0..1000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        naps += 1;
    }
    println!("{naps} naps {x}");
}
