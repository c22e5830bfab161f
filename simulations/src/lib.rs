//! Trace replay against autoscaling policies.
