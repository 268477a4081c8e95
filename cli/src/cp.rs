//! `silo cp SRC DST`: files and trees between the host and a sandbox, with
//! `docker cp`'s syntax and rules (the rules live in the library's
//! `Files::copy_in` and `Files::copy_out`; this parses the operands).

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, bail};
use silo::Silo;
use silo::{looks_like_id, validate_name};

use super::output::Output;

/// The rules, shown by `silo cp --help`.
const RULES: &str = "\
SANDBOX:PATH names a path in a sandbox (by name or id); anything else is a
host path (write ./a:b for a host file named a:b). A relative sandbox path
starts at the sandbox's working directory, as commands' paths do. `-` is a
tar stream: on stdin as SRC (unpacked into the sandbox directory DST, made
if missing; the tar may hold files and directories only), on stdout as DST
(the sandbox path and everything under it, symlinks as symlinks).

Where things land, as with docker cp:
  SRC a file:       DST a directory gets DST/<name>; DST a file is replaced;
                    a missing DST becomes the file (its directory must exist;
                    a DST ending in / must be an existing directory).
  SRC a directory:  DST a directory gets DST/<name>, merged with what is
                    there; a missing DST is made with SRC's contents (its
                    parent must exist); a file at DST is refused.
  SRC ending in /.: its contents go into DST rather than SRC itself.
  A sandbox symlink at DST is followed when it leads to a directory, and
  replaced otherwise.

Permission bits are kept (without setuid, setgid and sticky), owners are
not. A symlink or special file on the host side is refused, named. One side
must be a sandbox and the other the host. A tree going in is held to the
agent's push caps (by default 25 MiB per file, 100 MiB of tar); a single
file goes in through one write, up to 4 GiB. Copies are held in memory.";

#[derive(Debug, clap::Args)]
#[command(after_long_help = RULES)]
pub struct Args {
    /// SANDBOX:PATH, a host path, or - (a tar on stdin).
    src: String,
    /// SANDBOX:PATH, a host path, or - (a tar on stdout).
    dst: String,
}

/// One operand of `silo cp`.
#[derive(Debug, PartialEq, Eq)]
enum Side<'a> {
    Sandbox { sandbox: &'a str, path: &'a str },
    Host(PathBuf),
    Stream,
}

impl<'a> Side<'a> {
    /// `SANDBOX:PATH` when the text before the first colon is a sandbox name
    /// or id; `-` for a stream; a host path otherwise.
    fn parse(text: &'a str) -> Self {
        if text == "-" {
            return Self::Stream;
        }
        match text.split_once(':') {
            Some((sandbox, path)) if validate_name(sandbox).is_ok() || looks_like_id(sandbox) => {
                Self::Sandbox { sandbox, path }
            }
            _ => Self::Host(PathBuf::from(text)),
        }
    }
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let (src, dst) = (Side::parse(&args.src), Side::parse(&args.dst));
    let what = || format!("copying {} to {}", args.src, args.dst);
    match (src, dst) {
        (Side::Sandbox { .. }, Side::Sandbox { .. }) => bail!(
            "cannot copy from one sandbox to another ({} to {}); copy to the host first",
            args.src,
            args.dst
        ),
        (Side::Sandbox { path: "", .. }, _) | (_, Side::Sandbox { path: "", .. }) => {
            bail!("{}: the sandbox path is empty (SANDBOX:PATH)", what())
        }
        (Side::Host(_) | Side::Stream, Side::Host(_) | Side::Stream) => bail!(
            "one side of a copy must be a sandbox path (SANDBOX:PATH); {} and {} are both on the host",
            args.src,
            args.dst
        ),
        (Side::Host(src), Side::Sandbox { sandbox, path }) => {
            let sandbox = silo.running_sandbox(sandbox).await?;
            let copied = sandbox
                .files()
                .copy_in(&src, path)
                .await
                .with_context(what)?;
            out.copied(&copied, Some(sandbox.name()))?;
        }
        (Side::Stream, Side::Sandbox { sandbox, path }) => {
            let sandbox = silo.running_sandbox(sandbox).await?;
            let mut tar = Vec::new();
            std::io::stdin()
                .lock()
                .read_to_end(&mut tar)
                .context("reading a tar from stdin")?;
            let written = sandbox.files().upload(path, tar).await.with_context(what)?;
            out.tree_written(&written, sandbox.name(), path)?;
        }
        (Side::Sandbox { sandbox, path }, Side::Host(dst)) => {
            let sandbox = silo.running_sandbox(sandbox).await?;
            let copied = sandbox
                .files()
                .copy_out(path, &dst)
                .await
                .with_context(what)?;
            out.copied(&copied, None)?;
        }
        (Side::Sandbox { sandbox, path }, Side::Stream) => {
            let sandbox = silo.running_sandbox(sandbox).await?;
            let tar = sandbox.files().download(path).await.with_context(what)?;
            return out.bytes(&tar);
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operands_read_as_docker_cp_reads_them() {
        assert_eq!(
            Side::parse("work:/tmp/a"),
            Side::Sandbox {
                sandbox: "work",
                path: "/tmp/a"
            }
        );
        assert_eq!(
            Side::parse("sbx-0123456789ab:rel"),
            Side::Sandbox {
                sandbox: "sbx-0123456789ab",
                path: "rel"
            }
        );
        assert_eq!(Side::parse("-"), Side::Stream);
        for host in ["./a:b", "/abs:x", "dir/file", ":x", "a b:c", "plain"] {
            assert_eq!(Side::parse(host), Side::Host(host.into()), "{host}");
        }
    }
}
