//! A data directory another user can write is a root write primitive (issue 14 E7): the daemon
//! refuses it with a sentence and writes nothing there, through a planted link or otherwise.

use std::os::unix::fs::{PermissionsExt, symlink};

use integration_tests::{privileged, profiler};

#[test]
fn a_data_directory_another_user_controls_is_refused_and_left_alone() {
    if !privileged("a_data_directory_another_user_controls_is_refused_and_left_alone") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, "root's file\n").unwrap();

    // Writable by everyone above it.
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    // Owned by another user (nobody), with links planted where the daemon writes.
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    for name in ["meta.json", "ui-url", "LOCK"] {
        symlink(&victim, theirs.join(name)).unwrap();
    }
    // SAFETY: chown of a path we created; 65534 is nobody.
    let c = std::ffi::CString::new(theirs.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::lchown(c.as_ptr(), 65534, 65534) }, 0);

    for (dir, why) in [(open.join("data"), "writable by everyone"), (theirs.clone(), "owned by uid 65534")] {
        let out = profiler(&["run", "--data-dir", dir.to_str().unwrap(), "--listen", "off"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the daemon ran on {}", dir.display());
        assert!(err.contains("refusing the data directory") && err.contains(why), "{err}");
        assert!(!err.contains("panicked") && err.lines().count() == 1, "one sentence: {err}");
    }
    assert!(!open.join("data").exists(), "nothing created under a world-writable directory");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's file\n", "written through a planted link");
}
