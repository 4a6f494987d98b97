//! Two threads passing a byte back and forth through two pipes: every pass is a context switch
//! (a wait of microseconds), the off-CPU program's worst case. Prints the passes a second.
//!
//! usage: pingpong SECONDS

use std::time::{Duration, Instant};

fn pass(read: i32, write: i32) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: one byte to and from live buffers.
    unsafe { libc::read(read, b.as_mut_ptr().cast(), 1) == 1 && libc::write(write, b.as_ptr().cast(), 1) == 1 }
}

fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or_else(|| {
        eprintln!("usage: pingpong SECONDS");
        std::process::exit(2);
    });
    let (mut a, mut b) = ([0i32; 2], [0i32; 2]);
    // SAFETY: fresh pipes into two-element arrays.
    assert!(unsafe { libc::pipe(a.as_mut_ptr()) == 0 && libc::pipe(b.as_mut_ptr()) == 0 }, "pipe");
    let (a_read, a_write, b_read, b_write) = (a[0], a[1], b[0], b[1]);
    // The echo: reads from a, writes to b, until a closes.
    let echo = std::thread::spawn(move || while pass(a_read, b_write) {});
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut passes = 0u64;
    // SAFETY: the first byte.
    unsafe { libc::write(a_write, b"x".as_ptr().cast(), 1) };
    while Instant::now() < deadline {
        for _ in 0..1000 {
            if !pass(b_read, a_write) {
                break;
            }
        }
        passes += 2000;
    }
    let rate = passes as f64 / start.elapsed().as_secs_f64();
    // SAFETY: closing our end ends the echo.
    unsafe { libc::close(a_write) };
    let _ = echo.join();
    println!("switches_per_sec={rate:.0}");
}
