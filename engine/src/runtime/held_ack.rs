//! A sink subtask's acknowledgement held back until its writer's pre-commit finished
//! ([`crate::sink::TransactionalWriter::pre_commit_then`]): sent with the committables when
//! it succeeded; when it failed, the subtask fails as on an error at the barrier (the job is
//! marked failed, the sources stop, and the subtask reports the error when it exits).

use super::*;

/// Why a subtask's background work failed (the first failure), reported when it exits.
pub(super) type BackgroundFailure = Arc<std::sync::Mutex<Option<String>>>;

/// An acknowledgement waiting for its sink's pre-commit.
pub(super) struct HeldAck {
    pub(super) ack: Ack,
    pub(super) acks: Sender<Ack>,
    pub(super) control: Arc<Control>,
    pub(super) failure: BackgroundFailure,
}

impl HeldAck {
    /// Sends the acknowledgement with the pre-commit's committables, or fails the subtask.
    pub(super) fn release(mut self, outcome: Result<Vec<Committable>, SinkError>) {
        match outcome {
            Ok(committables) => {
                self.ack.committables = committables;
                let _ = self.acks.send(self.ack);
            }
            Err(e) => {
                let why = format!(
                    "{}-{}: sink failed: {e}",
                    self.ack.operator, self.ack.subtask
                );
                tracing::error!(operator = %self.ack.operator, subtask = self.ack.subtask, checkpoint = ?self.ack.of, error = %e, "pre-commit failed; the subtask fails");
                self.failure
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(why);
                self.control.failed.store(true, Ordering::SeqCst);
                self.control.stop.store(true, Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn held(acks: Sender<Ack>) -> (HeldAck, Arc<Control>, BackgroundFailure) {
        let control = Arc::new(Control::default());
        let failure = BackgroundFailure::default();
        let ack = Ack {
            of: AckOf::Barrier(3),
            operator: "sink".into(),
            subtask: 1,
            state: None,
            counters: Default::default(),
            committables: Vec::new(),
        };
        let h = HeldAck {
            ack,
            acks,
            control: control.clone(),
            failure: failure.clone(),
        };
        (h, control, failure)
    }

    #[test]
    fn a_finished_pre_commit_sends_the_ack_with_its_committables() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (h, control, failure) = held(tx);
        h.release(Ok(vec![serde_json::json!({"transactionalId": "t-1-0"})]));
        let ack = rx.try_recv().unwrap();
        assert_eq!(ack.of, AckOf::Barrier(3));
        assert_eq!(ack.committables[0]["transactionalId"], "t-1-0");
        assert!(!control.failed.load(Ordering::SeqCst));
        assert!(failure.lock().unwrap().is_none());
    }

    #[test]
    fn a_failed_pre_commit_sends_no_ack_and_fails_the_subtask() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (h, control, failure) = held(tx);
        h.release(Err(SinkError::External {
            sink: "sink (kafka topic out)".into(),
            action: "marker",
            reason: "mock broker gone".into(),
        }));
        assert!(rx.try_recv().is_err(), "no acknowledgement");
        assert!(control.failed.load(Ordering::SeqCst));
        assert!(control.stop.load(Ordering::SeqCst));
        let why = failure.lock().unwrap().clone().unwrap();
        assert!(
            why.starts_with(
                "sink-1: sink failed: sink (kafka topic out): marker: mock broker gone"
            ),
            "{why}"
        );
    }
}
