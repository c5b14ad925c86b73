"""Tasks: data, targets and their reference solutions."""
