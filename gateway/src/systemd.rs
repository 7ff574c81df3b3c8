//! The service manager's readiness protocol (`sd_notify`): a systemd unit of `Type=notify`
//! learns from these datagrams when the gateway serves, reloads and stops, so `systemctl start`
//! returns once the listeners are bound and `systemctl reload` once the new configuration is
//! in place (or refused). Without `NOTIFY_SOCKET` in the environment every call does nothing.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The listeners are bound and the first configuration serves.
pub fn ready() {
    notify("READY=1\nSTATUS=serving");
}

/// A reload starts; [`reloaded`] follows when it is over, whatever its outcome.
pub fn reloading() {
    notify(&format!(
        "RELOADING=1\nSTATUS=reloading\nMONOTONIC_USEC={}",
        monotonic_micros()
    ));
}

/// A reload is over: the new configuration serves, or the old one still does.
pub fn reloaded(ok: bool) {
    notify(if ok {
        "READY=1\nSTATUS=serving"
    } else {
        "READY=1\nSTATUS=serving; the last reload was refused (see the log)"
    });
}

/// Shutdown starts: connections drain.
pub fn stopping() {
    notify("STOPPING=1\nSTATUS=draining connections");
}

/// Sends one state datagram. Failures are logged at debug only: a service manager that went
/// away must not stop the gateway, and there is no one else to tell.
fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let result = UnixDatagram::unbound().and_then(|socket| {
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
        match bytes.strip_prefix(b"@") {
            // A leading `@` names a socket in the abstract namespace.
            Some(name) => {
                let addr = SocketAddr::from_abstract_name(name)?;
                socket.send_to_addr(state.as_bytes(), &addr)
            }
            None => socket.send_to(state.as_bytes(), &path),
        }
    });
    if let Err(e) = result {
        tracing::debug!(error = %e, "cannot notify the service manager");
    }
}

/// `CLOCK_MONOTONIC` in microseconds, which systemd compares a reload's start with.
fn monotonic_micros() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    #[allow(
        unsafe_code,
        reason = "clock_gettime, which std does not expose by clock"
    )]
    // SAFETY: `now` is a valid timespec the call writes into.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    if rc != 0 {
        return 0;
    }
    (now.tv_sec as u64) * 1_000_000 + (now.tv_nsec as u64) / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_moves_forward() {
        let a = monotonic_micros();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = monotonic_micros();
        assert!(a > 0 && b >= a + 1_000, "{a} then {b}");
    }
}
