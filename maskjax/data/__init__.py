"""Dataset loaders that work offline."""
