//! Files the code writes under `/workspace/out/`, copied to the host after each call so that the
//! client can read them as MCP resources.
//!
//! The copy goes through the engine's archive API (`GET /containers/{id}/archive`), never a host
//! volume: the container has no path to the host, and the host reads a tar the engine wrote. The
//! code controls everything in that tar but its framing, so each entry is judged before a byte of
//! it lands: only regular files, names that are UTF-8 with no `..`, no absolute or empty part and
//! no control character, within `file_cap`, `files_per_call` and `files_total`. What is kept goes
//! to the session's own directory under the state dir, under a number the bridge chose (the
//! code's name never becomes a host path), and the directory goes with the session (reset,
//! close, idle reap, shutdown; [`OutStore`]'s `Drop` too).
//!
//! Whether to copy at all is decided by the session (`Session::collect_files`) from the runtime's
//! digest of the directory (every entry's name, mode, size, mtime, ctime, inode), since a copy is
//! a request to the engine worth about forty warm calls. Once copied, what changed is decided
//! per file: the engine's archive is the one listing that cannot disagree with what is copied,
//! and a file whose bytes (sha256) equal the kept copy's is not announced again. A lying digest
//! only withholds the sandbox's own files.

mod feed;
mod judge;
mod store;

pub use feed::*;
pub use judge::*;
pub use store::*;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn caps() -> Caps {
        Caps {
            file: 1000,
            per_call: 3,
            total: 2500,
        }
    }

    fn header(kind: tar::EntryType, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h
    }

    /// A tar as the engine would send it, with names written raw (no checks of `tar`'s builder).
    fn archive(entries: &[(&[u8], tar::EntryType, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data) in entries {
            let mut h = header(*kind, data.len() as u64);
            if *kind == tar::EntryType::Symlink || *kind == tar::EntryType::Link {
                h.set_size(0);
                h.set_link_name("/etc/passwd").unwrap();
            }
            // Raw name bytes into the header, bypassing set_path's own refusals.
            let field = &mut h.as_old_mut().name;
            field.fill(0);
            field[..name.len()].copy_from_slice(name);
            h.set_cksum();
            let body: &[u8] = if h.entry_size().unwrap() == 0 {
                &[]
            } else {
                data
            };
            b.append(&h, body).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn store() -> (tempfile::TempDir, OutStore) {
        let d = tempfile::tempdir().unwrap();
        let s = OutStore::new(d.path(), "abc");
        (d, s)
    }

    fn host_files(s: &OutStore) -> Vec<String> {
        let mut v: Vec<String> = match std::fs::read_dir(s.dir()) {
            Ok(rd) => rd
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => vec![],
        };
        v.sort();
        v
    }

    #[test]
    fn regular_files_are_kept_under_numbers_and_read_back_byte_for_byte() {
        let (_d, s) = store();
        let t = archive(&[
            (b"out/", tar::EntryType::Directory, b""),
            (b"out/a.csv", tar::EntryType::Regular, b"x,y\n1,2\n"),
            (b"out/plots/p.png", tar::EntryType::Regular, b"\x89PNG...."),
        ]);
        let r = extract(&t[..], &s, "default", &caps());
        assert!(r.notices.is_empty(), "{:?}", r.notices);
        let names: Vec<_> = r.new.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a.csv", "plots/p.png"]);
        assert_eq!(r.new[0].mime, "text/csv");
        assert_eq!(r.new[1].mime, "image/png");
        assert_eq!(r.new[0].size, 8);
        assert_eq!(
            r.new[1].uri,
            "resource://mcp-code-bridge/files/default/plots/p.png"
        );
        assert_eq!(host_files(&s), ["1", "2"]);
        let (_, bytes) = s.read("a.csv").unwrap().unwrap();
        assert_eq!(bytes, b"x,y\n1,2\n");
        // The same bytes again are not new; changed bytes are.
        let t2 = archive(&[
            (b"out/a.csv", tar::EntryType::Regular, b"x,y\n1,2\n"),
            (b"out/plots/p.png", tar::EntryType::Regular, b"\x89PNG!!!!"),
        ]);
        let r = extract(&t2[..], &s, "default", &caps());
        let names: Vec<_> = r.new.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["plots/p.png"]);
        assert_eq!(s.read("plots/p.png").unwrap().unwrap().1, b"\x89PNG!!!!");
        assert_eq!(host_files(&s), ["1", "4"], "the replaced copy was removed");
    }

    #[test]
    fn links_devices_fifos_and_unsafe_names_are_skipped_with_a_notice() {
        let (d, s) = store();
        let t = archive(&[
            (b"out/passwd", tar::EntryType::Symlink, b""),
            (b"out/hard", tar::EntryType::Link, b""),
            (b"out/null", tar::EntryType::Char, b""),
            (b"out/pipe", tar::EntryType::Fifo, b""),
            (b"out/../../evil", tar::EntryType::Regular, b"evil"),
            (b"/etc/evil", tar::EntryType::Regular, b"evil"),
            (b"out//etc/evil", tar::EntryType::Regular, b"evil"),
            (b"out/\xff\xfe.txt", tar::EntryType::Regular, b"evil"),
            (b"out/a\nb", tar::EntryType::Regular, b"evil"),
            (b"out/ok.txt", tar::EntryType::Regular, b"ok"),
        ]);
        let r = extract(&t[..], &s, "s", &caps());
        let names: Vec<_> = r.new.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["ok.txt"]);
        let all = r.notices.join("\n");
        for want in [
            "skipped 1 symbolic links",
            "skipped 1 hard links",
            "skipped 1 device files",
            "skipped 1 fifos",
            "skipped 1 names that are not UTF-8",
            "skipped 3 unsafe names",
            "skipped 1 entries outside the directory",
        ] {
            assert!(all.contains(want), "{want:?} not in {all}");
        }
        assert_eq!(host_files(&s), ["1"]);
        // Nothing was written beside the store's directory.
        let mut top: Vec<_> = std::fs::read_dir(d.path().join("files"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(top.len(), 1);
        top.clear();
        assert!(!d.path().join("evil").exists());
    }

    #[test]
    fn the_three_caps_each_skip_with_a_notice_naming_them() {
        let (_d, s) = store();
        let big = vec![b'a'; 1001];
        let k = vec![b'b'; 900];
        let t = archive(&[
            (b"out/big.bin", tar::EntryType::Regular, &big),
            (b"out/1", tar::EntryType::Regular, &k),
            (b"out/2", tar::EntryType::Regular, &k),
            (b"out/3", tar::EntryType::Regular, &k),
        ]);
        let r = extract(&t[..], &s, "s", &caps());
        assert_eq!(r.new.len(), 2);
        let all = r.notices.join("\n");
        assert!(
            all.contains("skipped 1 files larger than file_cap = 1000"),
            "{all}"
        );
        assert!(all.contains("files_total"), "{all}");
        let (_d, s) = store();
        let t = archive(&[
            (b"out/a", tar::EntryType::Regular, b"1"),
            (b"out/b", tar::EntryType::Regular, b"2"),
            (b"out/c", tar::EntryType::Regular, b"3"),
            (b"out/d", tar::EntryType::Regular, b"4"),
            (b"out/e", tar::EntryType::Regular, b"5"),
        ]);
        let r = extract(&t[..], &s, "s", &caps());
        assert_eq!(r.new.len(), 3);
        let all = r.notices.join("\n");
        assert!(
            all.contains("skipped 2 files beyond files_per_call = 3"),
            "{all}"
        );
        // The next call brings the rest; the kept ones are not announced again.
        let r = extract(&t[..], &s, "s", &caps());
        let names: Vec<_> = r.new.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["d", "e"]);
    }

    #[test]
    fn a_truncated_archive_keeps_nothing_partial() {
        let (_d, s) = store();
        let data = vec![b'z'; 900];
        let mut t = archive(&[
            (b"out/ok", tar::EntryType::Regular, b"fine"),
            (b"out/cut", tar::EntryType::Regular, &data),
        ]);
        t.truncate(512 * 3 + 100);
        let r = extract(&t[..], &s, "s", &caps());
        let names: Vec<_> = r.new.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["ok"]);
        assert!(
            r.notices.join("\n").contains("changed while being copied"),
            "{:?}",
            r.notices
        );
        assert_eq!(host_files(&s), ["1"]);
    }

    fn b64(b: &[u8]) -> TarPiece {
        use base64::Engine as _;
        TarPiece::Data(base64::engine::general_purpose::STANDARD.encode(b))
    }

    /// Feed `pieces` as the runtime's `tar` frames; the report, with the feed's notices.
    fn feed_all(s: &Arc<OutStore>, caps: Caps, pieces: Vec<TarPiece>) -> Report {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let (mut feed, judged) = tar_feed(Arc::clone(s), "s".into(), caps);
                let reading = async {
                    for p in pieces {
                        if !feed.feed(p).await {
                            break;
                        }
                    }
                    feed.finish()
                };
                let (mut r, n) = futures::join!(judged, reading);
                r.notices.extend(n);
                r
            })
    }

    #[test]
    fn a_tar_through_the_channel_is_judged_as_the_engines_archive() {
        let t = archive(&[
            (b"out/", tar::EntryType::Directory, b""),
            (b"out/a.csv", tar::EntryType::Regular, b"x,y\n1,2\n"),
            (b"out/passwd", tar::EntryType::Symlink, b""),
            (b"out/../evil", tar::EntryType::Regular, b"evil"),
        ]);
        let (_d, s) = store();
        let s = Arc::new(s);
        // In pieces of any size, the last one the end.
        let mut pieces: Vec<TarPiece> = t.chunks(700).map(b64).collect();
        pieces.push(TarPiece::End(None));
        let r = feed_all(&s, caps(), pieces);
        let names: Vec<_> = r.new.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a.csv"]);
        let all = r.notices.join("\n");
        assert!(all.contains("skipped 1 symbolic links"), "{all}");
        assert!(all.contains("skipped 1 unsafe names"), "{all}");
        assert_eq!(s.read("a.csv").unwrap().unwrap().1, b"x,y\n1,2\n");
    }

    #[test]
    fn a_lying_runtime_only_garbles_its_own_files() {
        let t = archive(&[
            (b"out/ok", tar::EntryType::Regular, b"fine"),
            (b"out/later", tar::EntryType::Regular, b"never"),
        ]);
        // Bad base64 after the first entry: what came before is kept, nothing after.
        let (_d, s) = store();
        let s = Arc::new(s);
        let r = feed_all(
            &s,
            caps(),
            vec![
                b64(&t[..1024]),
                TarPiece::Data("not base64!".into()),
                b64(&t[1024..]),
                TarPiece::End(Some("it says \u{1b}[2J why".into())),
            ],
        );
        let names: Vec<_> = r.new.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["ok"]);
        let all = r.notices.join("\n");
        assert!(all.contains("stopped early"), "{all}");
        // Its words are quoted, escapes and all.
        assert!(all.contains("\\u{1b}[2J why"), "{all}");
        // More bytes than the read limit: the rest is not read, whatever the runtime sends.
        let (_d, s) = store();
        let s = Arc::new(s);
        let small = Caps {
            file: 1000,
            per_call: 3,
            total: 0,
        };
        let limit = small.read_limit() as usize;
        let big = vec![b'a'; limit + 4096];
        let t = archive(&[(b"out/big", tar::EntryType::Regular, &big)]);
        let r = feed_all(&s, small, vec![b64(&t), b64(&t)]);
        assert!(
            r.notices.join("\n").contains("the rest was not read"),
            "{:?}",
            r.notices
        );
        // More frames than the bound: the rest is not read.
        let (_d, s) = store();
        let s = Arc::new(s);
        let many: Vec<TarPiece> = (0..=max_tar_frames(&small))
            .map(|_| TarPiece::Data(String::new()))
            .collect();
        let r = feed_all(&s, small, many);
        assert!(
            r.notices
                .join("\n")
                .contains("pieces; the rest was not read"),
            "{:?}",
            r.notices
        );
        assert!(r.new.is_empty());
    }

    #[test]
    fn clear_removes_the_directory() {
        let (_d, s) = store();
        let t = archive(&[(b"out/a", tar::EntryType::Regular, b"1")]);
        extract(&t[..], &s, "s", &caps());
        assert!(s.dir().exists());
        let dir = s.dir().to_path_buf();
        drop(s);
        assert!(!dir.exists());
    }

    #[test]
    fn the_files_of_a_bridge_that_is_gone_are_reaped_and_a_live_ones_kept() {
        let d = tempfile::tempdir().unwrap();
        let gone = d.path().join("files").join(format!("{}-abc", u32::MAX - 1));
        let live = d
            .path()
            .join("files")
            .join(format!("{}-abc", std::process::id()));
        for dir in [&gone, &live] {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join("1"), b"x").unwrap();
        }
        reap_orphans(d.path());
        assert!(!gone.exists());
        assert!(live.join("1").exists());
    }

    #[test]
    fn uris_round_trip_odd_sessions_and_names() {
        let u = uri("a/b c", "dir/x y#?.csv");
        assert_eq!(
            u,
            "resource://mcp-code-bridge/files/a%2Fb%20c/dir/x%20y%23%3F.csv"
        );
        assert_eq!(
            parse_uri(&u),
            Some(("a/b c".to_string(), "dir/x y#?.csv".to_string()))
        );
        assert_eq!(parse_uri("resource://mcp-code-bridge/capabilities"), None);
    }
}
