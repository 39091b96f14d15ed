//! The signals that end a command that runs until told to stop (`status --watch`, `console`):
//! Ctrl-C, a SIGTERM, or the terminal going away.

use tokio::signal::unix::{signal, Signal, SignalKind};

/// SIGINT, SIGTERM and SIGHUP, watched from before the command's first step.
pub(crate) struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl StopSignals {
    /// `None` when the signals cannot be watched (no signal driver).
    pub(crate) fn watch() -> Option<StopSignals> {
        Some(StopSignals {
            interrupt: signal(SignalKind::interrupt()).ok()?,
            terminate: signal(SignalKind::terminate()).ok()?,
            hangup: signal(SignalKind::hangup()).ok()?,
        })
    }

    /// Resolves when one of the signals arrives.
    pub(crate) async fn stopped(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
            _ = self.hangup.recv() => {}
        }
    }
}
