"""Studies: a config, the runs it implies, and their records. The CLIs in experiments/ are thin shells."""
