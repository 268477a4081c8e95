//! `silo cp`, `silo cat` and `silo ls-files` on the local backend, one real
//! CLI process per command: trees both ways compared by digest (paths,
//! kinds, modes, SHA-256 of contents), tar streams, listings, and errors
//! that name the sandbox and the path.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::io::Write;
use std::path::Path;
use std::process::Stdio;

use silo_tests::Cli;
use silo_tests::json;
use silo_tests::tree;

fn text(path: &Path) -> String {
    path.display().to_string()
}

/// `silo ARGS...` must fail with exit code 1; answers its stderr.
fn fails(cli: &Cli, args: &[&str]) -> String {
    let out = cli.run(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "silo {args:?}: {err}");
    err
}

fn sandbox(name: &str) -> Cli {
    let cli = crate::cli();
    cli.ok(&["create", "--backend", "local", "--name", name]);
    cli
}

#[test]
fn cp_round_trips_a_tree_both_ways() {
    let cli = sandbox("files");
    let host = tempfile::tempdir().unwrap();
    let src = host.path().join("tree");
    tree::sample(&src);
    let want = tree::digest(&src);

    // A missing destination is made, with the tree's contents.
    let copied = json(&cli.ok(&["cp", &text(&src), "files:copy", "--json"]));
    assert_eq!(copied["files"], 6, "{copied}");
    assert_eq!(copied["dirs"], 5, "{copied}");
    assert_eq!(copied["to"], "files:copy", "{copied}");
    // In the sandbox, the big file hashes the same and the modes held.
    let big = std::fs::read(src.join("big.bin")).unwrap();
    let sum = cli.ok(&["exec", "files", "--", "sha256sum", "copy/big.bin"]);
    assert!(sum.starts_with(&tree::sha256_hex(&big)), "{sum}");
    let listed = json(&cli.ok(&["ls-files", "files", "copy", "-o", "json"]));
    let mode_of = |name: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed: {listed}"))["mode"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(mode_of("run.sh"), 0o755);
    assert_eq!(mode_of("binary.bin"), 0o644);

    // Out into an existing directory: the tree lands inside it, by name.
    let back = host.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let copied = json(&cli.ok(&["cp", "files:copy", &text(&back), "--json"]));
    assert_eq!(copied["to"], text(&back.join("copy")), "{copied}");
    assert_eq!(tree::digest(&back.join("copy")), want);

    // Into an existing sandbox directory: inside it, by name, and `/.`
    // copies a directory's contents rather than the directory.
    cli.ok(&["cp", &text(&src), "files:copy"]);
    let contents = host.path().join("contents");
    cli.ok(&["cp", "files:copy/tree/.", &text(&contents)]);
    assert_eq!(tree::digest(&contents), want);
    std::fs::create_dir(host.path().join("merged")).unwrap();
    std::fs::write(host.path().join("merged/kept.txt"), "kept").unwrap();
    cli.ok(&[
        "cp",
        "files:copy/tree/.",
        &text(&host.path().join("merged")),
    ]);
    let merged = tree::digest(&host.path().join("merged"));
    assert!(merged.contains_key("kept.txt") && merged.contains_key("big.bin"));

    // One file each way: into a directory under its name, and onto a new name.
    cli.ok(&["cp", &text(&src.join("run.sh")), "files:copy/nested"]);
    let run_back = host.path().join("run-back.sh");
    cli.ok(&["cp", "files:copy/nested/run.sh", &text(&run_back)]);
    assert_eq!(
        tree::digest(host.path())["run-back.sh"],
        want["run.sh"],
        "contents and mode"
    );
    // A file onto a file replaces it.
    cli.ok(&[
        "cp",
        &text(&src.join("nested/notes.md")),
        "files:copy/run.sh",
    ]);
    assert_eq!(cli.ok(&["cat", "files", "copy/run.sh"]), "# notes\n");
}

#[test]
fn tar_streams_go_in_and_out_on_stdin_and_stdout() {
    let cli = sandbox("streams");
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(6);
    header.set_mode(0o640);
    tar.append_data(&mut header, "in/hello.txt", &b"hello\n"[..])
        .unwrap();
    let tar = tar.into_inner().unwrap();

    let mut child = cli
        .command(&["cp", "-", "streams:unpacked"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&tar).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        cli.ok(&["cat", "streams", "unpacked/in/hello.txt"]),
        "hello\n"
    );

    let out = cli.run(&["cp", "streams:unpacked", "-"]);
    assert!(out.status.success(), "{out:?}");
    let mut names = Vec::new();
    for entry in tar::Archive::new(&out.stdout[..]).entries().unwrap() {
        let entry = entry.unwrap();
        let mode = entry.header().mode().unwrap() & 0o777;
        names.push(format!("{} {mode:o}", entry.path().unwrap().display()));
    }
    assert_eq!(
        names,
        [
            "unpacked 755",
            "unpacked/in 755",
            "unpacked/in/hello.txt 640"
        ]
    );
}

#[test]
fn cat_and_ls_files_show_what_is_there() {
    let cli = sandbox("show");
    cli.ok(&[
        "exec",
        "show",
        "--",
        "sh",
        "-c",
        "mkdir -p d/sub && printf 'a\\n' > d/a.txt && printf 'bb\\n' > d/b.txt \
         && chmod 600 d/b.txt && ln -s a.txt d/link",
    ]);
    assert_eq!(cli.ok(&["cat", "show", "d/a.txt", "d/b.txt"]), "a\nbb\n");
    // A missing file is reported by name; the others are still printed.
    let out = cli.run(&["cat", "show", "d/a.txt", "d/missing", "d/b.txt"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "a\nbb\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("show:d/missing") && err.contains("does not exist"),
        "{err}"
    );
    let err = fails(&cli, &["cat", "show", "d"]);
    assert!(err.contains("is a directory"), "{err}");

    let listed = json(&cli.ok(&["ls-files", "show", "d", "--json"]));
    let rows: Vec<(String, String, u64, u64)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["kind"].as_str().unwrap().to_owned(),
                e["size"].as_u64().unwrap(),
                e["mode"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows[0], ("a.txt".into(), "file".into(), 2, 0o644));
    assert_eq!(rows[1], ("b.txt".into(), "file".into(), 3, 0o600));
    assert_eq!(
        (rows[2].0.as_str(), rows[2].1.as_str()),
        ("link", "symlink")
    );
    assert_eq!((rows[3].0.as_str(), rows[3].1.as_str()), ("sub", "dir"));
    assert!(listed[0]["modified_ms"].as_i64().unwrap() > 0);

    let table = cli.ok(&["ls-files", "show", "d"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("KIND") && lines[0].ends_with("NAME"),
        "{table}"
    );
    let words: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        (words[0], words[1], words[2], words[5]),
        ("file", "0600", "3", "b.txt"),
        "{table}"
    );
    assert!(lines[3].ends_with("link -> a.txt"), "{table}");
    // A file lists as itself.
    let one = json(&cli.ok(&["ls-files", "show", "d/a.txt", "--json"]));
    assert_eq!(one.as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one[0]["name"], "a.txt");
}

#[test]
fn copy_errors_name_the_sandbox_and_the_path() {
    let cli = sandbox("errs");
    let host = tempfile::tempdir().unwrap();
    let file = host.path().join("file.txt");
    std::fs::write(&file, "x").unwrap();
    let dir = host.path().join("dir");
    std::fs::create_dir(&dir).unwrap();
    cli.ok(&["cp", &text(&file), "errs:file.txt"]);

    let err = fails(&cli, &["cp", "errs:nope", &text(host.path())]);
    assert!(
        err.contains("errs:nope") && err.contains("does not exist"),
        "{err}"
    );
    let err = fails(&cli, &["cp", &text(&file), "errs:no/such/dir/x"]);
    assert!(
        err.contains("destination directory no/such/dir does not exist"),
        "{err}"
    );
    let err = fails(&cli, &["cp", &text(&file), "errs:gone/"]);
    assert!(
        err.contains("destination directory gone/ does not exist"),
        "{err}"
    );
    let err = fails(&cli, &["cp", &text(&dir), "errs:file.txt"]);
    assert!(
        err.contains("cannot copy a directory onto the file file.txt"),
        "{err}"
    );
    let err = fails(&cli, &["cp", &text(&host.path().join("absent")), "errs:x"]);
    assert!(err.contains("absent"), "{err}");

    let err = fails(&cli, &["cp", "nope:/x", &text(host.path())]);
    assert!(err.contains("unknown sandbox \"nope\""), "{err}");
    let err = fails(&cli, &["cp", "errs:/a", "errs:/b"]);
    assert!(err.contains("from one sandbox to another"), "{err}");
    let err = fails(&cli, &["cp", &text(&file), &text(&dir)]);
    assert!(err.contains("must be a sandbox path"), "{err}");

    // A host symlink is refused by name, and nothing was sent.
    std::os::unix::fs::symlink("/etc/passwd", dir.join("link")).unwrap();
    let err = fails(&cli, &["cp", &text(&dir), "errs:linked"]);
    assert!(
        err.contains(&text(&dir.join("link"))) && err.contains("symlink"),
        "{err}"
    );
    let err = fails(&cli, &["ls-files", "errs", "linked"]);
    assert!(err.contains("does not exist"), "{err}");

    // A stopped sandbox is not started behind the user's back.
    cli.ok(&["stop", "errs"]);
    for args in [
        &["cp", &text(&file), "errs:again.txt"][..],
        &["cat", "errs", "file.txt"][..],
        &["ls-files", "errs"][..],
    ] {
        let err = fails(&cli, args);
        assert!(err.contains("`silo start errs`"), "{args:?}: {err}");
    }
}
