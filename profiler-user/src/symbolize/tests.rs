//! Tests of the symbolizer as a whole (each part has its own in its file).

use super::*;
use std::{fs::File, os::fd::AsRawFd, path::PathBuf};

#[inline(never)]
#[unsafe(no_mangle)]
extern "C" fn profiler_symbolize_test_marker() -> u64 {
    std::hint::black_box(42)
}

#[test]
fn stack_cache_is_bounded_in_bytes_and_keeps_what_is_used() {
    let mut s = Symbolizer::new();
    let hot = [0xffff_ffff_8100_0000u64];
    s.stack(0, "k", &hot, &[]);
    let limit = crate::memory::STACKS.limit();
    // Each one-frame stack is one frame and a slot: past the pool's bytes several times over.
    let n = 3 * limit / memory::stack_bytes(&s.stack(0, "k", &hot, &[]));
    for i in 0..n {
        s.stack(0, "k", &[0xffff_ffff_8200_0000 + i], &[]);
        if i % 500 == 0 {
            s.stack(0, "k", &hot, &[]);
        }
    }
    assert!(s.stack_bytes <= limit, "{} bytes cached, {limit} allowed", s.stack_bytes);
    assert!(s.stats().stacks < n as usize / 2, "{} of {n} stacks cached", s.stats().stacks);
    assert_eq!(crate::memory::STACKS.used(), s.stack_bytes, "the pool is told what the cache holds");
    // Used now and then: still cached.
    let hits = s.stats().stack_hits;
    s.stack(0, "k", &hot, &[]);
    assert_eq!(s.stats().stack_hits, hits + 1);
    // Stacks shown twice outlast a stream of stacks shown once (S3-FIFO): the one-offs a busy
    // node shows all the time pass through without pushing out the stacks it keeps showing.
    // (A least-recently-used cache loses every one of them here.)
    let warm: Vec<u64> = (0..1_000).map(|i| 0xffff_ffff_8300_0000 + i).collect();
    for _ in 0..2 {
        for &a in &warm {
            s.stack(0, "k", &[a], &[]);
        }
    }
    for i in 0..n {
        s.stack(0, "k", &[0xffff_ffff_8400_0000 + i], &[]);
    }
    let hits = s.stats().stack_hits;
    for &a in &warm {
        s.stack(0, "k", &[a], &[]);
    }
    let kept = s.stats().stack_hits - hits;
    assert!(kept >= 900, "{kept} of 1,000 stacks shown twice still cached");
}

/// The key says where the kernel frames end and the Python words begin: the same addresses
/// split another way are another stack.
#[test]
fn a_stack_key_tells_how_its_addresses_split() {
    let mut s = Symbolizer::new();
    let keys = [
        s.stack_hash(&[1, 2], &[], &[]),
        s.stack_hash(&[1], &[2], &[]),
        s.stack_hash(&[], &[1, 2], &[]),
        s.stack_hash(&[], &[1], &[2]),
        s.stack_hash(&[], &[], &[1, 2]),
        s.stack_hash(&[], &[2, 1], &[]),
    ];
    let distinct: std::collections::HashSet<u128> = keys.iter().copied().collect();
    assert_eq!(distinct.len(), keys.len());
    assert_eq!(s.stack_hash(&[1], &[2], &[3]), s.stack_hash(&[1], &[2], &[3]), "and is the same each time");
}

#[test]
fn resolves_a_function_of_this_process() {
    let mut s = Symbolizer::new();
    let addr = profiler_symbolize_test_marker as *const () as u64;
    let pid = std::process::id();
    let stack = s.stack(pid, "test", &[], &[addr]);
    assert_eq!(stack.user_len, 1);
    assert_eq!(&*stack.frames[0], "profiler_symbolize_test_marker");
    // The second lookup is a cache hit and returns the same stack.
    let again = s.stack(pid, "test", &[], &[addr]);
    assert!(Arc::ptr_eq(&stack, &again));
    assert_eq!(s.stats().stack_hits, 1);
}

#[test]
fn unmapped_address_is_unknown() {
    let mut s = Symbolizer::new();
    let stack = s.stack(std::process::id(), "test", &[], &[8]);
    assert_eq!(&*stack.frames[0], UNKNOWN);
}

#[test]
fn roots_first_user_then_kernel() {
    let mut s = Symbolizer::new();
    let a = profiler_symbolize_test_marker as *const () as u64;
    // Leaf-first input: user [leaf, caller], kernel [leaf].
    let stack = s.stack(std::process::id(), "t", &[1], &[a, 8]);
    assert_eq!(stack.user_len, 2);
    assert_eq!(&*stack.frames[0], UNKNOWN);
    assert_eq!(&*stack.frames[1], "profiler_symbolize_test_marker");
    assert_eq!(stack.kernel().len(), 1);
}

/// Our open file descriptors on `path` (tests run in parallel: count only this file).
fn open_fds_on(path: &str) -> usize {
    let fds = std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd");
    fds.flatten().filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.to_str() == Some(path))).count()
}

/// The mapping of `pid`'s executable text, once exec has mapped it.
fn text_of(pid: u32, name: &str) -> maps::Mapping {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        if let Some(m) = maps::parse(&maps).into_iter().find(|m| m.is_file() && m.path.contains(name)) {
            return m;
        }
        assert!(Instant::now() < deadline, "{name} never mapped its binary");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Processes mapping one file name it with one `Arc`: the store's dictionary finds a frame's
/// file by its pointer, and the path is held once.
#[test]
fn processes_mapping_one_file_share_its_path() {
    let mut s = Symbolizer::new();
    let mut children: Vec<_> =
        (0..2).map(|_| std::process::Command::new("sleep").arg("30").spawn().expect("sleep runs")).collect();
    let files: Vec<Arc<str>> = children
        .iter()
        .map(|c| {
            let text = text_of(c.id(), "sleep");
            let stack = s.stack(c.id(), "sleep", &[], &[text.start + 16]);
            stack.locations[0].file.clone()
        })
        .collect();
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(files[0].contains("sleep"), "{}", files[0]);
    assert!(Arc::ptr_eq(&files[0], &files[1]), "one path for both processes");
}

#[test]
fn exited_processes_and_their_modules_are_forgotten() {
    let mut s = Symbolizer::new();
    let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep runs");
    let pid = child.id();
    // An address inside the child's executable text.
    let text = text_of(pid, "sleep");
    s.stack(pid, "sleep", &[], &[text.start + 16]);
    assert_eq!(s.stats().processes, 1);
    assert!(s.stats().modules >= 1);
    // Ours (checked, the path blazesym opens by) and blazesym's own.
    assert_eq!(open_fds_on(&text.path), 2, "the binary is held open while it is cached");

    // Alive and recently sampled: kept by a sweep.
    s.sweep(Instant::now());
    assert_eq!(s.stats().processes, 1);

    child.kill().expect("kill sleep");
    child.wait().expect("reap sleep");
    // Within the grace period its late samples still resolve.
    s.sweep(Instant::now());
    assert_eq!(s.stats().processes, 1);
    // After it, the process, its modules, their names and the open file are gone.
    s.sweep(Instant::now() + EXITED_GRACE + Duration::from_secs(1));
    let st = s.stats();
    assert_eq!((st.processes, st.modules, st.stacks), (0, 0, 0));
    assert_eq!(st.processes_evicted, 1);
    assert!(st.modules_evicted >= 1);
    assert_eq!(open_fds_on(&text.path), 0, "the evicted binary's file is closed");
}

/// The stack cache is walked only when an image it may hold stacks of is gone: one made since
/// the last walk, or one that walk kept. Both kinds of exit must take their stacks with them.
#[test]
fn the_stacks_of_a_process_that_outlived_a_walk_go_when_it_exits() {
    let mut s = Symbolizer::new();
    let spawn = || std::process::Command::new("sleep").arg("30").spawn().expect("sleep runs");
    let (mut kept, mut gone) = (spawn(), spawn());
    for c in [&kept, &gone] {
        let text = text_of(c.id(), "sleep");
        s.stack(c.id(), "sleep", &[], &[text.start + 16]);
    }
    assert_eq!(s.stats().stacks, 2);
    let now = Instant::now();
    gone.kill().expect("kill sleep");
    gone.wait().expect("reap sleep");
    // A walk: `gone` was made since the last (none), and is gone; `kept` stays, in the walk.
    s.sweep(now + EXITED_GRACE + Duration::from_secs(1));
    assert_eq!((s.stats().processes, s.stats().stacks), (1, 1));
    kept.kill().expect("kill sleep");
    kept.wait().expect("reap sleep");
    // No image made since: only `kept` being in the last walk says to walk again.
    s.sweep(now + 2 * (EXITED_GRACE + PROCESS_TTL));
    assert_eq!((s.stats().processes, s.stats().stacks), (0, 0));
}

#[test]
fn process_cache_is_bounded() {
    let mut s = Symbolizer::new();
    let me = std::process::id();
    // Pids that do not exist (above pid_max) but were sampled just now.
    let t0 = Instant::now();
    for pid in 0..(MAX_PROCESSES as u32 + 100) {
        s.note_process(u32::MAX - pid, "ghost", t0 + Duration::from_micros(pid.into()));
    }
    let t1 = t0 + Duration::from_secs(1);
    s.note_process(me, "test", t1);
    s.sweep(t1);
    assert!(s.stats().processes <= MAX_PROCESSES, "{} cached", s.stats().processes);
    assert!(s.processes.contains_key(&me), "the most recently sampled process is kept");
}

#[test]
fn a_stack_with_an_unnamed_frame_is_not_cached_for_good() {
    let mut s = Symbolizer::new();
    let me = std::process::id();
    let named = profiler_symbolize_test_marker as *const () as u64;
    s.stack(me, "test", &[], &[named]);
    s.stack(me, "test", &[], &[8, named]);
    let image = s.processes[&me].image;
    let mut key = |addrs: &[u64]| (image, s.stack_hash(&[], addrs, &[]));
    let (final_key, k) = (key(&[named]), key(&[8, named]));
    assert!(s.stacks.peek(&final_key).unwrap().until.is_none(), "a named stack is final");
    assert!(s.stacks.peek(&k).unwrap().until.is_some(), "an unnamed frame is provisional");
    // Once its time is up, the stack is resolved again (a miss), not answered from the cache.
    s.stacks.get_mut(&k).unwrap().until = Some(Instant::now() - Duration::from_millis(1));
    let misses = s.stats().stack_misses;
    s.stack(me, "test", &[], &[8, named]);
    assert_eq!(s.stats().stack_misses, misses + 1);
}

#[test]
fn a_module_is_held_open_by_fd_not_by_the_path_its_owner_controls() {
    let mut s = Symbolizer::new();
    let me = std::process::id();
    let addr = profiler_symbolize_test_marker as *const () as u64;
    s.stack(me, "test", &[], &[addr]);
    let m = &s.processes[&me].maps;
    let text = maps::find(m, addr).unwrap();
    let module = &s.modules[&(text.dev, text.inode)];
    let (_, path) = module.file.as_ref().expect("opened");
    assert!(path.starts_with("/proc/self/fd/"), "{}", path.display());
    assert_eq!(s.stats().files_refused, 0);
}

#[test]
fn past_the_open_file_bound_a_file_is_refused_counted_and_named_by_module() {
    let mut s = Symbolizer::new();
    for i in 0..MAX_OPEN_FILES as u64 {
        let f = File::open("/dev/null").unwrap();
        let path = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
        let fake = Mapping { start: 0, end: 1, offset: 0, dev: u64::MAX, inode: i, path: Arc::from("/dev/null") };
        let mut module = Module::unopened(&fake);
        module.file = Some((f, path));
        s.modules.insert((u64::MAX, i), module);
    }
    let me = std::process::id();
    let addr = profiler_symbolize_test_marker as *const () as u64;
    let stack = s.stack(me, "test", &[], &[addr]);
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let base = exe.file_name().unwrap().to_string_lossy();
    // Not opened, so no segments: the file offset stands in for the virtual address.
    let offset = maps::find(&s.processes[&me].maps, addr).unwrap().file_offset(addr);
    assert_eq!(&*stack.frames[0], module_offset(&base, offset));
    assert_eq!(s.stats().files_refused, 1);
}

/// A small C program built for a test in `dir`: `full` with its symbols, `stripped`, and
/// `linked` (stripped, with a `.gnu_debuglink` to `linked.debug` beside it). None without gcc
/// and binutils (said on stderr).
pub(super) struct Built {
    pub full: PathBuf,
    pub stripped: PathBuf,
    pub linked: PathBuf,
    pub debug: PathBuf,
}

pub(super) const C_HOT: &str = "symbolize_test_hot_loop";

/// Builds the C program in `dir`: `None` (said by the skip rule, a failure under CI) when gcc,
/// strip or objcopy is not installed (`cargo xtask test` installs Debian's gcc and binutils);
/// a panic when one is and fails.
pub(super) fn build_c_program(dir: &std::path::Path) -> Option<Built> {
    let src = dir.join("prog.c");
    std::fs::write(
        &src,
        format!(
            "#include <stdlib.h>\n#include <time.h>\n\
             __attribute__((noinline)) unsigned long {C_HOT}(unsigned long n) {{\n\
             volatile unsigned long x = 0; for (unsigned long i = 0; i < n; i++) x += i; return x; }}\n\
             int main(int argc, char **argv) {{ time_t end = time(NULL) + atoi(argv[1]); unsigned long s = 0;\n\
             while (time(NULL) < end) s += {C_HOT}(100000); return s == 42; }}\n"
        ),
    )
    .unwrap();
    let run = |cmd: &mut std::process::Command| match cmd.status() {
        Ok(st) => {
            assert!(st.success(), "{cmd:?}: {st}");
            true
        }
        Err(e) => profiler_common::test_skip::skip(&format!(
            "the symbolizer's C test program: {:?} cannot run ({e}); `cargo xtask test` installs Debian's gcc and binutils",
            cmd.get_program()
        )),
    };
    let b = Built {
        full: dir.join("prog-full"),
        stripped: dir.join("prog"),
        linked: dir.join("linked"),
        debug: dir.join("linked.debug"),
    };
    let ok = run(std::process::Command::new("gcc").args(["-O1", "-o"]).arg(&b.full).arg(&src))
        && run(std::process::Command::new("strip").arg("-o").arg(&b.stripped).arg(&b.full))
        && run(std::process::Command::new("strip").arg("-o").arg(&b.linked).arg(&b.full))
        && run(std::process::Command::new("objcopy").arg("--only-keep-debug").arg(&b.full).arg(&b.debug))
        && run(std::process::Command::new("objcopy")
            .current_dir(dir)
            .arg("--add-gnu-debuglink=linked.debug")
            .arg(&b.linked));
    ok.then_some(b)
}

/// The ELF virtual address of `name` in `path`'s symbol table.
fn symbol_vaddr(path: &std::path::Path, name: &str) -> u64 {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.symbols().find(|s| s.name() == Ok(name)).map(|s| s.address()).expect("symbol in the full build")
}

/// A child process killed and reaped when dropped, however the test ends.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `exe` and returns it with the run-time address of ELF virtual address `vaddr` in it.
fn run_and_locate(exe: &std::path::Path, vaddr: u64) -> (Running, u64) {
    let child = Running(std::process::Command::new(exe).arg("20").spawn().expect("run the program"));
    let pid = child.0.id();
    let deadline = Instant::now() + Duration::from_secs(5);
    let exe_str = exe.to_str().unwrap();
    loop {
        let maps = maps::read(pid, None).maps;
        if let Some(text) = maps.iter().find(|m| &*m.path == exe_str) {
            let f = File::open(exe).unwrap();
            let info = file::check_elf(&f, f.metadata().unwrap().len()).unwrap();
            let load = info.loads.iter().find(|l| l.vaddr <= vaddr && vaddr - l.vaddr < l.size).unwrap();
            let offset = vaddr - load.vaddr + load.offset;
            assert!(offset >= text.offset && offset - text.offset < text.end - text.start, "not in the text mapping");
            return (child, text.start + offset - text.offset);
        }
        assert!(Instant::now() < deadline, "{exe_str} never mapped");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_stripped_program_is_named_by_module_offset_and_through_its_debug_link() {
    let dir = tempfile::tempdir().unwrap();
    let Some(b) = build_c_program(dir.path()) else { return };
    let vaddr = symbol_vaddr(&b.full, C_HOT);
    let mut s = Symbolizer::new();
    for (exe, want) in [(&b.stripped, format!("prog+0x{:x}", vaddr + 4)), (&b.linked, C_HOT.to_string())] {
        let (child, addr) = run_and_locate(exe, vaddr + 4);
        let pid = child.0.id();
        let stack = s.stack(pid, "prog", &[], &[addr]);
        drop(child);
        assert_eq!(&*stack.frames[0], want, "{}", exe.display());
        // A module+offset name is final: the file is the one mapped and names nothing there.
        let key = (s.processes[&pid].image, s.stack_hash(&[], &[addr], &[]));
        assert!(s.stacks.peek(&key).unwrap().until.is_none());
    }
}

/// Maps read as a process exec'd stay "just read" past a frame that points nowhere (a walk
/// that made one up before the loader mapped what the next frames need): the next address
/// outside them re-reads them at once, so a library mapped in between is named, not
/// `[unknown]` until the next periodic read. What the loader maps then is not a `dlopen`.
/// The times are given, not waited for: the re-reads depend on them alone.
#[test]
fn a_made_up_frame_after_exec_does_not_stop_the_next_reread() {
    use std::io::Write as _;
    let mut child = std::process::Command::new("python3")
        .args(["-c", "import sys; sys.stdin.readline(); import _ctypes; print(1, flush=True); sys.stdin.readline()"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let pid = child.id();
    let mut s = Symbolizer::new();
    text_of(pid, "python3");
    s.note_exec(pid, "python3");
    let loaded = s.processes[&pid].loaded_at;
    let at = |ms| loaded + Duration::from_millis(ms);
    // A made-up frame: the re-read finds nothing there.
    assert!(Arc::ptr_eq(&s.user_frame(pid, 0x10, at(10)).0, &s.unknown));
    // Then the library the next frame is in is mapped.
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin).expect("the child reads");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().expect("stdout")), &mut line)
        .expect("the child imported _ctypes");
    let lib = text_of(pid, "_ctypes");
    let (name, location) = s.user_frame(pid, lib.start + 16, at(20));
    let _ = child.kill();
    let _ = child.wait();
    assert!(!Arc::ptr_eq(&name, &s.unknown), "{name}: not read again 10 ms after a re-read");
    assert!(location.file.contains("_ctypes"), "{}", location.file);
    assert_eq!(s.take_mapped(), None, "mapped within its first second: counted as the loader's, not a dlopen");
}
