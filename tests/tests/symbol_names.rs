//! Names for code that has none of its own, end to end with the real daemon: a stripped C
//! program shows `prog+0xVADDR` (the address `addr2line` takes), the same program named again
//! through its separate debug file (by build id under `/usr/lib/debug/.build-id`, and by
//! `.gnu_debuglink`) and through MiniDebugInfo (`.gnu_debugdata`); and Node's JIT-compiled
//! JavaScript named from its perf map (`--perf-basic-prof`).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{Daemon, Kill, folded_window, now_secs, privileged, profiler, skip, wait_for};

const HOT: &str = "symprog_hot_loop";

const PROGRAM: &str = r#"
#include <stdlib.h>
#include <time.h>

/* Never inlined, so it is a frame of its own; volatile, so the loop is not folded. */
__attribute__((noinline)) unsigned long symprog_hot_loop(unsigned long n) {
    volatile unsigned long x = 0;
    for (unsigned long i = 0; i < n; i++) x += i * 7;
    return x;
}

int main(int argc, char **argv) {
    time_t end = time(NULL) + (argc > 1 ? atoi(argv[1]) : 5);
    unsigned long s = 0;
    while (time(NULL) < end) s += symprog_hot_loop(1000000);
    return s == 42;
}
"#;

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A file this test installed, removed when the test ends however it ends.
struct Installed(PathBuf);

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        // Its directory too, unless something else is in it.
        let _ = self.0.parent().map(std::fs::remove_dir);
    }
}

/// Builds the program in `dir`: `symprog-full` with its symbols, and stripped copies
/// `symprog` (nothing), `symprog-link` (a `.gnu_debuglink` to a debug file beside it) and
/// `symprog-mini` (MiniDebugInfo, as Fedora builds it); and `symprog-bid`, built with a build
/// id of its own, whose debug file goes where distributions install theirs
/// (`/usr/lib/debug/.build-id/xx/yyyy.debug`), removed when the returned guard drops.
fn build(dir: &Path) -> Option<(PathBuf, Installed)> {
    for tool in ["gcc", "strip", "objcopy", "xz", "nm"] {
        if Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
            skip(&format!("symbol_names: `{tool}` is not installed"));
            return None;
        }
    }
    let src = dir.join("symprog.c");
    std::fs::write(&src, PROGRAM).unwrap();
    let full = dir.join("symprog-full");
    // Frame pointers: the kernel walks user stacks by them.
    run(Command::new("gcc").args(["-O1", "-g", "-fno-omit-frame-pointer", "-o"]).arg(&full).arg(&src));
    let stripped = |name: &str| {
        let p = dir.join(name);
        run(Command::new("strip").arg("-o").arg(&p).arg(&full));
        p
    };
    stripped("symprog");
    let link = stripped("symprog-link");
    run(Command::new("objcopy").arg("--only-keep-debug").arg(&full).arg(dir.join("symprog-link.debug")));
    // objcopy finds the debug file by the name it is given: run it in `dir`.
    run(Command::new("objcopy").current_dir(dir).arg("--add-gnu-debuglink=symprog-link.debug").arg(&link));
    // MiniDebugInfo: the function symbols .dynsym lacks, in an ELF file of symbols only,
    // xz-compressed into the stripped binary's .gnu_debugdata (the recipe of gdb's manual).
    let mini = stripped("symprog-mini");
    let nm = Command::new("nm").args(["--format=posix", "--defined-only"]).arg(&full).output().unwrap();
    let funcs: String = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (name, kind) = (f.next()?, f.next()?);
            matches!(kind, "T" | "t").then(|| format!("{name}\n"))
        })
        .collect();
    let keep = dir.join("funcsyms");
    std::fs::write(&keep, funcs).unwrap();
    let debug = dir.join("mini.debug");
    run(Command::new("objcopy")
        .args(["--only-keep-debug", "--strip-debug", "--remove-section", ".comment"])
        .arg(format!("--keep-symbols={}", keep.display()))
        .arg(&full)
        .arg(&debug));
    run(Command::new("xz").arg("-f").arg(&debug));
    run(Command::new("objcopy").arg(format!("--add-section=.gnu_debugdata={}.xz", debug.display())).arg(&mini));
    // Unique, so that no other build's debug file is found, nor ours for another build.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let id = format!("{:024x}{:08x}", nanos, std::process::id());
    let bid_full = dir.join("symprog-bid-full");
    run(Command::new("gcc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", &format!("-Wl,--build-id=0x{id}"), "-o"])
        .arg(&bid_full)
        .arg(&src));
    run(Command::new("strip").arg("-o").arg(dir.join("symprog-bid")).arg(&bid_full));
    let by_id = PathBuf::from(format!("/usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]));
    std::fs::create_dir_all(by_id.parent().unwrap()).unwrap();
    let installed = Installed(by_id.clone());
    run(Command::new("objcopy").arg("--only-keep-debug").arg(&bid_full).arg(&by_id));
    Some((full, installed))
}

/// The folded stacks of process `pid` from `from` until now.
fn stacks_of(data: &Path, pid: u32, from: f64) -> Vec<(String, u64)> {
    folded_window(data.to_str().unwrap(), from, now_secs(), &["--pid", &pid.to_string()]).unwrap_or_default()
}

/// Waits until `pid` has at least `n` samples whose leaf satisfies `leaf`; returns its stacks.
fn wait_leaf(data: &Path, pid: u32, from: f64, what: &str, leaf: impl Fn(&str) -> bool) -> Vec<(String, u64)> {
    wait_for(what, Duration::from_secs(30), || {
        let stacks = stacks_of(data, pid, from);
        let hits: u64 = stacks.iter().filter(|(s, _)| s.rsplit(';').next().is_some_and(&leaf)).map(|(_, c)| c).sum();
        (hits >= 5).then_some(stacks)
    })
}

#[test]
fn a_stripped_program_is_named_by_module_offset_or_its_debug_info() {
    if !privileged("a_stripped_program_is_named_by_module_offset_or_its_debug_info") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some((full, _installed)) = build(tmp.path()) else { return };
    let (_dtmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--frequency", "99"]);
    let started = now_secs();
    let spawn = |name: &str| Kill(Command::new(tmp.path().join(name)).arg("8").spawn().expect("run the program"));
    let (plain, link, mini, bid) =
        (spawn("symprog"), spawn("symprog-link"), spawn("symprog-mini"), spawn("symprog-bid"));

    // Stripped, nothing else: the hot loop's frames are `symprog+0xVADDR`, never `[unknown]`.
    let stacks = wait_leaf(&data, plain.0.id(), started, "symprog+0x… leaf frames", |f| f.starts_with("symprog+0x"));
    eprintln!("symprog (stripped):\n{}", show(&stacks));
    let leaf = stacks.iter().max_by_key(|(_, c)| *c).unwrap().0.rsplit(';').next().unwrap().to_string();
    assert!(leaf.starts_with("symprog+0x"), "the hottest leaf is {leaf}:\n{}", show(&stacks));
    // Every stack through the program's own code names it; a sample taken in the kernel while
    // the loader was still mapping libraries (an `open` at exec) may precede the maps the
    // symbolizer read, and is not what this checks (a loaded machine showed one such).
    let unknown: Vec<&(String, u64)> = stacks
        .iter()
        .filter(|(s, _)| s.split(';').any(|f| f.starts_with("symprog+0x")))
        .filter(|(s, _)| s.split(';').skip(1).any(|f| f == "[unknown]"))
        .collect();
    assert!(unknown.is_empty(), "an address in a mapped file shows as [unknown]: {unknown:?}\n{}", show(&stacks));
    // The address is one addr2line takes: on the unstripped build it names the hot loop.
    let vaddr = leaf.trim_start_matches("symprog+");
    let out = Command::new("addr2line").args(["-f", "-e"]).arg(&full).arg(vaddr).output().unwrap();
    let named = String::from_utf8_lossy(&out.stdout);
    assert_eq!(named.lines().next(), Some(HOT), "addr2line -f -e symprog-full {vaddr}: {named}");

    // A debug file by build id, one by debug link beside the binary, and MiniDebugInfo: named.
    for (what, p) in [("symprog-bid", &bid), ("symprog-link", &link), ("symprog-mini", &mini)] {
        let stacks = wait_leaf(&data, p.0.id(), started, &format!("{HOT} named in {what}"), |f| f == HOT);
        eprintln!("{what}:\n{}", show(&stacks));
        assert!(stacks.iter().any(|(s, _)| s.contains(&format!(";main;{HOT}"))), "{what}:\n{}", show(&stacks));
    }

    // perf script as perf prints it (issue 14 A3): a named frame with its file and the
    // function's address there (what `nm` says of the unstripped build, linked alike), an
    // unnamed one as `[unknown] (file)` at its own address, the period of 99 Hz in ns.
    let hot_addr = {
        let nm = Command::new("nm").arg(&full).output().unwrap();
        let text = String::from_utf8_lossy(&nm.stdout).into_owned();
        let line = text.lines().find(|l| l.ends_with(&format!(" {HOT}"))).expect("nm lists the hot loop").to_string();
        u64::from_str_radix(line.split(' ').next().unwrap(), 16).unwrap()
    };
    let script = |pid: u32| {
        let (from, pid) = (format!("{started:.3}"), pid.to_string());
        let args =
            ["export", "--format", "perf-script", "--data-dir", data.to_str().unwrap(), "--from", &from, "--pid", &pid];
        let out = profiler(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let text = script(link.0.id());
    let file = tmp.path().join("symprog-link");
    let want = format!("{hot_addr:>16x} {HOT} ({})", file.display());
    assert!(text.lines().any(|l| l.trim_start_matches('\t') == want), "no line `{want}` in\n{}", head(&text));
    assert!(text.lines().any(|l| l.ends_with(": 10101010 cpu-clock: ")), "period of 99 Hz:\n{}", head(&text));
    // FlameScope's rule (app/common/libtype.py): a file starting with `[` is kernel code.
    // An address in no mapping the symbolizer read (a sample at exec, while the loader maps, as
    // above) is `0 [unknown] ([unknown])`, perf's own line for it: one in six runs had one.
    for l in text.lines().filter(|l| l.starts_with('\t') && !l.ends_with("([kernel.kallsyms])")) {
        let file = l.rsplit_once(" (").map(|(_, f)| f.trim_end_matches(')')).unwrap_or("");
        let unmapped = l.trim_start() == "0 [unknown] ([unknown])";
        assert!(!file.starts_with('[') || unmapped, "a user frame FlameScope would colour kernel: {l}");
    }
    let text = script(plain.0.id());
    let unnamed = format!(" [unknown] ({})", tmp.path().join("symprog").display());
    let vaddr = u64::from_str_radix(vaddr.trim_start_matches("0x"), 16).unwrap();
    assert!(
        text.lines().any(|l| l.ends_with(&unnamed) && l.trim_start().starts_with(&format!("{vaddr:x} "))),
        "no `{vaddr:x}{unnamed}` in\n{}",
        head(&text)
    );
    drop((plain, link, mini, bid));
    assert!(daemon.stop().success(), "{}", daemon.log_text());
}

#[test]
fn node_jit_functions_are_named_from_its_perf_map() {
    if !privileged("node_jit_functions_are_named_from_its_perf_map") {
        return;
    }
    let node = Path::new("/usr/bin/node");
    if !node.exists() {
        skip("node_jit_functions_are_named_from_its_perf_map: /usr/bin/node is not installed");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("hot.js");
    std::fs::write(
        &script,
        "function profilerJitHotLoop(n) {\n  let x = 0;\n  for (let i = 0; i < n; i++) x = (x + i * 7) % 1000003;\n  \
         return x;\n}\nconst end = Date.now() + 10000;\nlet s = 0;\n\
         while (Date.now() < end) s += profilerJitHotLoop(200000);\nconsole.log(s > 0 ? 'done' : 'zero');\n",
    )
    .unwrap();
    let (_dtmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--frequency", "99"]);
    let started = now_secs();
    // In the temporary directory: with --perf-basic-prof Node also writes a V8 log to its
    // working directory.
    let child = Kill(
        Command::new(node)
            .arg("--perf-basic-prof")
            .arg(&script)
            .current_dir(tmp.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("run node"),
    );
    let pid = child.0.id();
    let stacks = wait_leaf(&data, pid, started, "profilerJitHotLoop named in node's samples", |f| {
        f.contains("profilerJitHotLoop")
    });
    eprintln!("node:\n{}", show(&stacks));
    let total: u64 = stacks.iter().map(|(_, c)| c).sum();
    let named: u64 = stacks.iter().filter(|(s, _)| s.contains("JS:*profilerJitHotLoop")).map(|(_, c)| c).sum();
    eprintln!("{named} of node's {total} samples in the optimized profilerJitHotLoop");
    drop(child);
    // Node leaves its map in /tmp when it exits.
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    assert!(named > 0, "no frame named JS:*profilerJitHotLoop:\n{}", show(&stacks));
    assert!(daemon.stop().success(), "{}", daemon.log_text());
}

/// The stacks, most frequent first, for a failure message or the log: the comm and the leaf
/// end of each (Node's are 30 frames deep).
fn head(text: &str) -> String {
    text.lines().take(40).collect::<Vec<_>>().join("\n")
}

fn show(stacks: &[(String, u64)]) -> String {
    let mut s: Vec<&(String, u64)> = stacks.iter().collect();
    s.sort_by_key(|(_, c)| std::cmp::Reverse(*c));
    let short = |st: &str| {
        let frames: Vec<&str> = st.split(';').collect();
        match frames.len() {
            0..=6 => st.to_string(),
            n => format!("{};…;{}", frames[0], frames[n - 4..].join(";")),
        }
    };
    s.iter().take(12).map(|(st, c)| format!("  {} {c}\n", short(st))).collect()
}
