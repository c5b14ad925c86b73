"""Studies: a config, the runs it implies, and their records; `maskjax.cli` holds their command lines.
They need the `studies` extra (`pip install "maskjax[studies]"`)."""

from maskjax.extras import require_studies

require_studies("maskjax.studies")
