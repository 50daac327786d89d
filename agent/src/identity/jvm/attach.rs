//! HotSpot's attach mechanism, as `jcmd` and `jstack` use it: the agent asks a running JVM for
//! a thread dump over the UNIX socket the JVM opens for attach clients.
//!
//! The protocol (HotSpot's `attachListener_linux.cpp`): the JVM listens on
//! `/tmp/.java_pid<pid>` once its attach listener has started; a client that finds no socket
//! creates `.attach_pid<pid>` (in the JVM's working directory, or its `/tmp`) and sends the
//! JVM `SIGQUIT`, on which the JVM starts the listener instead of printing a thread dump. A
//! request is five NUL-terminated strings — the protocol version `1`, the command and three
//! arguments — and the answer a status line (`0` when the command ran) and the command's output,
//! until the JVM closes the connection. `<pid>` is the JVM's own, in its PID namespace; the
//! files are reached through `/proc/<pid>/root` and `/proc/<pid>/cwd`, so a container's JVM
//! is attached from the host. HotSpot accepts a client of its own effective uid and gid, or
//! root.
//!
//! `SIGQUIT` kills a JVM that does not handle it (`-Xrs`, a JVM that is not HotSpot): the
//! signal is sent only to a process whose `/proc/<pid>/status` says it catches `SIGQUIT`, and
//! never to one started with `-XX:+DisableAttachMechanism` (which would print a thread dump on
//! its standard output for each attempt instead).

use std::{
    io::{Read as _, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use thiserror::Error;

/// Why a JVM could not be asked.
#[derive(Debug, Error)]
pub enum AttachError {
    #[error("process {0} is gone or its /proc entry cannot be read")]
    Gone(u32),
    #[error("process {0} does not catch SIGQUIT (-Xrs, or not HotSpot): not signalled")]
    NoQuitHandler(u32),
    #[error("process {0} was started with -XX:+DisableAttachMechanism")]
    Disabled(u32),
    #[error("cannot create the attach trigger {path}")]
    Trigger {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("process {0} did not open its attach socket within {1:?}")]
    NoSocket(u32, Duration),
    #[error("attach socket of process {pid}")]
    Socket {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("process {pid} refused the command (status {status})")]
    Refused { pid: u32, status: String },
    #[error("process {pid}'s answer is larger than {limit} bytes")]
    TooLarge { pid: u32, limit: usize },
}

/// The most a thread dump may be: a JVM of ten thousand threads with deep stacks prints a few
/// MiB (a JSON dump of virtual threads about 1 KiB a thread).
const MAX_ANSWER: usize = 32 << 20;

/// Bit of `SIGQUIT` (3) in `/proc/<pid>/status`'s `SigCgt` mask.
const SIGQUIT_BIT: u64 = 1 << (libc::SIGQUIT - 1);

/// Asks the JVM `tgid` (the host's PID) for a thread dump (`jstack`'s, without the ownable
/// synchronizers, which cost a walk of the heap). `timeout` bounds the wait for the listener to
/// start and each read of the answer.
pub fn thread_dump(tgid: u32, timeout: Duration) -> Result<String, AttachError> {
    let (mut stream, _) = connect(tgid, timeout)?;
    request(&mut stream, tgid, timeout, "threaddump", ["", "", ""])
}

/// Runs a diagnostic command in the JVM `tgid`, as `jcmd <pid> <command>` does: its output.
/// A JVM that does not know the command answers with an error status.
pub fn jcmd(tgid: u32, timeout: Duration, command: &str) -> Result<String, AttachError> {
    let (mut stream, _) = connect(tgid, timeout)?;
    request(&mut stream, tgid, timeout, "jcmd", [command, "", ""])
}

/// Asks the JVM `tgid` for a thread dump that lists its virtual threads (`jcmd <pid>
/// Thread.dump_to_file -format=json`, JDK 21 and later), in JSON. The JVM writes it to a file
/// of its own `/tmp`, read here through `/proc/<pid>/root` and removed. A JVM before 21 does
/// not know the command.
pub fn virtual_thread_dump(tgid: u32, timeout: Duration) -> Result<String, AttachError> {
    let (mut stream, ns_pid) = connect(tgid, timeout)?;
    // Named by the agent's pid too: two agents on one node never share a file.
    let name = format!(".stormwatch-threads-{}-{ns_pid}.json", std::process::id());
    let command = format!("Thread.dump_to_file -format=json -overwrite /tmp/{name}");
    let answer = request(&mut stream, tgid, timeout, "jcmd", [&command, "", ""])?;
    let tmp = Path::new("/proc").join(tgid.to_string()).join("root/tmp");
    let read = read_own_file(&tmp, &name, tgid);
    let _ = std::fs::remove_file(tmp.join(&name));
    match read {
        Err(AttachError::Socket { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            // No file: the JVM's answer says why.
            Err(AttachError::Refused {
                pid: tgid,
                status: answer.lines().next().unwrap_or("").trim().to_owned(),
            })
        }
        other => other,
    }
}

/// Reads the file `name` the JVM wrote in its `/tmp` (`dir`, seen through `/proc/<pid>/root`):
/// only a regular file reached without a symbolic link, which would resolve in the agent's
/// root, not the container's.
fn read_own_file(dir: &Path, name: &str, tgid: u32) -> Result<String, AttachError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source| AttachError::Socket { pid: tgid, source };
    if !std::fs::symlink_metadata(dir).map_err(io)?.is_dir() {
        return Err(io(std::io::Error::other(
            "the JVM's /tmp is not a directory",
        )));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(dir.join(name))
        .map_err(io)?;
    if !file.metadata().map_err(io)?.is_file() {
        return Err(io(std::io::Error::other("the dump is not a regular file")));
    }
    String::from_utf8(read_bounded(file, tgid)?)
        .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// A connection to the JVM's attach socket, its listener started first where it is not yet,
/// and the JVM's pid in its own namespace.
fn connect(tgid: u32, timeout: Duration) -> Result<(UnixStream, u32), AttachError> {
    let proc = Path::new("/proc").join(tgid.to_string());
    let status = crate::files::kernel_text(proc.join("status")).ok_or(AttachError::Gone(tgid))?;
    let ns_pid = ns_pid(&status).unwrap_or(tgid);
    let socket = proc.join(format!("root/tmp/.java_pid{ns_pid}"));
    let stream = match UnixStream::connect(&socket) {
        Ok(s) => s,
        Err(_) => {
            start_listener(tgid, ns_pid, &proc, &status, timeout)?;
            UnixStream::connect(&socket)
                .map_err(|source| AttachError::Socket { pid: tgid, source })?
        }
    };
    Ok((stream, ns_pid))
}

/// Sends `SIGQUIT` with the trigger file in place, and waits for the socket.
fn start_listener(
    tgid: u32,
    ns_pid: u32,
    proc: &Path,
    status: &str,
    timeout: Duration,
) -> Result<(), AttachError> {
    if !catches_sigquit(status) {
        return Err(AttachError::NoQuitHandler(tgid));
    }
    let cmdline = crate::files::kernel_bytes(proc.join("cmdline")).unwrap_or_default();
    if attach_disabled(&cmdline) {
        return Err(AttachError::Disabled(tgid));
    }
    // The working directory first, as HotSpot looks there first; its /tmp where the working
    // directory is not writable.
    let name = format!(".attach_pid{ns_pid}");
    let candidates = [
        proc.join("cwd").join(&name),
        proc.join("root/tmp").join(&name),
    ];
    let mut last = None;
    let trigger = candidates.into_iter().find_map(|path| {
        match std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
        {
            Ok(_) => Some(path),
            Err(e) => {
                last = Some((path, e));
                None
            }
        }
    });
    let Some(trigger) = trigger else {
        let (path, source) = last.expect("two candidates tried");
        return Err(AttachError::Trigger { path, source });
    };
    let socket = proc.join(format!("root/tmp/.java_pid{ns_pid}"));
    // SAFETY: kill(2) with a plain signal number; the target catches SIGQUIT (checked above).
    let sent = unsafe { libc::kill(tgid as libc::pid_t, libc::SIGQUIT) } == 0;
    let deadline = Instant::now() + timeout;
    let mut opened = false;
    while sent && Instant::now() < deadline {
        if socket.exists() {
            opened = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(&trigger);
    if opened {
        Ok(())
    } else {
        Err(AttachError::NoSocket(tgid, timeout))
    }
}

/// All of `from`, up to [`MAX_ANSWER`] bytes: more is an error.
fn read_bounded(from: impl std::io::Read, tgid: u32) -> Result<Vec<u8>, AttachError> {
    let mut all = Vec::new();
    from.take(MAX_ANSWER as u64 + 1)
        .read_to_end(&mut all)
        .map_err(|source| AttachError::Socket { pid: tgid, source })?;
    if all.len() > MAX_ANSWER {
        return Err(AttachError::TooLarge {
            pid: tgid,
            limit: MAX_ANSWER,
        });
    }
    Ok(all)
}

/// One request, its whole answer.
fn request(
    stream: &mut UnixStream,
    tgid: u32,
    timeout: Duration,
    command: &str,
    args: [&str; 3],
) -> Result<String, AttachError> {
    let io = |source| AttachError::Socket { pid: tgid, source };
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let mut message = Vec::with_capacity(64);
    for part in ["1", command].into_iter().chain(args) {
        message.extend_from_slice(part.as_bytes());
        message.push(0);
    }
    stream.write_all(&message).map_err(io)?;
    let answer = read_bounded(&*stream, tgid)?;
    let text = String::from_utf8_lossy(&answer);
    let (status, output) = text.split_once('\n').unwrap_or((&text, ""));
    if status.trim() != "0" {
        return Err(AttachError::Refused {
            pid: tgid,
            status: status.trim().to_owned(),
        });
    }
    Ok(output.to_owned())
}

/// The process's PID in its own namespace: the last of `NSpid`'s.
pub fn ns_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Whether `SigCgt` in a `/proc/<pid>/status` has `SIGQUIT`.
pub fn catches_sigquit(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|m| m & SIGQUIT_BIT != 0)
}

/// Whether a command line turns the attach mechanism off.
pub fn attach_disabled(cmdline: &[u8]) -> bool {
    cmdline
        .split(|&b| b == 0)
        .any(|a| a == b"-XX:+DisableAttachMechanism")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jvms_own_pid_is_the_last_of_nspid() {
        assert_eq!(ns_pid("Name:\tjava\nNSpid:\t41234\t7\n"), Some(7));
        assert_eq!(ns_pid("NSpid:\t41234\n"), Some(41234));
        assert_eq!(ns_pid("Name:\tjava\n"), None);
    }

    #[test]
    fn sigquit_is_sent_only_where_it_is_caught() {
        // OpenJDK 17's masks, read from a running JVM: with default flags it catches
        // SIGQUIT, with -Xrs it does not.
        assert!(catches_sigquit(
            "SigIgn:\t0000000000000000\nSigCgt:\t0000000101005ccd\n"
        ));
        assert!(!catches_sigquit("SigCgt:\t0000000101001cc8\n"));
        assert!(!catches_sigquit("SigCgt:\tzz\n"));
        assert!(!catches_sigquit(""));
    }

    #[test]
    fn a_disabled_attach_mechanism_is_read_from_the_command_line() {
        assert!(attach_disabled(
            b"java\0-XX:+DisableAttachMechanism\0-cp\0.\0Main\0"
        ));
        assert!(!attach_disabled(b"java\0-cp\0.\0Main\0"));
        assert!(!attach_disabled(b"java\0-XX:-DisableAttachMechanism\0"));
    }
}
