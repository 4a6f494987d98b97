//! A Rust release binary (Rust omits frame pointers by default): a sort through the standard
//! library's generic code with a closure, a few calls below main.
use std::time::{Duration, Instant};

#[inline(never)]
fn weigh(x: u64) -> u64 {
    let mut h = x;
    for _ in 0..8 {
        h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17);
    }
    h
}

#[inline(never)]
fn sort_batch(v: &mut [u64], seed: u64) {
    for (i, x) in v.iter_mut().enumerate() {
        *x = weigh(seed ^ i as u64);
    }
    v.sort_by(|a, b| weigh(*a).cmp(&weigh(*b)));
}

#[inline(never)]
fn churn(secs: f64) -> u64 {
    let mut v = vec![0u64; 50_000];
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut seed = 1;
    while Instant::now() < end {
        sort_batch(&mut v, seed);
        seed += 1;
    }
    v[0]
}

fn main() {
    let secs = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(5.0);
    std::process::exit((churn(secs) == 42) as i32);
}
