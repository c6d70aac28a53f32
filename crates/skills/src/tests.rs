use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::*;
use bridge_core::error::Hinted as _;

const SRC: &str = "def double(x):\n    \"\"\"Twice x.\"\"\"\n    return 2 * x\n";

fn store(max_size: u64, max_count: u32) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().join("skills"), max_size, max_count);
    (dir, store)
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn names_are_python_identifiers_and_never_paths() {
    for ok in ["f", "_private", "load_sales_2024", "match", "type"] {
        assert!(valid_name(ok), "{ok}");
    }
    for bad in [
        "", "1st", "a-b", "a.b", "../x", "x/y", ".hidden", "def", "lambda", "None", "a b", "Résumé",
    ] {
        assert!(!valid_name(bad), "{bad}");
    }
    assert!(valid_name(&"a".repeat(MAX_NAME)));
    assert!(!valid_name(&"a".repeat(MAX_NAME + 1)));
    let (_d, s) = store(1024, 10);
    let e = s.save("../escape", SRC, "").unwrap_err();
    assert!(matches!(e, SkillError::InvalidName { .. }), "{e}");
    assert!(!s.dir().exists(), "nothing is written for a refused name");
}

#[test]
fn save_writes_source_and_metadata_0600_and_reads_them_back() {
    let (_d, s) = store(1024, 10);
    let saved = s.save("double", SRC, "Twice x.").unwrap();
    assert_eq!(
        saved,
        Saved {
            replaced: false,
            count: 1
        }
    );
    let py = s.dir().join("double.py");
    let meta = s.dir().join("double.json");
    assert_eq!(fs::read_to_string(&py).unwrap(), SRC);
    assert_eq!(mode(&py), 0o600);
    assert_eq!(mode(&meta), 0o600);
    assert_eq!(mode(s.dir()), 0o700);
    let skill = s.get("double").unwrap();
    assert_eq!(skill.description, "Twice x.");
    assert_eq!(skill.source, SRC);
    assert!(skill.saved_at.ends_with('Z'), "{}", skill.saved_at);
    // No temporary file is left beside them.
    let leftovers: Vec<_> = fs::read_dir(s.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn replacing_is_atomic_and_does_not_count_twice() {
    let (_d, s) = store(1024, 1);
    s.save("double", SRC, "one").unwrap();
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
    let before = ino(&s.dir().join("double.py"));
    let saved = s
        .save("double", "def double(x):\n    return x + x\n", "two")
        .unwrap();
    assert_eq!(
        saved,
        Saved {
            replaced: true,
            count: 1
        }
    );
    // Renamed over, not rewritten in place: a reader sees the old file or the new one.
    assert_ne!(ino(&s.dir().join("double.py")), before);
    assert_eq!(s.get("double").unwrap().description, "two");
}

#[test]
fn size_cap_counts_source_and_description() {
    let (_d, s) = store(300, 10);
    let big = format!("def f():\n    return {:?}\n", "x".repeat(300));
    let e = s.save("f", &big, "").unwrap_err();
    assert!(matches!(e, SkillError::TooLarge { max: 300, .. }), "{e}");
    assert!(
        e.to_string().contains("above skills.max_size (300 bytes)"),
        "{e}"
    );
    assert!(e.hint().unwrap().text().contains("skills.max_size"));
    let e = s
        .save("double", SRC, &"d".repeat(300 - SRC.len() + 1))
        .unwrap_err();
    assert!(matches!(e, SkillError::TooLarge { .. }), "{e}");
    s.save("double", SRC, &"d".repeat(300 - SRC.len())).unwrap();
}

#[test]
fn count_cap_refuses_one_more_and_names_the_way_out() {
    let (_d, s) = store(1024, 2);
    s.save("a", "def a(): pass\n", "").unwrap();
    s.save("b", "def b(): pass\n", "").unwrap();
    let e = s.save("c", "def c(): pass\n", "").unwrap_err();
    assert!(
        matches!(
            e,
            SkillError::TooMany {
                count: 2,
                max: 2,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.message().contains("skills rm NAME"), "{}", e.message());
    assert!(!s.dir().join("c.py").exists());
    s.remove("a").unwrap();
    s.save("c", "def c(): pass\n", "").unwrap();
    let names: Vec<_> = s
        .list()
        .unwrap()
        .skills
        .into_iter()
        .map(|k| k.name)
        .collect();
    assert_eq!(names, ["b", "c"]);
}

#[test]
fn remove_deletes_both_files_and_names_a_missing_skill() {
    let (_d, s) = store(1024, 10);
    assert!(matches!(
        s.remove("x").unwrap_err(),
        SkillError::NotFound { .. }
    ));
    s.save("x", "def x(): pass\n", "d").unwrap();
    s.remove("x").unwrap();
    assert!(!s.dir().join("x.py").exists());
    assert!(!s.dir().join("x.json").exists());
    assert!(matches!(
        s.get("x").unwrap_err(),
        SkillError::NotFound { .. }
    ));
}

#[test]
fn broken_files_are_listed_as_broken_never_fatal() {
    let (_d, s) = store(64, 10);
    s.save("good", "def good(): pass\n", "").unwrap();
    let dir = s.dir();
    fs::write(dir.join("bad-name.py"), "def f(): pass\n").unwrap();
    fs::write(dir.join("latin.py"), b"def latin(): return '\xe9'\n").unwrap();
    fs::write(dir.join("huge.py"), "#".repeat(65)).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dir.join("link.py")).unwrap();
    fs::create_dir(dir.join("folder.py")).unwrap();
    fs::write(dir.join("nometa.py"), "def nometa(): pass\n").unwrap();
    fs::write(dir.join("badmeta.py"), "def badmeta(): pass\n").unwrap();
    fs::write(dir.join("badmeta.json"), "{not json").unwrap();
    fs::write(dir.join("orphan.json"), "{}").unwrap();
    let fifo =
        std::ffi::CString::new(dir.join("fifo.py").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    fs::write(
        dir.join("runs.py"),
        "import os
def runs(): pass
",
    )
    .unwrap();
    let listing = s.list().unwrap();
    let names: Vec<_> = listing.skills.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["badmeta", "good", "nometa"]);
    let mut broken: Vec<_> = listing
        .broken
        .iter()
        .map(|b| (b.name.as_str(), b.reason.as_str()))
        .collect();
    broken.sort();
    assert_eq!(
        broken,
        [
            ("bad-name", "its file name is not a Python identifier"),
            ("fifo", "it is a FIFO, not a regular file"),
            ("folder", "it is a directory, not a regular file"),
            ("huge", "it is larger than skills.max_size (64 bytes)"),
            ("latin", "its source is not UTF-8"),
            ("link", "it is a symbolic link, not a regular file"),
            (
                "runs",
                "its source has 2 top-level statements (one of them an import); a skill is exactly one function definition, with nothing before or after it that would run when a session starts (put imports and helpers inside the function)"
            ),
        ]
    );
    assert!(matches!(
        s.get("link").unwrap_err(),
        SkillError::Broken { .. }
    ));
}

#[test]
fn more_files_than_the_count_cap_are_not_all_loaded() {
    let (_d, s) = store(1024, 2);
    s.save("a", "def a(): pass\n", "").unwrap();
    s.save("b", "def b(): pass\n", "").unwrap();
    fs::write(s.dir().join("c.py"), "def c(): pass\n").unwrap();
    let listing = s.list().unwrap();
    assert_eq!(listing.skills.len(), 2);
    assert_eq!(listing.broken[0].name, "c");
    assert!(listing.broken[0].reason.contains("skills.max_count (2)"));
}

#[test]
fn an_absent_store_is_empty() {
    let (_d, s) = store(1024, 2);
    assert_eq!(s.list().unwrap(), Listing::default());
}

#[test]
fn any_sees_a_skill_file_and_nothing_else() {
    let (dir, store) = store(1024, 4);
    assert!(!store.any(), "absent directory");
    std::fs::create_dir_all(store.dir()).unwrap();
    std::fs::write(store.dir().join(".tmp.py"), "x").unwrap();
    std::fs::write(store.dir().join("a.json"), "{}").unwrap();
    assert!(!store.any(), "temporary and metadata files are not skills");
    store
        .save("double", "def double(x):\n    return 2 * x\n", "")
        .unwrap();
    assert!(store.any());
    store.remove("double").unwrap();
    assert!(!store.any());
    drop(dir);
}

#[test]
fn a_source_that_is_more_than_one_function_is_not_saved() {
    let (_d, s) = store(1024, 4);
    let e = s
        .save("f", "def f():\n    pass\nimport os; os.system('id')\n", "")
        .unwrap_err();
    assert!(matches!(e, SkillError::NotOneFunction { .. }), "{e}");
    assert!(e.to_string().contains("3 top-level statements"), "{e}");
    assert!(
        e.hint()
            .unwrap()
            .text()
            .contains("one function defined with def")
    );
    assert!(!s.dir().join("f.py").exists());
    let e = s.save("f", "def f(:\n", "").unwrap_err();
    assert!(
        e.to_string()
            .contains("not Python this bridge can read (line 1"),
        "{e}"
    );
}

/// A FIFO where the store's lock belongs: refused at once, never waited on.
#[test]
fn a_fifo_lock_is_refused_not_waited_on() {
    let (_d, s) = store(1024, 4);
    fs::create_dir_all(s.dir()).unwrap();
    let fifo = std::ffi::CString::new(s.dir().join(".lock").into_os_string().into_encoded_bytes())
        .unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let start = std::time::Instant::now();
    let e = s.save("double", SRC, "").unwrap_err();
    assert!(
        e.to_string().contains("it is a FIFO, not a regular file"),
        "{e}"
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(2));
}
