//! [`PluginError`]: everything that can go wrong loading or running a plugin. The gateway wraps
//! it as the source of its own error enum; the host never panics on a hostile guest, it returns
//! one of these and the embedder replaces the VM.

/// Why a plugin could not be loaded or a guest call failed.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The module file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid WebAssembly module (or use features the engine lacks).
    #[error("compile failed: {0}")]
    Compile(String),
    /// The module imports something the host cannot provide with a matching type, or exports
    /// no proxy-wasm ABI marker.
    #[error("link failed: {0}")]
    Link(String),
    /// `_initialize`, `proxy_on_vm_start` or `proxy_on_configure` failed or returned false.
    #[error("start failed: {0}")]
    Start(String),
    /// The guest trapped (unreachable, a panic, a bad indirect call, a host-side abort).
    #[error("guest trapped: {0}")]
    Trap(String),
    /// The guest passed a pointer or length outside its own memory to a host call.
    #[error("guest passed an out-of-bounds pointer or length to {0}")]
    MemoryAccess(&'static str),
    /// The guest ran past `limits.time` in one call (epoch interruption).
    #[error("guest call ran longer than {0:?}")]
    Timeout(std::time::Duration),
    /// The guest tried to grow its memory past `limits.memory`.
    #[error("guest memory would exceed {0} bytes")]
    MemoryLimit(u64),
    /// The VM is gone (failed earlier and not yet replaced).
    #[error("plugin VM unavailable: {0}")]
    Unavailable(String),
}

impl PluginError {
    /// A short stable label for counters (`trap`, `timeout`, `memory_limit`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Read { .. } => "read",
            Self::Compile(_) => "compile",
            Self::Link(_) => "link",
            Self::Start(_) => "start",
            Self::Trap(_) => "trap",
            Self::MemoryAccess(_) => "memory_access",
            Self::Timeout(_) => "timeout",
            Self::MemoryLimit(_) => "memory_limit",
            Self::Unavailable(_) => "unavailable",
        }
    }
}
