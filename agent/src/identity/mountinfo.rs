//! The one reader of `/proc/<pid>/mountinfo` (proc(5)): the cgroup resolver, the resource
//! limits and the tests' cgroup helpers all find their hierarchies through it.
//!
//! ```text
//! 36 25 0:31 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate
//! (1)(2) (3) (4)  (5)                  (6)      (7)    (8) (9)    (10)    (11)
//! ```
//! A malformed line is skipped, not an error: one odd mount must not hide the others.
//!
//! Not procfs-core's `MountInfo`, which the agent has at hand: it leaves the octal escapes
//! (`\040`) in the root and the mount point, its `MountInfos` fails the whole file on one
//! malformed line, and it keeps the super options in a map, where the tests name a v1
//! hierarchy by them in order. Using it line by line would still need all of this file.

use std::path::PathBuf;

/// One mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// `major:minor` of the filesystem: the same for every mount of one hierarchy.
    pub device: String,
    /// The directory of the filesystem mounted here (`/` for the hierarchy's own root; a
    /// subtree for bind mounts, as inside containers).
    pub root: String,
    pub mount_point: PathBuf,
    pub fs_type: String,
    /// Per-superblock options (for cgroup v1: the controllers, `rw`, `name=systemd`…).
    pub super_options: Vec<String>,
}

impl Mount {
    /// Whether this mount shows its filesystem's root (not a bind mount of a subtree).
    pub fn is_root(&self) -> bool {
        self.root == "/"
    }

    pub fn has_option(&self, option: &str) -> bool {
        self.super_options.iter().any(|o| o == option)
    }
}

/// Every well-formed mount of a mountinfo text.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_line).collect()
}

/// This process's mount table, as text.
pub fn read_text() -> std::io::Result<String> {
    Ok(crate::files::read_text(
        std::path::Path::new("/proc/self/mountinfo"),
        crate::files::Kind::Kernel,
    )?)
}

/// This process's mounts.
pub fn read_self() -> std::io::Result<Vec<Mount>> {
    Ok(parse(&read_text()?))
}

fn parse_line(line: &str) -> Option<Mount> {
    let (left, right) = line.split_once(" - ")?;
    let mut left = left.split_whitespace();
    let device = left.nth(2)?;
    let root = left.next()?;
    let mount_point = left.next()?;
    let mut right = right.split_whitespace();
    let fs_type = right.next()?;
    let _source = right.next()?;
    let super_options = right.next()?;
    Some(Mount {
        device: device.to_owned(),
        root: unescape(root),
        mount_point: PathBuf::from(unescape(mount_point)),
        fs_type: fs_type.to_owned(),
        super_options: super_options.split(',').map(str::to_owned).collect(),
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal `\NNN`.
pub fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match (bytes[i], octal) {
            (b'\\', Some(v)) => {
                out.push(v);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount point of the cgroup v2 hierarchy. Where there are several (bind mounts into
/// containers), a mount of the hierarchy's own root is preferred, then the shortest path.
pub fn v2_root(mounts: &[Mount]) -> Option<PathBuf> {
    mounts
        .iter()
        .filter(|m| m.fs_type == "cgroup2")
        .min_by_key(|m| (!m.is_root(), m.mount_point.as_os_str().len()))
        .map(|m| m.mount_point.clone())
}

/// mountinfo texts of the two host layouts, for the tests of everything that reads mounts.
#[cfg(test)]
pub mod fixtures {
    pub const HYBRID: &str = "\
25 1 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
30 25 0:27 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:28 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
32 30 0:29 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
33 30 0:30 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,cpuset
34 30 0:31 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,pids
35 30 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct
36 30 0:33 / /sys/fs/cgroup/net_cls,net_prio rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,net_cls,net_prio
37 30 0:34 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,memory
";
    pub const PURE_V2: &str = "\
25 1 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_and_unescapes() {
        let m = parse(
            "36 25 0:31 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n\
             garbage\n\
             40 25 0:35 /sub /mnt/a\\040b rw - cgroup cgroup rw,cpu,cpuacct\n",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].device, "0:31");
        assert!(m[0].is_root());
        assert_eq!(m[0].fs_type, "cgroup2");
        assert_eq!(m[1].mount_point, PathBuf::from("/mnt/a b"));
        assert!(!m[1].is_root());
        assert!(m[1].has_option("cpuacct"));
        assert!(!m[1].has_option("cpuset"));
    }

    #[test]
    fn unescapes_octal_only() {
        assert_eq!(unescape("/var/lib/x\\040y"), "/var/lib/x y");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/trailing\\"), "/trailing\\");
    }

    #[test]
    fn v2_root_prefers_the_hierarchy_root_then_the_shortest() {
        let m = parse(
            "1 0 0:31 /kubepods /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n\
             2 0 0:31 / /host/sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
             3 0 0:31 / /x/sys/fs/cgroup/unified/more rw - cgroup2 cgroup2 rw\n",
        );
        assert_eq!(
            v2_root(&m),
            Some(PathBuf::from("/host/sys/fs/cgroup/unified"))
        );
        assert_eq!(v2_root(&parse("1 2 0:3 / /x rw - ext4 /dev/a rw\n")), None);
    }
}
