"""Scheduling: the job state machine, the pure placement policy and the loop that drives both."""
