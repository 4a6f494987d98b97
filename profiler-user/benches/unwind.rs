//! Unwind-table costs (issue 12): time and rows to compile the tables of large binaries, and
//! how many distinct binaries of this machine the default kernel bound holds.
//!
//! `cargo bench -p profiler-user --bench unwind` (or `cargo xtask bench unwind`, which also
//! measures the BPF side under a live daemon).

use std::{path::PathBuf, time::Instant};

use profiler::unwind::table;

fn elf_files(dir: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(dir).map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect()).unwrap_or_default();
    v.sort();
    v.retain(|p| {
        let Ok(meta) = std::fs::metadata(p) else { return false };
        meta.is_file() && std::fs::read(p).map(|b| b.starts_with(b"\x7fELF")).unwrap_or(false)
    });
    v
}

fn main() {
    let rustc_driver = std::process::Command::new("rustc").args(["--print", "sysroot"]).output().ok().and_then(|o| {
        let lib = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("lib");
        std::fs::read_dir(lib)
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("librustc_driver")))
    });
    println!("## Compiling unwind tables (one thread)\n");
    println!("| binary | size | rows | table | time |");
    println!("|---|---:|---:|---:|---:|");
    let mut big: Vec<PathBuf> = vec!["/usr/lib/x86_64-linux-gnu/libc.so.6".into(), "/usr/bin/python3".into()];
    big.extend(rustc_driver);
    for path in big.iter().filter(|p| p.exists()) {
        let file = std::fs::File::open(path).unwrap();
        let size = file.metadata().unwrap().len();
        let t = Instant::now();
        let result = table::compile(&object::ReadCache::new(&file));
        let took = t.elapsed();
        match result {
            Ok(tab) => println!(
                "| {} | {:.1} MB | {} | {:.1} MiB | {:.0} ms |",
                path.display(),
                size as f64 / 1e6,
                tab.rows.len(),
                tab.bytes() as f64 / (1 << 20) as f64,
                took.as_secs_f64() * 1e3
            ),
            Err(e) => println!("| {} | {:.1} MB | {e} | | |", path.display(), size as f64 / 1e6),
        }
    }
    let mut files = elf_files("/usr/lib/x86_64-linux-gnu");
    files.extend(elf_files("/usr/bin"));
    let (mut n, mut rows, mut failed) = (0usize, 0usize, 0usize);
    let t = Instant::now();
    for path in files.iter().take(500) {
        let Ok(file) = std::fs::File::open(path) else { continue };
        match table::compile(&object::ReadCache::new(&file)) {
            Ok(tab) => {
                n += 1;
                rows += tab.rows.len();
            }
            Err(_) => failed += 1,
        }
    }
    let bytes = rows * size_of::<profiler_common::unwind::Row>();
    println!(
        "\n{} distinct binaries of /usr/lib/x86_64-linux-gnu and /usr/bin ({} without usable CFI): {} rows, {:.1} MiB of the default {} MiB, compiled in {:.1} s",
        n,
        failed,
        rows,
        bytes as f64 / (1 << 20) as f64,
        profiler::config::UNWIND_MIB_DEFAULT,
        t.elapsed().as_secs_f64()
    );
}
