"""The only Luigi-aware code: the tasks, the sweep, the report and the console output."""
