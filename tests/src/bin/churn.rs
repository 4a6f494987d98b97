//! Process churn like a busy node's: RATE short-lived processes a second, each a fresh binary.
//!
//! Every GENERATION_SECS a new set of copies of this program is written (new files, so new
//! inodes: to a profiler each is a module it has never seen, as after a deploy), and the set
//! before it is deleted. Each child spins SPIN_MS in `churn_child_spin` (so samples land in its
//! own binary), sleeps out the rest of LIFE_MS and exits.
//!
//! usage: churn RATE SECONDS [SPIN_MS] [LIFE_MS]
//! prints: spawned N failed M generations G

use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

const COPIES_PER_GENERATION: usize = 16;
const GENERATION_SECS: u64 = 5;

#[inline(never)]
#[unsafe(no_mangle)]
extern "C" fn churn_child_spin(until: &Instant) -> u64 {
    let mut x = 0u64;
    while Instant::now() < *until {
        for i in 0..1000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
    }
    x
}

fn child(spin_ms: u64, life_ms: u64) {
    let start = Instant::now();
    churn_child_spin(&(start + Duration::from_millis(spin_ms)));
    std::thread::sleep(Duration::from_millis(life_ms).saturating_sub(start.elapsed()));
}

/// A copy of this program without its debug info (small, quick to write), or a plain copy when
/// `strip` is missing.
fn copy_self(to: &Path) -> std::io::Result<()> {
    let me = std::env::current_exe()?;
    let stripped = Command::new("strip").arg("--strip-debug").arg("-o").arg(to).arg(&me).status();
    if !stripped.is_ok_and(|s| s.success()) {
        std::fs::copy(&me, to)?;
    }
    Ok(())
}

fn generation(root: &Path, n: u64) -> std::io::Result<Vec<PathBuf>> {
    let dir = root.join(format!("gen-{n}"));
    std::fs::create_dir_all(&dir)?;
    (0..COPIES_PER_GENERATION)
        .map(|i| {
            let p = dir.join(format!("churn-{n}-{i}"));
            copy_self(&p).map(|()| p)
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        let n = |i: usize, d: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
        child(n(2, 5), n(3, 30));
        return;
    }
    let num = |i: usize| args.get(i).and_then(|a| a.parse::<f64>().ok());
    let (Some(rate), Some(secs)) = (num(1), num(2)) else {
        eprintln!("usage: churn RATE SECONDS [SPIN_MS] [LIFE_MS]");
        std::process::exit(2);
    };
    let spin_ms = num(3).unwrap_or(5.0) as u64;
    let life_ms = num(4).unwrap_or(30.0) as u64;
    let root = std::env::temp_dir().join(format!("churn-{}", std::process::id()));
    let start = Instant::now();
    let (mut spawned, mut failed, mut generations) = (0u64, 0u64, 0u64);
    let mut bins = generation(&root, 0).expect("writing the first generation of binaries");
    let mut running: Vec<Child> = Vec::new();
    while start.elapsed().as_secs_f64() < secs {
        let gen_now = start.elapsed().as_secs() / GENERATION_SECS;
        if gen_now > generations {
            generations = gen_now;
            match generation(&root, gen_now) {
                Ok(b) => {
                    bins = b;
                    // The old files go; children still running from them keep them mapped.
                    let _ = std::fs::remove_dir_all(root.join(format!("gen-{}", gen_now - 1)));
                }
                Err(e) => eprintln!("churn: cannot write generation {gen_now}: {e}"),
            }
        }
        let bin = &bins[spawned as usize % bins.len()];
        match Command::new(bin).args(["--child", &spin_ms.to_string(), &life_ms.to_string()]).spawn() {
            Ok(c) => running.push(c),
            Err(_) => failed += 1,
        }
        spawned += 1;
        running.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
        // Paced against the start, so a slow spawn does not lower the rate.
        let next = Duration::from_secs_f64(spawned as f64 / rate);
        std::thread::sleep(next.saturating_sub(start.elapsed()));
    }
    for mut c in running {
        let _ = c.wait();
    }
    let _ = std::fs::remove_dir_all(&root);
    println!("spawned {spawned} failed {failed} generations {}", generations + 1);
}
