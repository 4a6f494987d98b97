use profiler_common::test_skip::skip;

use super::*;

/// The libc this test process runs with (wherever this distribution keeps it), as mapped.
pub(in crate::unwind) fn libc() -> Vec<u8> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let path = maps
        .lines()
        .filter_map(|l| l.split_ascii_whitespace().nth(5))
        .find(|p| p.rsplit('/').next() == Some("libc.so.6"))
        .expect("a glibc mapped in this process");
    std::fs::read(path).unwrap()
}

fn rule_at(t: &Table, vaddr: u64) -> Row {
    let key = (vaddr - t.base) as u32;
    let i = t.rows.partition_point(|r| r.pc <= key);
    t.rows[i - 1]
}

#[test]
fn libc_compiles_to_sorted_rows_with_its_signal_trampoline() {
    let table = compile(&*libc()).unwrap();
    assert!(table.rows.len() > 1000, "{} rows", table.rows.len());
    assert!(table.rows.windows(2).all(|w| w[0].pc < w[1].pc), "sorted, one row per pc");
    assert!(table.rows.iter().any(|r| r.kind == kind::SIGNAL), "__restore_rt");
    assert!(table.rows.iter().any(|r| r.kind == kind::END), "_start or clone's thread entry");
    let sp = table.rows.iter().filter(|r| r.kind == kind::CFA_SP).count();
    assert!(sp * 2 > table.rows.len(), "libc is built without frame pointers: mostly rsp-based rows");
    eprintln!("libc: {} rows, {} KiB", table.rows.len(), table.bytes() / 1024);
}

#[test]
fn a_function_entry_has_the_return_address_on_top_of_the_stack() {
    let data = libc();
    let file = object::File::parse(&*data).unwrap();
    use object::ObjectSymbol;
    let qsort = file.dynamic_symbols().find(|s| s.name() == Ok("qsort")).expect("qsort in libc").address();
    let table = compile(&*data).unwrap();
    let row = rule_at(&table, qsort);
    assert_eq!((row.kind, row.cfa_offset, row.fp_offset), (kind::CFA_SP, 8, 0), "{row:?}");
}

// Tables are built for x86_64 only (docs/arm64.md); under qemu-user an arm64 test has no vDSO.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_vdso_of_this_process_compiles() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let line = maps.lines().find(|l| l.ends_with("[vdso]")).expect("a vDSO");
    let (start, end) = line.split_once(' ').unwrap().0.split_once('-').unwrap();
    let (start, end) = (u64::from_str_radix(start, 16).unwrap(), u64::from_str_radix(end, 16).unwrap());
    // SAFETY: the vDSO is mapped readable for the life of the process.
    let image = unsafe { std::slice::from_raw_parts(start as *const u8, (end - start) as usize) };
    let table = compile(image).unwrap();
    assert!(!table.rows.is_empty());
    assert_eq!(table.bias(start, 0).map(|b| b - table.base), Some(start), "the vDSO is linked at 0");
}

#[test]
fn gaps_between_functions_have_no_rule_and_equal_neighbours_merge() {
    let sp = |o| Rule { kind: kind::CFA_SP, cfa_offset: o, fp_offset: 0 };
    let t = build(vec![
        (0x1000, 0x1004, sp(8)),
        (0x1004, 0x1010, sp(16)),
        (0x1010, 0x1020, sp(16)),
        (0x1030, 0x1040, sp(8)),
    ])
    .unwrap();
    let rows: Vec<_> = t.rows.iter().map(|r| (r.pc, r.kind, r.cfa_offset)).collect();
    assert_eq!(
        rows,
        [
            (0, kind::CFA_SP, 8),
            (4, kind::CFA_SP, 16),
            (0x20, kind::NONE, 0),
            (0x30, kind::CFA_SP, 8),
            (0x40, kind::NONE, 0)
        ]
    );
}

#[test]
fn the_plt_and_realigned_main_expressions_are_understood() {
    // .plt: DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_lit11; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus
    let plt = expression(&[0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22], 0);
    assert_eq!((plt.kind, plt.fp_offset), (kind::PLT, 11));
    // main realigning its stack: DW_OP_breg6 -8; DW_OP_deref
    let main = expression(&[0x76, 0x78, 0x06], -2);
    assert_eq!((main.kind, main.cfa_offset, main.fp_offset), (kind::CFA_FP_DEREF, 8, -2));
    assert_eq!(expression(&[0x77, 8, 0x06], 0).kind, kind::NONE, "anything else stops the walk");
}

#[test]
fn malformed_frame_information_is_an_error_or_a_smaller_table_never_a_panic() {
    let data = libc();
    let file = object::File::parse(&*data).unwrap();
    let section = file.section_by_name(".eh_frame").unwrap();
    let (offset, size) = section.file_range().unwrap();
    let whole = compile(&*data).unwrap().rows.len();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..200 {
        let mut bad = data.clone();
        // Flip a few bytes inside .eh_frame, or cut it short.
        for _ in 0..4 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            bad[(offset + state % size) as usize] = state as u8;
        }
        if round % 10 == 0 {
            bad.truncate((offset + state % size) as usize);
        }
        if let Ok(t) = compile(&*bad) {
            assert!(t.rows.windows(2).all(|w| w[0].pc < w[1].pc));
            assert!(t.rows.len() <= whole * 2);
        }
    }
}

#[test]
fn a_file_read_on_demand_compiles_like_one_read_whole() {
    let path = ["/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap();
    let f = std::fs::File::open(path).unwrap();
    let lazy = compile(&object::ReadCache::new(&f)).unwrap();
    assert_eq!(lazy, compile(&*libc()).unwrap());
}

#[test]
fn a_code_segment_at_an_unaligned_offset_gets_the_bias_of_its_page() {
    // lld's layout: read-only data up to 0x16d94, code from file offset 0x16da0 at vaddr
    // 0x17da0; the kernel maps the code from file offset 0x16000 at a page whose vaddr is 0x17000.
    let loads = [
        Load { offset: 0, vaddr: 0, size: 0x16d94, exec: false },
        Load { offset: 0x16da0, vaddr: 0x17da0, size: 0x40b20, exec: true },
    ];
    let start = 0x5555_0000_0000 + 0x17000;
    assert_eq!(bias(0, &loads, start, 0x16000), Some(0x5555_0000_0000));
}

#[test]
fn compressed_sections_inflate_within_their_bound() {
    use std::io::Write as _;
    let plain = vec![7u8; 10_000];
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(&plain).unwrap();
    let z = z.finish().unwrap();
    let zlib = |max| {
        inflate(
            object::CompressedData { format: object::CompressionFormat::Zlib, data: &z, uncompressed_size: 10 },
            max,
        )
    };
    assert_eq!(&*zlib(10_000).unwrap(), &plain[..], "the claimed size is not trusted either way");
    assert!(matches!(zlib(9_999), Err(TableError::Compressed)), "a byte past the bound");
    let zstd = object::CompressedData { format: object::CompressionFormat::Zstandard, data: &z, uncompressed_size: 1 };
    assert!(matches!(inflate(zstd, 100), Err(TableError::Compressed)));
}

/// Go's linker writes its CFI to a compressed `.debug_frame` without the frame pointer: the rows
/// say where Go saved it (CFA - 16) in functions with a frame, and nothing in frameless ones.
#[test]
fn a_go_binary_compiles_with_its_saved_frame_pointers() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("gowork");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/workloads/gowork.go");
    let built = std::process::Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(src)
        .env("GOCACHE", dir.path().join("cache"))
        .env("GOPATH", dir.path().join("gopath"))
        .env("HOME", dir.path())
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .status();
    match built {
        Ok(st) => assert!(st.success(), "go build {src} failed"),
        Err(e) => {
            skip(&format!(
                "a_go_binary_compiles_with_its_saved_frame_pointers: `go` cannot run ({e}); `cargo xtask test` \
                 installs Debian's golang-go"
            ));
            return;
        }
    }
    let data = std::fs::read(&bin).unwrap();
    let file = object::File::parse(&*data).unwrap();
    assert!(file.section_by_name(".eh_frame").is_none(), "pure Go: CFI only in .debug_frame");
    use object::ObjectSymbol;
    let addr = |name: &str| file.symbols().find(|s| s.name() == Ok(name)).unwrap_or_else(|| panic!("{name}")).address();
    let table = compile(&*data).unwrap();
    // main.work: `SUBQ $n, SP; MOVQ BP, n-8(SP)` at its entry, then calls.
    let work = (addr("main.work")..addr("main.work") + 64).map(|a| rule_at(&table, a)).find(|r| r.cfa_offset > 8);
    let work = work.expect("main.work has a frame after its prologue");
    assert_eq!((work.kind, work.fp_offset), (kind::CFA_SP, -2), "{work:?}");
    let mix = rule_at(&table, addr("main.mix") + 4);
    assert_eq!((mix.kind, mix.cfa_offset, mix.fp_offset), (kind::CFA_SP, 8, 0), "frameless: {mix:?}");
}

/// A Rust toolchain's libLLVM: the one of the `rustc` on PATH (the toolchain building this test),
/// else any of rustup's (`RUSTUP_HOME`, else `~/.rustup`), as `cargo xtask setup` installs
/// nightly. Debian's own rustc links the system's LLVM and ships none.
fn rust_toolchain_libllvm() -> Option<std::path::PathBuf> {
    let sysroot = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| std::path::PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let rustup = std::env::var_os("RUSTUP_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".rustup")));
    let toolchains = rustup
        .and_then(|r| std::fs::read_dir(r.join("toolchains")).ok())
        .into_iter()
        .flatten()
        .flatten()
        .map(|t| t.path());
    sysroot
        .into_iter()
        .chain(toolchains)
        .flat_map(|t| std::fs::read_dir(t.join("lib")).into_iter().flatten().flatten())
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libLLVM.so.")))
}

/// The largest library on this machine (the Rust toolchain's libLLVM, 200 MB, 160,000 FDEs)
/// builds within its charge, and what it holds at its peak is about its rows and its sections.
#[test]
fn a_200_mb_library_builds_within_a_bounded_charge() {
    static POOL: crate::memory::Pool = crate::memory::Pool::new_for_tests("test-unwind", 64 << 20);
    let Some(path) = rust_toolchain_libllvm() else {
        skip(
            "a_200_mb_library_builds_within_a_bounded_charge: no libLLVM.so.* in a rustup toolchain's lib \
             (`cargo xtask setup` installs rustup's nightly, which ships one)",
        );
        return;
    };
    let file = std::fs::File::open(&path).unwrap();
    let table = compile_within(&object::ReadCache::new(&file), &POOL, Source::Read).unwrap();
    let peak = POOL.peak();
    eprintln!("{}: {} rows, peak charge {:.1} MiB", path.display(), table.rows.len(), peak as f64 / (1 << 20) as f64);
    assert!(table.rows.len() > 100_000);
    assert!(peak < 40 << 20, "peak {peak}");
    assert_eq!(POOL.used(), 0, "released");
    // Too small a pool: refused with a sentence, nothing held.
    static SMALL: crate::memory::Pool = crate::memory::Pool::new_for_tests("test-small", 4 << 20);
    let err = compile_within(&object::ReadCache::new(&file), &SMALL, Source::Read).unwrap_err();
    assert!(matches!(err, TableError::OverBudget { .. }), "{err}");
    assert_eq!(SMALL.used(), 0);
    // Mapped (a file no user can change), the sections are the page cache's: the charge is the
    // index and the rows.
    static MAPPED: crate::memory::Pool = crate::memory::Pool::new_for_tests("test-mapped", 64 << 20);
    // SAFETY: a read-only mapping of a toolchain file nothing writes during the test.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let mapped = compile_within(&map[..], &MAPPED, Source::Mapped).unwrap();
    assert_eq!(mapped, table);
    eprintln!("mapped: peak charge {:.1} MiB", MAPPED.peak() as f64 / (1 << 20) as f64);
    assert!(MAPPED.peak() < peak - (7 << 20), "the 7.7 MB .eh_frame is not charged");
}
