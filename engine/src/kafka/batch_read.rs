//! Reading a consumer's fetched messages a batch at a time, through librdkafka's
//! `rd_kafka_consume_batch_queue`, which `rdkafka` does not wrap: the partitions a source
//! subtask reads are routed to a queue of its own, and one call takes what they have fetched
//! (up to a batch), where `BaseConsumer::poll` takes one message per call, each with its own
//! clock readings, queue locking and event allocation.
//!
//! The consumer's own queue keeps its events (errors, logs): poll it as well, with
//! `BaseConsumer::poll` (no message of a routed partition arrives there).
//!
//! This is the engine's only `unsafe` code: calls into librdkafka's C API on the handle the
//! consumer owns, and reads of the messages it returns, each freed before the call returns.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// One fetched message, borrowed from the batch it came in (valid during the callback of
/// [`BatchReader::read`]).
#[derive(Debug, Clone, Copy)]
pub struct Fetched<'m> {
    /// The record's key (`None`: a null key).
    pub key: Option<&'m [u8]>,
    /// The record's value (`None`: a null value, a tombstone).
    pub value: Option<&'m [u8]>,
    /// The record's timestamp, ms since the Unix epoch (`None`: the record has none).
    pub timestamp_ms: Option<i64>,
    /// The partition it came from.
    pub partition: i32,
    /// Its offset in that partition.
    pub offset: i64,
}

impl<'m> Fetched<'m> {
    /// The fields of a message `rdkafka` returned (one taken from the consumer's own queue).
    pub fn of(m: &'m impl Message) -> Fetched<'m> {
        Fetched {
            key: m.key(),
            value: m.payload(),
            timestamp_ms: m.timestamp().to_millis(),
            partition: m.partition(),
            offset: m.offset(),
        }
    }
}

/// The partitions of one consumer routed to a queue read a batch at a time. Holds the
/// consumer's handle for its own lifetime; dropping it routes the partitions back (nothing
/// stays forwarded to a freed queue) and frees what the queue still holds.
pub struct BatchReader<'c> {
    consumer: &'c BaseConsumer,
    queue: NonNull<rd::rd_kafka_queue_t>,
    /// The (topic, partition) pairs routed to `queue`.
    routed: Vec<(CString, i32)>,
    /// Room for one batch of message pointers.
    batch: Vec<*mut rd::rd_kafka_message_t>,
}

impl<'c> BatchReader<'c> {
    /// A reader of `consumer`'s partitions once they are [routed](Self::route).
    ///
    /// # Errors
    /// When librdkafka cannot make a queue.
    pub fn new(consumer: &'c BaseConsumer) -> Result<BatchReader<'c>, String> {
        // SAFETY: the handle is the live consumer's, borrowed for the reader's lifetime.
        let queue = unsafe { rd::rd_kafka_queue_new(consumer.client().native_ptr()) };
        let queue = NonNull::new(queue).ok_or("librdkafka could not make a message queue")?;
        Ok(BatchReader {
            consumer,
            queue,
            routed: Vec::new(),
            batch: Vec::new(),
        })
    }

    /// Routes `partition` of `topic` to this reader. Route a partition before it is
    /// assigned, so that none of its messages reaches the consumer's own queue first (they
    /// would be read out of order).
    ///
    /// # Errors
    /// A topic name with a NUL byte, or a partition librdkafka does not give a queue for.
    pub fn route(&mut self, topic: &str, partition: i32) -> Result<(), String> {
        if self
            .routed
            .iter()
            .any(|(t, p)| *p == partition && t.as_bytes() == topic.as_bytes())
        {
            return Ok(());
        }
        let name = CString::new(topic).map_err(|_| format!("topic {topic:?} holds a NUL byte"))?;
        self.forward(&name, partition, self.queue.as_ptr())
            .ok_or_else(|| format!("no queue for partition {partition} of topic {topic}"))?;
        self.routed.push((name, partition));
        Ok(())
    }

    /// Forwards the fetch queue of `partition` of `topic` to `to` (null: to nobody, the
    /// consumer's default). `None` when librdkafka has no queue for it.
    fn forward(&self, topic: &CStr, partition: i32, to: *mut rd::rd_kafka_queue_t) -> Option<()> {
        let rk = self.consumer.client().native_ptr();
        // SAFETY: a live consumer handle and a NUL-terminated topic; the partition's queue
        // handle is a new reference, released right after use.
        unsafe {
            let pq = NonNull::new(rd::rd_kafka_queue_get_partition(
                rk,
                topic.as_ptr(),
                partition,
            ))?;
            rd::rd_kafka_queue_forward(pq.as_ptr(), to);
            rd::rd_kafka_queue_destroy(pq.as_ptr());
        }
        Some(())
    }

    /// Reads up to `max` messages: what the routed partitions have fetched, at once; when
    /// they have nothing, waits up to `wait` for the first message and then takes what else
    /// is there. Calls `each` for every message in order (an error librdkafka reports in the
    /// place of a message: `Err` with its text). Returns how long it waited for the first.
    pub fn read(
        &mut self,
        wait: Duration,
        max: usize,
        mut each: impl FnMut(Result<Fetched<'_>, String>),
    ) -> Duration {
        let max = max.max(1);
        if self.batch.len() < max {
            self.batch.resize(max, std::ptr::null_mut());
        }
        let mut n = self.consume(0, 0, max);
        let mut waited = Duration::ZERO;
        if n == 0 && !wait.is_zero() {
            let t = Instant::now();
            let ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
            n = self.consume(ms, 0, 1);
            waited = t.elapsed();
            if n == 1 && max > 1 {
                n += self.consume(0, 1, max - 1);
            }
        }
        for &m in &self.batch[..n] {
            // SAFETY: librdkafka returned `n` valid messages, each alive until destroyed
            // below; the slices do not outlive this iteration.
            each(unsafe { fetched(m) });
        }
        for &m in &self.batch[..n] {
            // SAFETY: each message is destroyed once, after its last use.
            unsafe { rd::rd_kafka_message_destroy(m) };
        }
        waited
    }

    /// Takes up to `size` messages into `batch[at..]`, waiting up to `timeout_ms` (0: not at
    /// all). Returns how many.
    fn consume(&mut self, timeout_ms: i32, at: usize, size: usize) -> usize {
        let slots = &mut self.batch[at..at + size];
        // SAFETY: `slots` has room for `size` pointers; the queue is this reader's.
        let got = unsafe {
            rd::rd_kafka_consume_batch_queue(
                self.queue.as_ptr(),
                timeout_ms,
                slots.as_mut_ptr(),
                size,
            )
        };
        usize::try_from(got).unwrap_or(0).min(size)
    }
}

/// The fields of message `m`.
///
/// # Safety
/// `m` points to a live message; the result borrows it and must not outlive it.
unsafe fn fetched<'m>(m: *mut rd::rd_kafka_message_t) -> Result<Fetched<'m>, String> {
    // SAFETY: the caller's.
    let msg = unsafe { &*m };
    if msg.err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        // SAFETY: librdkafka's text for the message's error, NUL-terminated.
        let text = unsafe { CStr::from_ptr(rd::rd_kafka_err2str(msg.err)) };
        return Err(format!(
            "partition {}: {}",
            msg.partition,
            text.to_string_lossy()
        ));
    }
    // SAFETY: librdkafka's pointer and length of the key and the value, null when absent.
    let bytes = |p: *mut std::ffi::c_void, len: usize| {
        (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
    };
    let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
    // SAFETY: a live message and a place for the timestamp's type.
    let ts = unsafe { rd::rd_kafka_message_timestamp(m, &mut kind) };
    Ok(Fetched {
        key: bytes(msg.key, msg.key_len),
        value: bytes(msg.payload, msg.len),
        timestamp_ms: (kind != rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE
            && ts >= 0)
            .then_some(ts),
        partition: msg.partition,
        offset: msg.offset,
    })
}

impl Drop for BatchReader<'_> {
    fn drop(&mut self) {
        // The partitions back to the consumer (a partition still forwarding to this queue
        // would keep it, and the messages in it, alive past the reader), then the queue.
        for (topic, partition) in std::mem::take(&mut self.routed) {
            self.forward(&topic, partition, std::ptr::null_mut());
        }
        // SAFETY: this reader's own reference to its queue, released once.
        unsafe { rd::rd_kafka_queue_destroy(self.queue.as_ptr()) };
    }
}
