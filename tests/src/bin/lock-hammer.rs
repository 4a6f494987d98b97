//! `lock-hammer MODE PER_CPU SECONDS DIR [HELD]`: PER_CPU processes pinned to each CPU take and drop
//! POSIX record locks for SECONDS. Each first holds HELD (100) locks, so every call walks them
//! all under the file's spin lock (`flc_lock`). Measured on 6.18 with 2 vCPUs: 20 held locks
//! made too short a critical section to contend much, 400 so long that the paravirtual waiters
//! halted (idle, not spinning); about 100 kept both CPUs 20-40 % in the slow path.
//! - `contend`: all processes lock one file (DIR/shared): they spin on its one lock;
//! - `spread`: each process locks its own file: the same work, no lock shared (a busy, healthy
//!   machine).

use std::{
    fs::OpenOptions,
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

fn lock(fd: i32, kind: i32, start: i64) {
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = start;
    fl.l_len = 1;
    // SAFETY: a valid fd and a filled flock.
    unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) };
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !(5..=6).contains(&args.len()) {
        eprintln!("usage: lock-hammer contend|spread PER_CPU SECONDS DIR [HELD]");
        std::process::exit(2);
    }
    let contend = args[1] == "contend";
    let per_cpu: usize = args[2].parse().expect("PER_CPU");
    let secs: u64 = args[3].parse().expect("SECONDS");
    let held: i64 = args.get(5).map_or(100, |h| h.parse().expect("HELD"));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut children = Vec::new();
    for cpu in 0..cpus {
        for i in 0..per_cpu {
            let me = (cpu * per_cpu + i) as i64;
            // SAFETY: the child only pins itself, opens a file and locks; then exits.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: plain prctl; the children die with the parent (a test's Kill).
                unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
                let _ = integration_tests::pin_to_cpu(cpu);
                let name = if contend { "shared".to_string() } else { format!("own-{me}") };
                let path = std::path::Path::new(&args[4]).join(name);
                let file =
                    OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).expect("open");
                let fd = file.as_raw_fd();
                for k in 0..held {
                    lock(fd, libc::F_WRLCK, (k * 64 + me) * 2);
                }
                let end = Instant::now() + Duration::from_secs(secs);
                while Instant::now() < end {
                    for _ in 0..200 {
                        lock(fd, libc::F_WRLCK, 1_000_000 + me);
                        lock(fd, libc::F_UNLCK, 1_000_000 + me);
                    }
                }
                // SAFETY: leaving the child without running the parent's destructors.
                unsafe { libc::_exit(0) };
            }
            children.push(pid);
        }
    }
    for pid in children {
        // SAFETY: reaping our own children.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    }
}
