"""Tasks, pure: what a task is, what may change in it, and what its checkpoints and metrics say."""
