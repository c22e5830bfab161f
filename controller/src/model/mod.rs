//! The pure model and planner (no I/O): metric windows in, parallelism decisions out.
