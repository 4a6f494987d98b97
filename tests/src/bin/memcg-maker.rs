//! Makes zombie memory cgroups the way a crash-looping agent does: for each one, create a
//! cgroup, move in, write a little page cache (charged to it), move out, remove it. The page
//! cache keeps the removed cgroup alive ("dying") until it is reclaimed.
//!
//! usage: memcg-maker PARENT_CGROUP_DIR FILE_DIR COUNT

use std::{fs, io::Write, path::Path};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(parent), Some(files), Some(count)) =
        (args.get(1), args.get(2), args.get(3).and_then(|c| c.parse::<u32>().ok()))
    else {
        eprintln!("usage: memcg-maker PARENT_CGROUP_DIR FILE_DIR COUNT");
        std::process::exit(2);
    };
    let me = std::process::id().to_string();
    let home = Path::new(parent).parent().expect("parent of the test cgroup").join("cgroup.procs");
    fs::create_dir_all(files).expect("file dir");
    let page = vec![0x5au8; 4096];
    for i in 0..count {
        let cg = Path::new(parent).join(format!("agent-{i}"));
        fs::create_dir(&cg).unwrap_or_else(|e| panic!("mkdir {}: {e}", cg.display()));
        fs::write(cg.join("cgroup.procs"), &me).expect("move in");
        let mut f = fs::File::create(Path::new(files).join(format!("state-{i}"))).expect("file");
        f.write_all(&page).expect("write page cache");
        drop(f);
        fs::write(&home, &me).expect("move out");
        fs::remove_dir(&cg).unwrap_or_else(|e| panic!("rmdir {}: {e}", cg.display()));
    }
}
