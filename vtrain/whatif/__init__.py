"""`vtrain whatif`: re-time a measured run's own dependency graph under changed durations."""
