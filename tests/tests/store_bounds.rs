//! The store's behaviour at its bounds, with the real daemon: a disk that fills up.

use std::{path::PathBuf, process::Command, time::Duration};

use integration_tests::{Daemon, folded_window, helper_bin, now_secs, privileged, wait_for};

/// A small tmpfs, unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(at: PathBuf, size: &str) -> Self {
        std::fs::create_dir_all(&at).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(&at)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs at {}", at.display());
        Self(at)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes to `path` until the disk is full.
fn fill(path: &std::path::Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0xa5u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
}

#[test]
fn a_full_disk_pauses_writing_and_loses_nothing_when_space_returns() {
    if !privileged("a_full_disk_pauses_writing_and_loses_nothing_when_space_returns") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(tmp.path().join("disk"), "1m");
    let data = disk.0.join("data");
    let mut daemon = Daemon::start(&data, &[]);
    daemon.wait_ready();

    let filler = disk.0.join("filler");
    fill(&filler);
    let full_at = now_secs();
    let out = Command::new(helper_bin()).args(["1", "3"]).output().unwrap();
    assert!(out.status.success());
    let helper_end = now_secs();
    wait_for("the daemon to report the full disk", Duration::from_secs(10), || {
        daemon.log_text().contains("cannot write samples").then_some(())
    });
    assert!(daemon.child.as_mut().unwrap().try_wait().unwrap().is_none(), "the daemon must keep running");

    std::fs::remove_file(&filler).unwrap();
    wait_for("the daemon to resume writing", Duration::from_secs(10), || {
        daemon.log_text().contains("works again").then_some(())
    });

    // Everything sampled while the disk was full was held and written: the helper's whole run.
    let stacks = folded_window(data.to_str().unwrap(), full_at + 0.3, helper_end - 0.3, &["--cpu", "1"]).unwrap();
    let total: u64 = stacks.iter().map(|(_, c)| c).sum();
    let secs = helper_end - full_at - 0.6;
    assert!(total as f64 >= 0.9 * 99.0 * secs, "{total} samples on CPU 1 over {secs:.1} s of full disk");
    assert!(stacks.iter().any(|(s, _)| s.contains("profiler_test_hot_loop")));
    let st = daemon.stop();
    assert!(st.success(), "{}", daemon.log_text());
}
