//! A process an unprivileged user could run to trouble the profiler's symbolizer (issue 14, E5,
//! E6, E10). It spins in a function whose name only it has, in one of these ways:
//!
//! - `fifo`: spins in `hostile_before_swap` until a line arrives on stdin, then renames its own
//!   executable, puts a FIFO at the old path, and spins in `hostile_after_swap`;
//! - `deleted`: deletes its own executable, then spins in `hostile_deleted_spin`;
//! - `mappings N DIR`: maps one file under a ~3,800-character path below DIR executable N times,
//!   and spins in it (an address outside the maps it had at exec: the daemon re-reads them);
//! - `bigsym DIR`: writes a sparse ELF below DIR whose symbol table claims 100 M symbols, maps it
//!   executable and spins in it.
//!
//! - `ehframe DIR`: the same, with an `.eh_frame` section header claiming 1,000 MB (a sparse
//!   1 GB file): an unwind-table builder that reads sections whole reads a gigabyte;
//! - `debugframe DIR`: the same, with a 60 KB zlib-compressed `.debug_frame` that inflates to
//!   60 MiB: one CIE and one FDE of 21 M rows, alternating the CFA offset;
//! - `perfmap LINES NAME_BYTES`: spins in anonymous executable memory ("JIT code") named by a
//!   `/tmp/perf-PID.map` of LINES lines with names of NAME_BYTES characters;
//!
//! - `symflood FILES SYMBOLS DIR`: writes FILES distinct ELF files below DIR, each with a real
//!   symbol table of SYMBOLS functions, maps them all, and spins in each from a thread of its
//!   own: every file's symbols are wanted at once;
//! - `jitchain FUNCTIONS NAME_BYTES`: writes FUNCTIONS small functions into anonymous executable
//!   memory, named by a perf map with names of NAME_BYTES characters, and calls them in ever
//!   new random chains 126 deep (frame pointers kept): every sample a stack never seen before;
//!
//! - `early SECONDS`: spins in `hostile_early_spin` from its first instant (the profiler read
//!   its maps at exec, before the loader mapped libc) for SECONDS.
//!
//! Run it from a copy: `fifo` and `deleted` rename or delete the file it runs from.

use std::{
    io::{BufRead, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

fn spin_forever(mut x: u64) -> u64 {
    loop {
        for i in 0..100_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn hostile_before_swap(stop: &std::sync::atomic::AtomicBool) -> u64 {
    let mut x = 1u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        for i in 0..100_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn hostile_after_swap() -> u64 {
    spin_forever(2)
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn hostile_deleted_spin() -> u64 {
    spin_forever(3)
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn hostile_early_spin(deadline: &std::time::Instant) -> u64 {
    let mut x = 4u64;
    while std::time::Instant::now() < *deadline {
        for i in 0..100_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

/// `jmp .` on x86-64: a thread sent there spins inside the mapped file.
const SPIN_CODE: [u8; 2] = [0xeb, 0xfe];
const CODE_OFFSET: usize = 0x400;
const PHDR_OFFSET: usize = 0x340;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let exe = std::fs::read_link("/proc/self/exe").expect("own executable");
    match args.get(1).map(String::as_str) {
        Some("fifo") => fifo(&exe),
        Some("deleted") => {
            std::fs::remove_file(&exe).expect("delete own executable");
            println!("deleted");
            hostile_deleted_spin();
        }
        Some("early") => {
            let secs: f64 = args.get(2).and_then(|a| a.parse().ok()).expect("early SECONDS");
            hostile_early_spin(&(std::time::Instant::now() + std::time::Duration::from_secs_f64(secs)));
        }
        Some("mappings") => {
            let n: usize = args.get(2).and_then(|a| a.parse().ok()).expect("mappings N DIR");
            let path = long_path(Path::new(args.get(3).expect("mappings N DIR")));
            let mut page = vec![0u8; 4096];
            page[CODE_OFFSET..CODE_OFFSET + 2].copy_from_slice(&SPIN_CODE);
            std::fs::write(&path, &page).expect("write the mapped file");
            let base = map_exec(&path, 4096, n);
            run_in_mapping(base + CODE_OFFSET);
        }
        Some("bigsym") => {
            let path = Path::new(args.get(2).expect("bigsym DIR")).join("bigsym.so");
            write_bigsym(&path);
            let base = map_exec(&path, 4096, 1);
            run_in_mapping(base + CODE_OFFSET);
        }
        Some(mode @ ("ehframe" | "debugframe")) => {
            let path = Path::new(args.get(2).expect("ehframe|debugframe DIR")).join(format!("{mode}.so"));
            if mode == "ehframe" {
                write_elf(&path, (".eh_frame", 1, 2, 0), &[], EH_FRAME_CLAIM);
            } else {
                let section = debug_frame_bomb();
                write_elf(&path, (".debug_frame", 1, SHF_COMPRESSED, 0), &section, section.len() as u64);
            }
            let base = map_exec(&path, 4096, 1);
            run_in_mapping(base + CODE_OFFSET);
        }
        Some("symflood") => {
            let usage = "symflood FILES SYMBOLS DIR";
            let files: usize = args.get(2).and_then(|a| a.parse().ok()).expect(usage);
            let symbols: usize = args.get(3).and_then(|a| a.parse().ok()).expect(usage);
            let dir = Path::new(args.get(4).expect(usage));
            let image = symflood_elf(symbols);
            let mut bases = Vec::new();
            for i in 0..files {
                let path = dir.join(format!("symflood-{i}.so"));
                std::fs::write(&path, &image).expect("write a symbol-flood file");
                bases.push(map_exec(&path, 4096, 1));
            }
            for &base in &bases[1..] {
                std::thread::spawn(move || run_in_mapping(base + CODE_OFFSET));
            }
            run_in_mapping(bases[0] + CODE_OFFSET);
        }
        Some("jitchain") => {
            let usage = "jitchain FUNCTIONS NAME_BYTES";
            let functions: usize = args.get(2).and_then(|a| a.parse().ok()).expect(usage);
            let name_bytes: usize = args.get(3).and_then(|a| a.parse().ok()).expect(usage);
            jit_chains(functions, name_bytes);
        }
        Some("perfmap") => {
            let lines: usize = args.get(2).and_then(|a| a.parse().ok()).expect("perfmap LINES NAME_BYTES");
            let name_bytes: usize = args.get(3).and_then(|a| a.parse().ok()).expect("perfmap LINES NAME_BYTES");
            // SAFETY: a fresh anonymous mapping, written before it is run.
            let code = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(code, libc::MAP_FAILED);
            let code = code as usize;
            // SAFETY: the page is ours and writable.
            unsafe { std::ptr::copy_nonoverlapping(SPIN_CODE.as_ptr(), (code + CODE_OFFSET) as *mut u8, 2) };
            let mut map = std::io::BufWriter::new(
                std::fs::File::create(format!("/tmp/perf-{}.map", std::process::id())).expect("perf map"),
            );
            // Everything but the spinning code first: a reader that stops early never names it.
            for i in 0..lines {
                let name: String = std::iter::repeat_n(char::from(b'a' + (i % 26) as u8), name_bytes).collect();
                writeln!(map, "{:x} 10 {name}{i}", 0x1000_0000 + i * 16).expect("write perf map");
            }
            writeln!(map, "{:x} 10 hostile_jit_spin", code + CODE_OFFSET).expect("write perf map");
            map.flush().expect("write perf map");
            println!("perf map written");
            let _ = std::io::stdout().flush();
            run_in_mapping(code + CODE_OFFSET);
        }
        _ => {
            eprintln!(
                "usage: hostile-proc fifo|deleted|early SECONDS|mappings N DIR|bigsym DIR|ehframe DIR|debugframe DIR|perfmap LINES NAME_BYTES|symflood FILES SYMBOLS DIR|jitchain FUNCTIONS NAME_BYTES"
            );
            std::process::exit(2);
        }
    }
}

fn fifo(exe: &Path) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let spinner = std::thread::spawn(move || hostile_before_swap(&s));
    println!("spinning");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = spinner.join();
    let moved = exe.with_extension("moved");
    std::fs::rename(exe, &moved).expect("rename own executable");
    let c = std::ffi::CString::new(exe.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    println!("swapped");
    let _ = std::io::stdout().flush();
    hostile_after_swap();
}

/// A file path of about 3,800 characters (components under NAME_MAX) below `dir`.
fn long_path(dir: &Path) -> PathBuf {
    let mut p = dir.to_path_buf();
    while p.as_os_str().len() < 3_700 {
        p.push("d".repeat(200));
    }
    std::fs::create_dir_all(&p).expect("create the long directory");
    p.join("hostile-lib.so")
}

/// Maps the first `len` bytes of `path` readable and executable `n` times; the first address.
fn map_exec(path: &Path, len: usize, n: usize) -> usize {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_CLOEXEC).open(path).expect("open");
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    let mut first = 0;
    for i in 0..n {
        // SAFETY: a fresh shared read-only mapping of a file we opened; never unmapped.
        let at = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_EXEC, libc::MAP_PRIVATE, fd, 0)
        };
        assert_ne!(at, libc::MAP_FAILED, "mmap #{i}: {}", std::io::Error::last_os_error());
        if i == 0 {
            first = at as usize;
        }
    }
    println!("mapped {n}");
    let _ = std::io::stdout().flush();
    first
}

/// Sends this thread into the spinning code at `addr` (x86-64), for good. Not before a second
/// and a half after exec: the profiler's first look at the process is then long past, so what
/// is measured is what it does with the mapping, not how it names a process seen too early.
fn run_in_mapping(addr: usize) -> ! {
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `addr` holds `jmp .` in an executable mapping: the call never returns.
        let f: extern "C" fn() -> ! = unsafe { std::mem::transmute(addr) };
        f()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = addr;
        eprintln!("hostile-proc: spinning inside a mapping needs x86-64");
        std::process::exit(3)
    }
}

/// What the `.eh_frame` of `ehframe` claims: 1,000 MB.
const EH_FRAME_CLAIM: u64 = 1000 << 20;
const SHF_COMPRESSED: u64 = 0x800;

/// An ELF64 of a few KB on disk and 2.4 GB in size (sparse), whose `.symtab` claims 100 M
/// entries, with `jmp .` at `CODE_OFFSET`.
fn write_bigsym(path: &Path) {
    const SYMS: u64 = 100_000_000;
    write_elf(path, (".symtab", 2, 0, 24), &[], 24 * SYMS);
}

/// A `.debug_frame` (an `Elf64_Chdr`, then zlib) that inflates to 60 MiB: a CIE (CFA = rsp + 8,
/// the return address below it), then one FDE over 256 MB of code whose instructions are 21 M
/// one-byte advances, each after a change of the CFA offset: every row differs from the last.
fn debug_frame_bomb() -> Vec<u8> {
    const ROWS: usize = 20 << 20;
    let mut cie = Vec::new();
    cie.extend_from_slice(&0xffff_ffffu32.to_le_bytes()); // CIE id
    cie.extend_from_slice(&[1, 0, 1, 0x78, 16]); // version 1, "", code align 1, data align -8, RA r16
    cie.extend_from_slice(&[0x0c, 7, 8, 0x90, 1]); // def_cfa rsp+8; offset r16 at cfa-8
    while (cie.len() + 4) % 8 != 0 {
        cie.push(0); // DW_CFA_nop
    }
    let mut plain = Vec::new();
    plain.extend_from_slice(&(cie.len() as u32).to_le_bytes());
    plain.extend_from_slice(&cie);
    // Each row: DW_CFA_def_cfa_offset 16 or 24, then DW_CFA_advance_loc 1: three bytes.
    let fde_len = 4 + 8 + 8 + ROWS * 3;
    plain.extend_from_slice(&(fde_len as u32).to_le_bytes());
    plain.extend_from_slice(&0u32.to_le_bytes()); // its CIE at offset 0
    plain.extend_from_slice(&(CODE_OFFSET as u64).to_le_bytes());
    plain.extend_from_slice(&(256u64 << 20).to_le_bytes());
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(&plain).expect("deflate");
    let rows: Vec<u8> = (0..4096).flat_map(|i| [0x0e, if i % 2 == 0 { 16 } else { 24 }, 0x41]).collect();
    for _ in 0..ROWS / 4096 {
        z.write_all(&rows).expect("deflate");
    }
    let inflated = plain.len() + ROWS * 3;
    let mut out = Vec::new();
    out.extend_from_slice(&1u32.to_le_bytes()); // ELFCOMPRESS_ZLIB
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(inflated as u64).to_le_bytes());
    out.extend_from_slice(&8u64.to_le_bytes());
    out.extend_from_slice(&z.finish().expect("deflate"));
    out
}

/// An ELF64 with `jmp .` at `CODE_OFFSET` in `.text`, and one more section at file offset
/// 0x1000: (name, type, flags, entry size), holding `contents` and claiming `size` bytes (the
/// file is made that long, sparse).
fn write_elf(path: &Path, extra: (&str, u32, u64, u64), contents: &[u8], size: u64) {
    let (extra_name, extra_kind, extra_flags, extra_entsize) = extra;
    let names = format!("\0.text\0{extra_name}\0.strtab\0");
    let (text_name, extra_at, strtab_name) = (1u32, 7u32, 8 + extra_name.len() as u32);
    let mut out = Vec::new();
    out.extend_from_slice(b"\x7fELF\x02\x01\x01\0");
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&3u16.to_le_bytes());
    out.extend_from_slice(&62u16.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&(PHDR_OFFSET as u64).to_le_bytes()); // e_phoff
    out.extend_from_slice(&64u64.to_le_bytes()); // e_shoff
    out.extend_from_slice(&0u32.to_le_bytes());
    for v in [64u16, 56, 1, 64, 4, 3] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let mut section = |name: u32, kind: u32, flags: u64, addr: u64, offset: u64, size: u64, link: u32, entsize: u64| {
        out.extend_from_slice(&name.to_le_bytes());
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&addr.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&link.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&8u64.to_le_bytes());
        out.extend_from_slice(&entsize.to_le_bytes());
    };
    section(0, 0, 0, 0, 0, 0, 0, 0);
    // .text (SHF_ALLOC | SHF_EXECINSTR) over the spinning code.
    section(text_name, 1, 6, CODE_OFFSET as u64, CODE_OFFSET as u64, 16, 0, 0);
    section(extra_at, extra_kind, extra_flags, 0, 0x1000, size, 3, extra_entsize); // → .strtab (sh_link 3)
    section(strtab_name, 3, 0, 0, 0x800, 0x40, 0, 0); // .strtab, also the section names
    out.resize(0x1000, 0);
    // One PT_LOAD (read, execute) over the first page: file offsets resolve to addresses.
    let mut phdr = Vec::new();
    phdr.extend_from_slice(&1u32.to_le_bytes());
    phdr.extend_from_slice(&5u32.to_le_bytes());
    for v in [0u64, 0, 0, 0x1000, 0x1000, 0x1000] {
        phdr.extend_from_slice(&v.to_le_bytes());
    }
    out[PHDR_OFFSET..PHDR_OFFSET + phdr.len()].copy_from_slice(&phdr);
    out[0x800..0x800 + names.len()].copy_from_slice(names.as_bytes());
    out[CODE_OFFSET..CODE_OFFSET + 2].copy_from_slice(&SPIN_CODE);
    out.extend_from_slice(contents);
    let mut f = std::fs::File::create(path).expect("create the ELF file");
    f.write_all(&out).expect("write the ELF file");
    f.set_len(0x1000 + size).expect("size the ELF file");
}

/// An ELF64 with `jmp .` at `CODE_OFFSET` in `.text` and a symbol table of `symbols` functions
/// (the first, `hostile_symflood_spin`, over the spinning code), with its string table.
fn symflood_elf(symbols: usize) -> Vec<u8> {
    const SYMTAB_AT: usize = 0x1000;
    let mut strtab = vec![0u8];
    let mut symtab = vec![0u8; 24]; // the null symbol
    for i in 0..symbols {
        let name = strtab.len() as u32;
        if i == 0 {
            strtab.extend_from_slice(b"hostile_symflood_spin\0");
        } else {
            strtab.extend_from_slice(format!("hostile_symflood_{i:07}\0").as_bytes());
        }
        let value = if i == 0 { CODE_OFFSET as u64 } else { 0x2000 + 16 * i as u64 };
        symtab.extend_from_slice(&name.to_le_bytes());
        symtab.extend_from_slice(&[0x12, 0]); // STB_GLOBAL, STT_FUNC
        symtab.extend_from_slice(&1u16.to_le_bytes()); // in .text
        symtab.extend_from_slice(&value.to_le_bytes());
        symtab.extend_from_slice(&16u64.to_le_bytes());
    }
    let names = "\0.text\0.symtab\0.strtab\0.shstrtab\0";
    let strtab_at = SYMTAB_AT + symtab.len();
    let mut out = Vec::new();
    out.extend_from_slice(b"\x7fELF\x02\x01\x01\0");
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&3u16.to_le_bytes());
    out.extend_from_slice(&62u16.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&(PHDR_OFFSET as u64).to_le_bytes());
    out.extend_from_slice(&64u64.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for v in [64u16, 56, 1, 64, 5, 4] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    // (name, type, flags, addr, offset, size, link, info, entsize)
    type Section = (u32, u32, u64, u64, u64, u64, u32, u32, u64);
    let sections: [Section; 5] = [
        (0, 0, 0, 0, 0, 0, 0, 0, 0),
        (1, 1, 6, CODE_OFFSET as u64, CODE_OFFSET as u64, 16, 0, 0, 0),
        (7, 2, 0, 0, SYMTAB_AT as u64, symtab.len() as u64, 3, 1, 24),
        (15, 3, 0, 0, strtab_at as u64, strtab.len() as u64, 0, 0, 0),
        (23, 3, 0, 0, 0x800, names.len() as u64, 0, 0, 0),
    ];
    for (name, kind, flags, addr, offset, size, link, info, entsize) in sections {
        out.extend_from_slice(&name.to_le_bytes());
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&addr.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&link.to_le_bytes());
        out.extend_from_slice(&info.to_le_bytes());
        out.extend_from_slice(&8u64.to_le_bytes());
        out.extend_from_slice(&entsize.to_le_bytes());
    }
    out.resize(SYMTAB_AT, 0);
    let mut phdr = Vec::new();
    phdr.extend_from_slice(&1u32.to_le_bytes());
    phdr.extend_from_slice(&5u32.to_le_bytes());
    for v in [0u64, 0, 0, 0x1000, 0x1000, 0x1000] {
        phdr.extend_from_slice(&v.to_le_bytes());
    }
    out[PHDR_OFFSET..PHDR_OFFSET + phdr.len()].copy_from_slice(&phdr);
    out[0x800..0x800 + names.len()].copy_from_slice(names.as_bytes());
    out[CODE_OFFSET..CODE_OFFSET + 2].copy_from_slice(&SPIN_CODE);
    out.extend_from_slice(&symtab);
    out.extend_from_slice(&strtab);
    out
}

/// One JIT function (x86-64, 34 bytes), called with `rdi` pointing at a zero-terminated list of
/// function addresses: it keeps a frame (`push rbp; mov rbp, rsp`), calls the next one in the
/// list, or, at the end of the list, counts down from 200,000 (about 0.1 ms) and returns.
const JIT_FUNCTION: [u8; 34] = [
    0x55, // push rbp
    0x48, 0x89, 0xe5, // mov rbp, rsp
    0x48, 0x8b, 0x07, // mov rax, [rdi]
    0x48, 0x83, 0xc7, 0x08, // add rdi, 8
    0x48, 0x85, 0xc0, // test rax, rax
    0x74, 0x04, // jz leaf
    0xff, 0xd0, // call rax
    0x5d, // pop rbp
    0xc3, // ret
    0x48, 0xc7, 0xc1, 0x40, 0x0d, 0x03, 0x00, // leaf: mov rcx, 200000
    0x48, 0xff, 0xc9, // dec rcx
    0x75, 0xfb, // jnz dec
    0x5d, // pop rbp
    0xc3, // ret
];

/// `jitchain`: `functions` JIT functions 64 bytes apart, a perf map naming each with
/// `name_bytes` characters, then random chains of 126 of them, for good.
fn jit_chains(functions: usize, name_bytes: usize) -> ! {
    let len = (functions * 64).next_multiple_of(4096);
    // SAFETY: a fresh anonymous mapping, written before it is run.
    let code = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(code, libc::MAP_FAILED);
    let code = code as usize;
    let mut map = std::io::BufWriter::new(
        std::fs::File::create(format!("/tmp/perf-{}.map", std::process::id())).expect("perf map"),
    );
    for i in 0..functions {
        let at = code + i * 64;
        // SAFETY: inside the mapping, which is ours and writable.
        unsafe { std::ptr::copy_nonoverlapping(JIT_FUNCTION.as_ptr(), at as *mut u8, JIT_FUNCTION.len()) };
        let name: String = std::iter::repeat_n(char::from(b'a' + (i % 26) as u8), name_bytes).collect();
        writeln!(map, "{at:x} 40 {name}{i}").expect("write perf map");
    }
    map.flush().expect("write perf map");
    println!("jit written");
    let _ = std::io::stdout().flush();
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    #[cfg(target_arch = "x86_64")]
    {
        let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
        let mut chain = [0u64; 127];
        loop {
            for slot in chain.iter_mut().take(126) {
                // xorshift64
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *slot = (code + (state % functions as u64) as usize * 64) as u64;
            }
            // SAFETY: every address holds a JIT function, and the list ends with 0.
            let entry: extern "C" fn(*const u64) = unsafe { std::mem::transmute(chain[0] as usize) };
            entry(chain[1..].as_ptr());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        eprintln!("hostile-proc: JIT chains need x86-64");
        std::process::exit(3)
    }
}
