"""Fitting pairctl into an operator's day: schedules, monitoring output, machine checks."""
