//! Functions the embedding process runs as TCP connections and UDP sessions open and close, for
//! process-wide accounting this crate knows nothing about (the gateway counts them toward the
//! burst after which it returns free memory to the kernel). Unset, they cost one load each.

use std::sync::OnceLock;

/// What to run when a connection or session opens and when it closes.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionHooks {
    /// Runs when a TCP connection is admitted or a UDP session is created.
    pub opened: fn(),
    /// Runs once for each `opened`, when that connection or session ends.
    pub closed: fn(),
}

static HOOKS: OnceLock<ConnectionHooks> = OnceLock::new();

/// Sets the hooks for the life of the process; a second call is refused (`Err` gives its hooks
/// back), since connections opened under the first hooks must close under them.
pub fn set_connection_hooks(hooks: ConnectionHooks) -> Result<(), ConnectionHooks> {
    HOOKS.set(hooks)
}

pub(crate) fn opened() {
    if let Some(hooks) = HOOKS.get() {
        (hooks.opened)();
    }
}

pub(crate) fn closed() {
    if let Some(hooks) = HOOKS.get() {
        (hooks.closed)();
    }
}
