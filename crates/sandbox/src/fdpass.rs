//! A descriptor passed over a Unix socket with its message (`SCM_RIGHTS`), and the peer's uid:
//! how a parked sandbox's attach connection goes from a bridge to its keeper and back.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The uid of the process at the other end of `conn` (`SO_PEERCRED`).
pub(crate) fn peer_uid(conn: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `conn`'s descriptor is open for the call; `cred` is a live `ucred` and `len`
    // holds its size, so the kernel writes at most `len` bytes into it and updates `len`.
    let r = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred.uid)
}

/// Room for the control message of one descriptor.
// SAFETY: CMSG_SPACE is pure arithmetic on its argument; it dereferences nothing.
const CONTROL: usize = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;

/// A control buffer of [`CONTROL`] bytes aligned for a `cmsghdr`, so its headers can be read
/// and written in place.
#[repr(C)]
union Control {
    _header: libc::cmsghdr,
    bytes: [u8; CONTROL],
}

impl Control {
    fn new() -> Self {
        Control {
            bytes: [0; CONTROL],
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: every bit pattern is a valid `[u8; CONTROL]`, and `new` initialised all of it.
        unsafe { &mut self.bytes }
    }
}

/// A message of one buffer, `iov`, and the control buffer `control` ([`CONTROL`] bytes).
fn message(iov: &mut libc::iovec, control: &mut [u8]) -> libc::msghdr {
    // SAFETY: `msghdr` is plain C data (integers and raw pointers); all-zero is a valid
    // value (null pointers, zero lengths), and every field used is set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len() as _;
    msg
}

/// Send `data` with descriptor `fd` attached (`SCM_RIGHTS`), in one message.
pub(crate) fn send_fd(conn: &UnixStream, data: &[u8], fd: RawFd) -> std::io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut control = Control::new();
    let msg = message(&mut iov, control.bytes());
    // SAFETY: `msg_control` points to `control`, `CONTROL` = CMSG_SPACE(size of one fd) bytes,
    // alive and not otherwise accessed here; that is at least a `cmsghdr`, so CMSG_FIRSTHDR is
    // non-null, and the header plus one fd (CMSG_LEN) fit in it. The buffer is aligned for a
    // `cmsghdr` ([`Control`]), so its fields are written in place; the fd is written unaligned.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
    }
    // SAFETY: `conn`'s descriptor is open; `msg` points to `iov` (`data`, `data.len()`
    // bytes, only read) and to `control` (`CONTROL` bytes, holding the header written
    // above), all of which are alive and not otherwise accessed until sendmsg returns.
    let n = unsafe { libc::sendmsg(conn.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if (n as usize) < data.len() {
        (&*conn).write_all(&data[n as usize..])?;
    }
    Ok(())
}

/// Receive one message of at most `max` bytes and the descriptor attached to it, if any
/// (close-on-exec).
pub(crate) fn recv_fd(
    conn: &UnixStream,
    max: usize,
) -> std::io::Result<(Vec<u8>, Option<OwnedFd>)> {
    let mut buf = vec![0u8; max];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = Control::new();
    let msg = message(&mut iov, control.bytes());
    let mut msg = msg;
    // SAFETY: `conn`'s descriptor is open; `msg` points to `iov` (`buf`, `buf.len()` bytes)
    // and `control` (`CONTROL` bytes), all alive and not otherwise accessed during the call,
    // so the kernel writes within them only and sets `msg_controllen` to what it wrote.
    let n = unsafe { libc::recvmsg(conn.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut fd = None;
    // SAFETY: recvmsg succeeded, so `msg_controllen` is what the kernel wrote into `control`
    // (alive, `CONTROL` bytes); CMSG_FIRSTHDR/CMSG_NXTHDR only yield headers within it, or
    // null. An SCM_RIGHTS header carries at least one fd (room for only one), read unaligned;
    // each received fd is new in this process and owned by nothing else, so `OwnedFd` takes it.
    // `control` is aligned for a `cmsghdr` ([`Control`]), so headers are read in place.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let got = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
                // Only one is ever sent; a second would be closed with its OwnedFd.
                if fd.is_none() {
                    fd = Some(OwnedFd::from_raw_fd(got));
                } else {
                    drop(OwnedFd::from_raw_fd(got));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    buf.truncate(n as usize);
    Ok((buf, fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_descriptor_and_its_message_cross_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut r, w) = UnixStream::pair().unwrap();
        send_fd(&a, b"{\"x\":1}", w.as_raw_fd()).unwrap();
        drop(w);
        let (data, fd) = recv_fd(&b, 1024).unwrap();
        assert_eq!(data, b"{\"x\":1}");
        // The received descriptor is the same socket: what is written on it reaches `r`.
        let mut got = UnixStream::from(fd.expect("a descriptor"));
        got.write_all(b"hi").unwrap();
        drop(got);
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hi");
    }
}
