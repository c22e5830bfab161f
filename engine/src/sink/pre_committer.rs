//! A writer's background pre-commits ([`TransactionalWriter::pre_commit_then`]): one thread
//! per writer runs them one at a time, in the order they were handed over (barrier order), and
//! hands each outcome to its callback.
//!
//! [`TransactionalWriter::pre_commit_then`]: super::TransactionalWriter::pre_commit_then

use std::thread::JoinHandle;

use crossbeam_channel::Sender;

use super::two_phase::{Committable, PreCommitted, SinkError};

/// The work of one pre-commit: makes a transaction durable and describes it.
pub type PreCommitWork = Box<dyn FnOnce() -> Result<Vec<Committable>, SinkError> + Send>;

/// The pre-committing thread of one writer. Dropping it waits for the queued pre-commits.
pub struct PreCommitter {
    /// The sink (operator name and where it writes), for errors.
    sink: String,
    jobs: Option<Sender<(PreCommitWork, PreCommitted)>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for PreCommitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PreCommitter({})", self.sink)
    }
}

impl PreCommitter {
    /// Starts the thread (named `thread`) of a writer of `sink`.
    ///
    /// # Errors
    /// [`SinkError::External`] when the thread cannot be spawned.
    pub fn start(sink: &str, thread: String) -> Result<PreCommitter, SinkError> {
        let (tx, rx) = crossbeam_channel::unbounded::<(PreCommitWork, PreCommitted)>();
        let name = sink.to_string();
        let handle = std::thread::Builder::new()
            .name(thread)
            .spawn(move || {
                for (work, done) in rx {
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
                        .unwrap_or_else(|_| Err(gone(&name, "the pre-commit panicked")));
                    done(outcome);
                }
            })
            .map_err(|e| {
                gone(
                    sink,
                    &format!("cannot spawn the pre-committing thread: {e}"),
                )
            })?;
        Ok(PreCommitter {
            sink: sink.to_string(),
            jobs: Some(tx),
            thread: Some(handle),
        })
    }

    /// Queues `work`; `done` receives its outcome on the pre-committing thread, after every
    /// work queued before it finished.
    pub fn submit(&self, work: PreCommitWork, done: PreCommitted) {
        let Some(jobs) = &self.jobs else {
            return done(Err(gone(&self.sink, "the pre-committing thread ended")));
        };
        if let Err(crossbeam_channel::SendError((_, done))) = jobs.send((work, done)) {
            done(Err(gone(&self.sink, "the pre-committing thread ended")));
        }
    }

    /// Runs `work` after every queued work and returns its outcome.
    ///
    /// # Errors
    /// The work's [`SinkError`], or [`SinkError::External`] when the thread is gone.
    pub fn run(&self, work: PreCommitWork) -> Result<Vec<Committable>, SinkError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.submit(
            work,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.recv()
            .unwrap_or_else(|_| Err(gone(&self.sink, "the pre-committing thread ended")))
    }
}

impl Drop for PreCommitter {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn gone(sink: &str, reason: &str) -> SinkError {
    SinkError::External {
        sink: sink.to_string(),
        action: "pre-commit",
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A mock pre-commit: blocks until `gate` receives, then returns `[n]` (or an error for
    /// a negative `n`).
    fn mock_work(n: i64, gate: crossbeam_channel::Receiver<()>) -> PreCommitWork {
        Box::new(move || {
            gate.recv().unwrap();
            if n < 0 {
                return Err(gone("mock", "mock failure"));
            }
            Ok(vec![serde_json::json!(n)])
        })
    }

    #[test]
    fn outcomes_arrive_in_submission_order_and_submit_does_not_wait() {
        let p = PreCommitter::start("mock", "mock-pre-commit".into()).unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let (open1, gate1) = crossbeam_channel::bounded(1);
        let (open2, gate2) = crossbeam_channel::bounded(1);
        for (n, gate) in [(1, gate1), (-2, gate2)] {
            let got = got.clone();
            p.submit(
                mock_work(n, gate),
                Box::new(move |r| got.lock().unwrap().push(r.map_err(|e| e.to_string()))),
            );
        }
        // Both are queued and neither may have finished: their gates are closed.
        assert!(got.lock().unwrap().is_empty());
        // The second's gate opens first; it still finishes after the first.
        open2.send(()).unwrap();
        open1.send(()).unwrap();
        let (open3, gate3) = crossbeam_channel::bounded(1);
        open3.send(()).unwrap();
        assert_eq!(
            p.run(mock_work(3, gate3)).unwrap(),
            vec![serde_json::json!(3)]
        );
        let got = got.lock().unwrap();
        assert_eq!(got.len(), 2, "run waits for the queued pre-commits");
        assert_eq!(got[0].as_ref().unwrap(), &vec![serde_json::json!(1)]);
        assert!(got[1].as_ref().unwrap_err().contains("mock failure"));
    }

    #[test]
    fn drop_waits_for_queued_pre_commits_and_a_panic_is_an_error() {
        let got = Arc::new(Mutex::new(Vec::new()));
        {
            let p = PreCommitter::start("mock", "mock-pre-commit".into()).unwrap();
            let g = got.clone();
            p.submit(
                Box::new(|| panic!("mock panic")),
                Box::new(move |r| g.lock().unwrap().push(r.is_err())),
            );
            let (open, gate) = crossbeam_channel::bounded(1);
            open.send(()).unwrap();
            let g = got.clone();
            p.submit(
                mock_work(7, gate),
                Box::new(move |r| g.lock().unwrap().push(r.is_err())),
            );
        }
        assert_eq!(*got.lock().unwrap(), vec![true, false]);
    }
}
