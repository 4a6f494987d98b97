//! A process to be profiled: pins itself to a CPU and spins, in user mode, inside a function
//! whose name nothing else has, for the given number of seconds.
//!
//! usage: busy-helper CPU SECONDS

use std::time::{Duration, Instant};

/// The name the integration tests look for in flamegraphs.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn profiler_test_hot_loop(deadline: &Instant) -> u64 {
    let mut x = 0u64;
    while Instant::now() < *deadline {
        for i in 0..100_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(cpu), Some(secs)) =
        (args.get(1).and_then(|a| a.parse::<usize>().ok()), args.get(2).and_then(|a| a.parse::<f64>().ok()))
    else {
        eprintln!("usage: busy-helper CPU SECONDS");
        std::process::exit(2);
    };
    integration_tests::pin_to_cpu(cpu).unwrap_or_else(|e| {
        eprintln!("busy-helper: cannot pin to CPU {cpu}: {e}");
        std::process::exit(1);
    });
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    println!("{}", profiler_test_hot_loop(&deadline));
}
