//! The log phase: once per request, for the filters that saw it; without a task when every
//! filter logs synchronously.

use super::{Shared, State};
use crate::telemetry::trace::{self, TraceCx, with_current};

impl State {
    /// The log phase as far as the filters answer synchronously; `false` when the rest must
    /// be awaited ([`run_log`]).
    fn log_now(&mut self) -> bool {
        while !self.logged && self.log_next < self.started {
            let i = self.log_next;
            if !self.filters[i].on_log_sync(&self.cx, self.status) {
                return false;
            }
            self.log_next = i + 1;
        }
        self.logged = true;
        true
    }
}

/// Runs the log phase (once) for the filters that saw the request, awaiting those that wait.
pub(super) async fn run_log(state: Shared) {
    let mut guard = state.lock().await;
    let st = &mut *guard;
    if st.log_now() {
        return;
    }
    let status = st.status;
    for f in st.filters[st.log_next..st.started].iter_mut() {
        f.on_log(&st.cx, status).await;
    }
    st.logged = true;
}

/// The log phase without a task when every filter logs synchronously; otherwise a task
/// finishes it. Either way under the request's trace.
pub(super) fn log_soon(state: &Shared, trace: Option<&TraceCx>) {
    if let Ok(mut guard) = state.try_lock()
        && with_current(trace, || guard.log_now())
    {
        return;
    }
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(trace::scope_some(trace.cloned(), run_log(state.clone())));
    }
}
