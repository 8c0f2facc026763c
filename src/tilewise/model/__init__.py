"""tilewise.model."""
