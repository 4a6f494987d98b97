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
    // Files named after `--` are measured instead (a GPU node's libtorch_cpu.so, libcublasLt.so).
    let named: Vec<PathBuf> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).map(PathBuf::from).collect();
    println!("## Compiling unwind tables (one thread)\n");
    println!(
        "| binary | size | rows | table, 8-byte rows | in the kernel, packed | time | distinct rules | most rows in a 4 KiB page |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    // One rules array for every table, as the registry keeps it.
    let mut shared = profiler::unwind::packed::Rules::default();
    let mut packed_words = 0;
    let mut big: Vec<PathBuf> = vec!["/usr/lib/x86_64-linux-gnu/libc.so.6".into(), "/usr/bin/python3".into()];
    big.extend(rustc_driver);
    if !named.is_empty() {
        big = named.clone();
    }
    let mut named_rows = 0;
    for path in big.iter().filter(|p| p.exists()) {
        let file = std::fs::File::open(path).unwrap();
        let size = file.metadata().unwrap().len();
        let t = Instant::now();
        // As the daemon builds a root-owned file's table: its sections are page cache, not
        // charged to the build pool (a 450 MB libtorch_cpu.so reads 35 MB of them).
        let result = if named.is_empty() {
            table::compile(&object::ReadCache::new(&file))
        } else {
            table::compile_within(&object::ReadCache::new(&file), &profiler::memory::UNWIND, table::Source::Mapped)
        };
        let took = t.elapsed();
        match result {
            Ok(tab) => {
                named_rows += tab.rows.len();
                // What a narrower layout could use: rules as a dictionary, rows grouped by page.
                let rules: std::collections::HashSet<(u16, u8, i8)> =
                    tab.rows.iter().map(|r| (r.cfa_offset, r.kind, r.fp_offset)).collect();
                let mut pages = std::collections::HashMap::<u32, usize>::new();
                for r in &tab.rows {
                    *pages.entry(r.pc >> 16).or_default() += 1;
                }
                let words = shared.pack(&tab.rows).map_or(0, |(p, _)| p.words.len());
                packed_words += words;
                println!(
                    "| {} | {:.1} MB | {} | {:.1} MiB | {:.1} MiB | {:.0} ms | {} | {} |",
                    path.display(),
                    size as f64 / 1e6,
                    tab.rows.len(),
                    tab.bytes() as f64 / (1 << 20) as f64,
                    (words * 4) as f64 / (1 << 20) as f64,
                    took.as_secs_f64() * 1e3,
                    rules.len(),
                    pages.values().max().copied().unwrap_or(0),
                )
            }
            Err(e) => println!("| {} | {:.1} MB | {e} | | |", path.display(), size as f64 / 1e6),
        }
    }
    if !named.is_empty() {
        let bytes = named_rows * size_of::<profiler_common::unwind::Row>();
        println!(
            "\n{named_rows} rows: {:.1} MiB at 8 bytes a row, {:.1} MiB packed ({} distinct rules shared, {} KiB)",
            bytes as f64 / (1 << 20) as f64,
            (packed_words * 4) as f64 / (1 << 20) as f64,
            shared.len(),
            shared.len() * 4 / 1024
        );
        return;
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
    // Packed in the kernel: 4 bytes a row (page indexes aside, a word per 64 KiB of code).
    let bytes = rows * size_of::<u32>();
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
