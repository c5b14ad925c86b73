"""Thin command-line shells over maskjax.studies, one per study."""
