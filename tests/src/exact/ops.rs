//! The operations a step is drawn from, each one kind of change a program
//! makes to its file system, rendered as one line of busybox `sh`.
//!
//! A [`Model`] remembers, roughly, which paths exist, so most operations
//! aim at something there; it is not exact (a rewind or a shrunk plan
//! changes what is there), so every line tolerates a vanished path. The
//! paths lie in a work area, `/w`, and in the base image's directories
//! (`/usr/bin`, `/etc`, `/var/tmp`…), where files two levels below an
//! untouched image directory, owners of image directories and replaced
//! image symlinks test what the work area cannot.
//!
//! No line may hurt the shell the next step needs: nothing writes, chmods
//! or touches through a symlink (an image applet links to `/bin/busybox`),
//! the tools the lines use are never removed, and no image directory is
//! removed or moved.

use std::fmt::Write as _;

use super::kinds::OpKind;
use super::rng::Rng;

/// The work area every plan makes first.
pub const WORK: &str = "/w";
/// Directories of the base image that steps write into, chmod and chown.
const IMAGE_DIRS: [&str; 11] = [
    "/usr/bin",
    "/usr/sbin",
    "/var/tmp",
    "/var",
    "/etc",
    "/home",
    "/root",
    "/tmp",
    "/sbin",
    "/bin",
    "/usr",
];
/// Files of the base image that steps may delete, replace or change:
/// applet symlinks no line needs, and a plain file.
const IMAGE_FILES: [&str; 14] = [
    "/usr/bin/bc",
    "/usr/bin/dc",
    "/usr/bin/awk",
    "/usr/bin/cal",
    "/usr/bin/factor",
    "/usr/bin/hexdump",
    "/usr/bin/xxd",
    "/bin/ls",
    "/bin/date",
    "/bin/ed",
    "/sbin/ifconfig",
    "/sbin/route",
    "/usr/sbin/httpd",
    "/etc/group",
];
/// Files the engine reads to start a container (root's groups): a fork
/// of a snapshot where one is a directory, or a link to one, cannot start
/// ("unable to find groups for spec root"), so steps only write, remove
/// and chmod them, never turn them into something else.
const ENGINE_READS: [&str; 2] = ["/etc/group", "/etc/passwd"];
/// Directories the engine makes again in every container's own layer
/// (the mount points of its `/etc/hosts` and the like): a container made
/// from a snapshot has them with the engine's special bits, whatever the
/// snapshot holds, so steps leave their setuid, setgid and sticky bits be.
const ENGINE_MAKES: [&str; 1] = ["/etc"];
/// Longest name a step makes (the kernel's `NAME_MAX`).
const NAME_MAX: u64 = 255;
/// Paths stay well under `PATH_MAX` (4096), counting rendered escapes.
const PATH_BUDGET: usize = 3000;
/// Largest file a step writes.
const FILE_MAX: u64 = 64 * 1024;

/// Extended attribute names the xattr steps use: few, so that steps set
/// one again, change it and remove it.
const XATTR_NAMES: [&str; 3] = ["user.x0", "user.x1", "user.x2"];
/// Sizes of the values they set: empty, tiny, and more than fits beside
/// an inode; the largest is over what the file system takes, and the
/// step then does nothing.
const XATTR_SIZES: [usize; 7] = [0, 0, 1, 3, 300, 3000, 65536];

/// One operation: its kind and its line of `sh`, or what it does from the
/// host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// What it does.
    pub kind: OpKind,
    /// The line; a path that vanished makes it do nothing, never fail.
    pub shell: String,
    /// Done from the host instead, after the step's lines.
    pub behind: Option<Behind>,
}

/// A change made from the host, through the container's
/// `/proc/<pid>/root` ([`super::behind`]); one the file system refuses
/// (a value too large, a symlink, a path gone) does nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behind {
    /// Sets attribute `name` of `path` to `value`.
    SetXattr {
        /// Absolute in the sandbox.
        path: Vec<u8>,
        /// The attribute.
        name: &'static str,
        /// Any bytes.
        value: Vec<u8>,
    },
    /// Removes attribute `name` of `path`.
    RemoveXattr {
        /// Absolute in the sandbox.
        path: Vec<u8>,
        /// The attribute.
        name: &'static str,
    },
}

impl Behind {
    /// What it does, in a few words (the step's script shows it as a
    /// comment-like no-op line).
    pub fn describe(&self) -> String {
        match self {
            Self::SetXattr { path, name, value } => format!(
                "from the host, set {name} ({} bytes) on {}",
                value.len(),
                String::from_utf8_lossy(path)
            ),
            Self::RemoveXattr { path, name } => format!(
                "from the host, remove {name} from {}",
                String::from_utf8_lossy(path)
            ),
        }
    }
}

impl Behind {
    /// The command that does it on the host, as root, with `PID` the
    /// container's init.
    pub fn command(&self) -> String {
        let at = |path: &[u8]| format!("\"/proc/$PID/root{}\"", String::from_utf8_lossy(path));
        match self {
            Self::SetXattr { path, name, value } => {
                let hex: String = value.iter().map(|b| format!("{b:02x}")).collect();
                let value = if hex.is_empty() {
                    "\"\"".to_owned()
                } else {
                    format!("0x{hex}")
                };
                format!("setfattr -h -n {name} -v {value} {}", at(path))
            }
            Self::RemoveXattr { path, name } => format!("setfattr -h -x {name} {}", at(path)),
        }
    }
}

/// `chmod` or `chown` of the root directory itself.
fn root(rng: &mut Rng) -> String {
    if rng.chance(50) {
        let mode = rng.pick(&[0o755, 0o1777, 0o700, 0o751, 0o2755, 0o775]);
        format!("chmod {mode:o} /")
    } else {
        let id = rng.pick(&[0, 1000, 65534]);
        format!("chown {id}:{id} /")
    }
}

impl Op {
    /// The line that makes the work area, first in every plan.
    pub fn make_work_area() -> Self {
        Self {
            kind: OpKind::Mkdir,
            shell: format!("mkdir -p {WORK}"),
            behind: None,
        }
    }

    /// The line as a step runs it: never failing (the step's script sends
    /// errors away once, for all its lines).
    pub fn guarded(&self) -> String {
        format!("{{ {}; }} || true", self.shell)
    }
}

/// Roughly what exists, so operations aim at something. Paths are kept as
/// they are written inside double quotes in `sh`: a name that is not
/// UTF-8 is a `$(printf '…')` in it.
#[derive(Debug, Clone)]
pub struct Model {
    /// Files (and links, pipes) steps made, and the image files they may touch.
    files: Vec<String>,
    /// Directories steps made (the work area first).
    dirs: Vec<String>,
    /// For fresh names: never reused in a plan, so a stale path never
    /// comes back as something else.
    counter: u64,
    /// Whether steps may change the image's own files and directories
    /// (they still make new files in its directories either way).
    touches_image: bool,
}

impl Default for Model {
    fn default() -> Self {
        Self::new(true)
    }
}

impl Model {
    /// A model whose steps change the image's own files and directories
    /// only if `touches_image`: a provider's template is not in silo's
    /// store, so on E2B and Daytona a rewind to before such a change takes
    /// a new VM, as documented, rather than the in-place rewind a run
    /// checks.
    pub fn new(touches_image: bool) -> Self {
        let image_files = IMAGE_FILES.iter().map(|f| (*f).to_owned());
        Self {
            files: if touches_image {
                image_files.collect()
            } else {
                Vec::new()
            },
            dirs: vec![WORK.to_owned()],
            counter: 0,
            touches_image,
        }
    }

    /// One operation of `kind`.
    pub fn op(&mut self, rng: &mut Rng, kind: OpKind) -> Op {
        if kind == OpKind::Xattr {
            let behind = self.xattr(rng);
            return Op {
                kind,
                shell: format!(": '{}'", behind.describe()),
                behind: Some(behind),
            };
        }
        let shell = match kind {
            OpKind::Write => self.write(rng),
            OpKind::Append => self.append(rng),
            OpKind::Truncate => self.truncate(rng),
            OpKind::Mkdir => self.mkdir(rng),
            OpKind::Rm => self.rm(rng),
            OpKind::RmDir => self.rm_dir(rng),
            OpKind::Mv => self.mv(rng),
            OpKind::MvDir => self.mv_dir(rng),
            OpKind::Symlink => self.symlink(rng),
            OpKind::HardLink => self.hard_link(rng),
            OpKind::Chmod => self.chmod(rng),
            OpKind::Chown => self.chown(rng),
            OpKind::Touch => self.touch(rng),
            OpKind::Mkfifo => self.mkfifo(rng),
            OpKind::OddName => self.odd_name(rng),
            OpKind::LongName => self.long_name(rng),
            OpKind::Deep => self.deep(rng),
            OpKind::RmImage => self.rm_image(rng),
            OpKind::Replace => self.replace(rng),
            OpKind::SwapLink => self.swap_link(rng),
            OpKind::BigFile => self.big_file(rng),
            OpKind::Sparse => self.sparse(rng),
            OpKind::Root => root(rng),
            OpKind::Xattr => unreachable!("done from the host, above"),
        };
        Op {
            kind,
            shell,
            behind: None,
        }
    }

    /// An attribute set or removed on the root, a directory or a file a
    /// step made (one whose name is plain: the host takes it as it is).
    fn xattr(&mut self, rng: &mut Rng) -> Behind {
        let plain = |path: &&String| !path.contains('$') && !path.contains('\\');
        let path = if rng.chance(20) {
            "/".to_owned()
        } else if rng.chance(40) {
            let dirs: Vec<&String> = self.dirs.iter().filter(plain).collect();
            (*rng.pick(&dirs)).clone()
        } else {
            let files: Vec<&String> = self.files.iter().filter(plain).collect();
            match files.is_empty() {
                true => WORK.to_owned(),
                false => (*rng.pick(&files)).clone(),
            }
        };
        let (path, name) = (path.into_bytes(), *rng.pick(&XATTR_NAMES));
        if rng.chance(25) {
            return Behind::RemoveXattr { path, name };
        }
        let size = *rng.pick(&XATTR_SIZES);
        // Bytes a text parser trips on, often: newlines, NULs, `=`, high bytes.
        let value = (0..size)
            .map(|_| match rng.below(4) {
                0 => *rng.pick(&[b'\n', 0, b'=', 0xff]),
                _ => rng.below(256) as u8,
            })
            .collect();
        Behind::SetXattr { path, name, value }
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.counter += 1;
        format!("{prefix}{}", self.counter)
    }

    /// A directory to make something in: one of the image's half the
    /// time, since a new file below an untouched image directory is what
    /// a walk pruned by times misses.
    fn some_dir(&self, rng: &mut Rng) -> String {
        let dir = if rng.chance(50) {
            (*rng.pick(&IMAGE_DIRS)).to_owned()
        } else {
            rng.pick(&self.dirs).clone()
        };
        if dir.len() > PATH_BUDGET {
            WORK.to_owned()
        } else {
            dir
        }
    }

    /// A directory a step made (never one of the image's).
    fn made_dir(&self, rng: &mut Rng) -> Option<String> {
        let made: Vec<&String> = self.dirs.iter().filter(|d| *d != WORK).collect();
        (!made.is_empty()).then(|| (*rng.pick(&made)).clone())
    }

    /// A file, often one just made.
    fn some_file(&self, rng: &mut Rng) -> Option<String> {
        if self.files.is_empty() {
            return None;
        }
        // The newest files are the likeliest to still be there.
        let recent = self.files.len().saturating_sub(8);
        let index = if rng.chance(60) {
            recent + rng.index(self.files.len() - recent)
        } else {
            rng.index(self.files.len())
        };
        Some(self.files[index].clone())
    }

    /// A new path for a file in some directory.
    fn new_file_path(&mut self, rng: &mut Rng) -> String {
        let dir = self.some_dir(rng);
        let name = self.fresh("f");
        format!("{dir}/{name}")
    }

    fn write(&mut self, rng: &mut Rng) -> String {
        let path = match self.some_file(rng) {
            Some(path) if rng.chance(30) => path,
            _ => {
                let path = self.new_file_path(rng);
                self.files.push(path.clone());
                path
            }
        };
        write_file(rng, &path)
    }

    fn append(&mut self, rng: &mut Rng) -> String {
        let Some(path) = self.some_file(rng) else {
            return self.write(rng);
        };
        let size = file_size(rng);
        format!(
            "[ -f \"{path}\" ] && [ ! -L \"{path}\" ] && {} >> \"{path}\"",
            content(rng, size)
        )
    }

    fn truncate(&mut self, rng: &mut Rng) -> String {
        let Some(path) = self.some_file(rng) else {
            return self.write(rng);
        };
        let size = file_size(rng);
        format!("[ -f \"{path}\" ] && [ ! -L \"{path}\" ] && truncate -s {size} \"{path}\"")
    }

    fn mkdir(&mut self, rng: &mut Rng) -> String {
        let mut path = self.some_dir(rng);
        for _ in 0..rng.between(1, 3) {
            path = format!("{path}/{}", self.fresh("d"));
            self.dirs.push(path.clone());
        }
        format!("mkdir -p \"{path}\"")
    }

    fn rm(&mut self, rng: &mut Rng) -> String {
        match self.some_file(rng) {
            Some(path) => format!("rm -f \"{path}\""),
            None => self.write(rng),
        }
    }

    fn rm_dir(&mut self, rng: &mut Rng) -> String {
        match self.made_dir(rng) {
            Some(dir) => format!("rm -rf \"{dir}\""),
            None => self.mkdir(rng),
        }
    }

    fn mv(&mut self, rng: &mut Rng) -> String {
        let Some(from) = self.some_file(rng) else {
            return self.write(rng);
        };
        let to = match self.some_file(rng) {
            Some(over) if rng.chance(30) && over != from && may_change_type(&over) => over,
            _ => {
                let to = self.new_file_path(rng);
                self.files.push(to.clone());
                to
            }
        };
        format!("mv -f \"{from}\" \"{to}\"")
    }

    fn mv_dir(&mut self, rng: &mut Rng) -> String {
        let Some(from) = self.made_dir(rng) else {
            return self.mkdir(rng);
        };
        let parent = self.some_dir(rng);
        let to = format!("{parent}/{}", self.fresh("m"));
        // What was under the old name is under the new one now.
        let prefix = format!("{from}/");
        let moved = |paths: &[String]| -> Vec<String> {
            paths
                .iter()
                .filter_map(|p| p.strip_prefix(&prefix))
                .map(|rest| format!("{to}/{rest}"))
                .collect()
        };
        let (files, dirs) = (moved(&self.files), moved(&self.dirs));
        self.files.extend(files);
        self.dirs.push(to.clone());
        self.dirs.extend(dirs);
        // Into itself fails, which the guard forgives.
        format!("mv \"{from}\" \"{to}\"")
    }

    fn symlink(&mut self, rng: &mut Rng) -> String {
        let target = self.link_target(rng);
        match self.some_file(rng) {
            // `-f` replaces a file or link; a directory (or a link to one)
            // would get the new link inside it instead.
            Some(over) if rng.chance(30) && may_change_type(&over) => {
                format!("[ ! -d \"{over}\" ] && ln -sf \"{target}\" \"{over}\"")
            }
            _ => {
                let path = self.new_file_path(rng);
                self.files.push(path.clone());
                format!("ln -s \"{target}\" \"{path}\"")
            }
        }
    }

    /// Where a link points: a sibling, a relative climb, an absolute path
    /// of the work area or a file, nowhere, or a name that is not UTF-8.
    /// Never an image directory, so no path the model makes runs through
    /// a link into the image.
    fn link_target(&mut self, rng: &mut Rng) -> String {
        match rng.below(6) {
            0 => self
                .some_file(rng)
                .map(|f| f.rsplit('/').next().unwrap_or("x").to_owned())
                .unwrap_or_else(|| "x".to_owned()),
            1 => format!("../{}", self.fresh("up")),
            2 => self.some_file(rng).unwrap_or_else(|| WORK.to_owned()),
            3 => format!("/nowhere/{}", self.fresh("n")),
            4 => odd_target(rng),
            _ => odd_bytes(rng),
        }
    }

    fn hard_link(&mut self, rng: &mut Rng) -> String {
        let Some(from) = self.some_file(rng) else {
            return self.write(rng);
        };
        let to = self.new_file_path(rng);
        self.files.push(to.clone());
        format!("ln \"{from}\" \"{to}\"")
    }

    /// A file or a directory, the image's directories included.
    fn some_path(&self, rng: &mut Rng) -> String {
        match rng.below(3) {
            0 if self.touches_image => (*rng.pick(&IMAGE_DIRS)).to_owned(),
            1 => rng.pick(&self.dirs).clone(),
            _ => self
                .some_file(rng)
                .unwrap_or_else(|| rng.pick(&self.dirs).clone()),
        }
    }

    fn chmod(&mut self, rng: &mut Rng) -> String {
        let path = self.some_path(rng);
        // Special bits half the time; the rest anything at all.
        let special = if rng.chance(50) && !ENGINE_MAKES.contains(&path.as_str()) {
            *rng.pick(&[0o4000, 0o2000, 0o1000, 0o6000, 0o7000])
        } else {
            0
        };
        let mode = special | rng.below(0o1000);
        // Through a link would change its target (an applet's is busybox).
        format!("[ ! -L \"{path}\" ] && chmod {mode:04o} \"{path}\"")
    }

    fn chown(&mut self, rng: &mut Rng) -> String {
        let path = self.some_path(rng);
        let id = |rng: &mut Rng| match rng.below(4) {
            0 => 0,
            1 => 65534,
            2 => rng.between(1, 1000),
            _ => rng.between(1001, 70000),
        };
        let (uid, gid) = (id(rng), id(rng));
        format!("chown -h {uid}:{gid} \"{path}\"")
    }

    fn touch(&mut self, rng: &mut Rng) -> String {
        let path = match self.some_file(rng) {
            Some(file) if rng.chance(80) => file,
            _ => self.some_path(rng),
        };
        // From 1970 to 2038, and a little past (busybox takes 64 bits).
        let seconds = rng.below(1 << 31) + if rng.chance(10) { 1 << 31 } else { 0 };
        format!("touch -c -h -d @{seconds} \"{path}\"")
    }

    fn mkfifo(&mut self, rng: &mut Rng) -> String {
        let path = self.new_file_path(rng);
        self.files.push(path.clone());
        format!("mkfifo \"{path}\"")
    }

    fn odd_name(&mut self, rng: &mut Rng) -> String {
        let dir = self.some_dir(rng);
        let path = format!("{dir}/{}{}", odd_bytes(rng), self.fresh("o"));
        self.dir_or_file(rng, path)
    }

    /// A directory at `path` now and then, else a file.
    fn dir_or_file(&mut self, rng: &mut Rng, path: String) -> String {
        if rng.chance(30) {
            let line = format!("mkdir -p \"{path}\"");
            self.dirs.push(path);
            line
        } else {
            let line = write_file(rng, &path);
            self.files.push(path);
            line
        }
    }

    fn long_name(&mut self, rng: &mut Rng) -> String {
        let dir = self.some_dir(rng);
        let tag = self.fresh("L");
        let len = rng.between(100, NAME_MAX) as usize;
        let name = format!("{tag}{}", "l".repeat(len.saturating_sub(tag.len())));
        let path = format!("{dir}/{name}");
        self.dir_or_file(rng, path)
    }

    fn deep(&mut self, rng: &mut Rng) -> String {
        let mut path = format!("{}/{}", self.some_dir(rng), self.fresh("deep"));
        let depth = rng.between(8, 64);
        for level in 0..depth {
            if path.len() > PATH_BUDGET {
                break;
            }
            let _ = write!(path, "/{level}");
        }
        self.dirs.push(path.clone());
        let file = format!("{path}/{}", self.fresh("f"));
        self.files.push(file.clone());
        format!("mkdir -p \"{path}\" && {}", write_file(rng, &file))
    }

    fn rm_image(&mut self, rng: &mut Rng) -> String {
        if !self.touches_image {
            return self.rm(rng);
        }
        format!("rm -f {}", rng.pick(&IMAGE_FILES))
    }

    fn replace(&mut self, rng: &mut Rng) -> String {
        if rng.chance(50) {
            // A file (an image symlink, say) becomes a directory.
            let Some(path) = self.some_file(rng).filter(|p| may_change_type(p)) else {
                return self.mkdir(rng);
            };
            self.dirs.push(path.clone());
            let inside = format!("{path}/{}", self.fresh("f"));
            self.files.push(inside.clone());
            format!(
                "rm -f \"{path}\" && mkdir \"{path}\" && {}",
                write_file(rng, &inside)
            )
        } else {
            // A directory with its contents becomes a file.
            let Some(path) = self.made_dir(rng) else {
                return self.write(rng);
            };
            self.files.push(path.clone());
            format!("rm -rf \"{path}\" && {}", write_file(rng, &path))
        }
    }

    /// A directory moved aside to `DIR.held` and a symlink put at its
    /// path (to a target the model never writes through into the image),
    /// or, where that was done, the link removed and the directory put
    /// back: its entries must come back with it.
    fn swap_link(&mut self, rng: &mut Rng) -> String {
        let Some(dir) = self.made_dir(rng) else {
            return self.mkdir(rng);
        };
        let target = odd_target(rng);
        format!(
            "if [ -L \"{dir}\" ] && [ -d \"{dir}.held\" ]; then rm -f \"{dir}\" && mv \"{dir}.held\" \"{dir}\"; \
             elif [ -d \"{dir}\" ] && [ ! -L \"{dir}\" ] && [ ! -e \"{dir}.held\" ]; then \
             mv \"{dir}\" \"{dir}.held\" && ln -s \"{target}\" \"{dir}\"; fi"
        )
    }

    /// A file of one to four megabytes made, or one changed in place: a
    /// few bytes in the middle, a megabyte appended, or cut shorter.
    fn big_file(&mut self, rng: &mut Rng) -> String {
        let made: Vec<String> = self
            .files
            .iter()
            .filter(|f| f.contains("/big"))
            .cloned()
            .collect();
        if made.is_empty() || rng.chance(30) {
            let path = format!("{}/{}", self.some_dir(rng), self.fresh("big"));
            self.files.push(path.clone());
            let size = rng.between(1 << 20, 4 << 20);
            return format!("yes {:016x} | head -c {size} > \"{path}\"", rng.next_u64());
        }
        let path = rng.pick(&made).clone();
        let guard = format!("[ -f \"{path}\" ] && [ ! -L \"{path}\" ]");
        match rng.below(3) {
            0 => {
                let len = rng.between(1, 48);
                let bytes = content(rng, len);
                let at = rng.below(4 << 20);
                format!(
                    "{guard} && {bytes} | dd of=\"{path}\" bs=1 seek={at} conv=notrunc 2>/dev/null"
                )
            }
            1 => format!(
                "{guard} && yes {:016x} | head -c {} >> \"{path}\"",
                rng.next_u64(),
                rng.between(1, 1 << 20)
            ),
            _ => format!("{guard} && truncate -s {} \"{path}\"", rng.below(4 << 20)),
        }
    }

    /// A sparse file: a size set by `truncate` (a hole to its end) and a
    /// few bytes written into the middle, so it has a hole at each end; or
    /// bytes written into a hole of one there.
    fn sparse(&mut self, rng: &mut Rng) -> String {
        let size = rng.between(64 << 10, 2 << 20);
        let at = rng.between(8 << 10, size - (8 << 10));
        let len = rng.between(1, 48);
        let bytes = content(rng, len);
        match self.some_file(rng).filter(|f| f.contains("/sparse")) {
            Some(path) if rng.chance(40) => format!(
                "[ -f \"{path}\" ] && [ ! -L \"{path}\" ] && {bytes} | dd of=\"{path}\" bs=1 seek={at} conv=notrunc 2>/dev/null"
            ),
            _ => {
                let path = format!("{}/{}", self.some_dir(rng), self.fresh("sparse"));
                self.files.push(path.clone());
                format!(
                    "truncate -s {size} \"{path}\" && {bytes} | dd of=\"{path}\" bs=1 seek={at} conv=notrunc 2>/dev/null"
                )
            }
        }
    }
}

/// A link target that a path tool would tidy (the root, doubled slashes,
/// `.` and `..`, a trailing slash) or a long one; none leads a step's
/// write into the image.
fn odd_target(rng: &mut Rng) -> String {
    let long = format!("/nowhere/{}", "t/".repeat(rng.between(60, 120) as usize));
    let targets = ["/", "//", ".", "..", "./", "a//b", "dir/", "/nowhere//x/."];
    if rng.chance(20) {
        long
    } else {
        (*rng.pick(&targets)).to_owned()
    }
}

/// Whether a step may turn `path` into a directory or a link.
fn may_change_type(path: &str) -> bool {
    !ENGINE_READS.contains(&path)
}

/// A line writing a file at `path` over whatever file is there; a link or
/// pipe there is removed first (writing would follow it, or block).
fn write_file(rng: &mut Rng, path: &str) -> String {
    let size = file_size(rng);
    format!(
        "if [ -L \"{path}\" ] || [ -p \"{path}\" ]; then rm -f \"{path}\"; fi; {} > \"{path}\"",
        content(rng, size)
    )
}

/// A file size: mostly small, sometimes up to [`FILE_MAX`].
fn file_size(rng: &mut Rng) -> u64 {
    match rng.below(10) {
        0 => 0,
        1..=6 => rng.below(1024),
        7..=8 => rng.below(16 * 1024),
        _ => rng.below(FILE_MAX + 1),
    }
}

/// A command printing `size` bytes drawn from the seed: arbitrary bytes
/// (NUL and newline included) when small, a repeated random word when
/// large, so a plan writes the same content every time it is played.
fn content(rng: &mut Rng, size: u64) -> String {
    if size <= 48 {
        let mut escaped = String::new();
        for _ in 0..size {
            let _ = write!(escaped, "\\{:03o}", rng.below(256));
        }
        format!("printf '{escaped}'")
    } else {
        format!("yes {:016x} | head -c {size}", rng.next_u64())
    }
}

/// A few bytes that are not UTF-8 (or are, beyond ASCII), as `sh` makes
/// them inside double quotes.
fn odd_bytes(rng: &mut Rng) -> String {
    let bytes = rng.pick(&[
        "x\\377y",
        "\\300\\200",
        "a\\200b",
        "\\303",
        "\\303\\251t\\303\\251",
        "sp ace\\tt",
    ]);
    format!("$(printf '{bytes}')")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_line_touches_the_tools_steps_need() {
        let mut rng = Rng::new(1);
        let mut model = Model::default();
        for _ in 0..5000 {
            let kind = *rng.pick(&OpKind::ALL);
            let op = model.op(&mut rng, kind);
            for tool in ["/bin/busybox", "/bin/sh", "/usr/bin/head", "/usr/bin/yes"] {
                assert!(!op.shell.contains(&format!("{tool}\"")), "{op:?}");
            }
            assert!(!op.shell.contains("rm -rf \"/usr\""), "{op:?}");
        }
    }
}
