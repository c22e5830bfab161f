//! The signals that end a run early (SIGINT, SIGTERM, SIGHUP).

use super::*;

/// The signals that stop a run cleanly (with a draining savepoint): SIGINT, SIGTERM and SIGHUP
/// on Unix, Ctrl-C elsewhere. The engine runs in its own process group, so only the controller
/// receives a terminal's Ctrl-C.
pub(super) struct Signals {
    #[cfg(unix)]
    pub(super) int: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    pub(super) term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    pub(super) hup: Option<tokio::signal::unix::Signal>,
}

#[cfg(unix)]
pub(super) async fn next_signal(s: &mut Option<tokio::signal::unix::Signal>) {
    if let Some(s) = s
        && s.recv().await.is_some()
    {
        return;
    }
    std::future::pending::<()>().await;
}

impl Signals {
    pub(super) fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Signals {
                int: signal(SignalKind::interrupt()).ok(),
                term: signal(SignalKind::terminate()).ok(),
                hup: signal(SignalKind::hangup()).ok(),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// Waits for the next signal.
    pub(super) async fn recv(&mut self) -> Interrupt {
        #[cfg(unix)]
        {
            tokio::select! {
                () = next_signal(&mut self.int) => Interrupt::Int,
                () = next_signal(&mut self.term) => Interrupt::Term,
                () = next_signal(&mut self.hup) => Interrupt::Hup,
            }
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
            Interrupt::Int
        }
    }
}
