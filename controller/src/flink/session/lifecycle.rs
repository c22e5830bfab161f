//! Adopting a job (with what an earlier session learned about it), saving what was learned,
//! and ending a job's part of the session.

use super::*;

impl JobSession {
    /// The session of `job`, with what an earlier session learned about it (a line says so; a
    /// state file that cannot be used is a warning line). `unix0` is the Unix time of the
    /// session clock's zero, seconds.
    pub(super) async fn new(
        rest: &FlinkRest,
        job: &JobDetails,
        opts: &FlinkOptions,
        unix0: f64,
        print: &mut dyn FnMut(&str),
    ) -> Result<JobSession, SessionError> {
        let topo = FlinkTopology::from_job(job, &opts.settings, &opts.bounds)?;
        let by_name = topo.by_name(&job.parallelism_by_id());
        let report = JobReport {
            first_job_id: job.jid.clone(),
            job_id: job.jid.clone(),
            name: job.name.clone(),
            vertices: topo.vertices.clone(),
            final_parallelism: by_name.clone(),
            rescales: Vec::new(),
            subtask_seconds: 0.0,
            lag_growing_seconds: 0.0,
            unreadable_seconds: 0.0,
            ended: None,
        };
        let topology = Arc::new(Mutex::new(topo));
        let timeout = Duration::from_secs_f64(opts.rescale_timeout_s);
        let runtime = FlinkRuntime::new(
            rest.clone(),
            Arc::clone(&topology),
            opts.resubmit.clone(),
            opts.savepoint_dir.clone(),
            FlinkTimeouts {
                savepoint: timeout,
                running: timeout,
            },
        );
        let handle = runtime.adopt(&job.jid, by_name).await;
        let settings = GuardSettings {
            window_seconds: opts
                .window_s
                .min(3.0 * opts.interval_s)
                .max(opts.interval_s),
            stabilization_seconds: opts.stabilization_s,
            scale_down_delay_seconds: opts.scale_down_delay_s,
            ..GuardSettings::default()
        };
        let store =
            FileStateStore::in_file(opts.state_dir(), &flink_state_file(&job.jid), &job.name);
        // The measured rescale downtime is the job's (its state size, the cluster's restart):
        // kept. The last observation is not: the next session may start long after, under
        // another load, and a factor learned across that gap would not be a rescale's.
        let mut session = AutoscaleSession::new(
            &job.name,
            settings,
            0.0,
            WindowRule::SpanAtLeast(opts.window_s),
            store,
            Keep {
                baseline: false,
                downtime: true,
            },
            unix0,
        );
        match session.load().await {
            Ok(Some(s)) => print(&format!(
                "{}: {} from {}",
                short(&job.jid),
                learned_summary(&s),
                session.store().location()
            )),
            Ok(None) => {}
            Err(e) => print(&format!("{}: warning: {e}", short(&job.jid))),
        }
        if opts.mode == Mode::Auto
            && let Some(why) = tick::cannot_apply(opts, job)
        {
            print(&format!(
                "{}: warning: {why}: its decisions are recommendations",
                short(&job.jid)
            ));
        }
        Ok(JobSession {
            topology,
            runtime,
            handle,
            session,
            backoff: RescaleBackoff::default(),
            collector: Collector::new(),
            last_hold: crate::progress::HoldSaid::default(),
            last_notes: Vec::new(),
            unreadable_since: None,
            not_running_since: None,
            report,
            timeline: Vec::new(),
            done: false,
        })
    }

    /// Writes the learned state when it changed since it was last written (a failure is
    /// logged: the session goes on).
    pub(super) async fn save_state(&mut self) {
        if let Err(e) = self.session.save_if_changed().await {
            tracing::warn!("{e}");
        }
    }

    pub(super) fn end(&mut self, why: String, print: &mut dyn FnMut(&str)) {
        print(&format!(
            "{}: {why}; no longer autoscaled",
            short(&self.report.job_id)
        ));
        self.report.ended = Some(why);
        self.done = true;
    }
}
